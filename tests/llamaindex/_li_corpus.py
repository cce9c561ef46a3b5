"""The small corpus and the embedding shared by the LlamaIndex adapter tests (imported as ``_li_corpus``)."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

from _corpus import IDS, TEXTS  # noqa: F401 - the corpus the ensemble and LangChain tests use too


class MiniLMEmbedding(BaseEmbedding):
    """A LlamaIndex embedding over rlfb's dense retriever: the offline all-MiniLM-L6-v2, loaded once."""

    _dense: Any = PrivateAttr()

    def __init__(self, dense: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2")
        self._dense = dense

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._dense.encode_queries([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._dense.encode_documents([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._dense.encode_documents(texts).tolist()
