"""The small corpus and the embedding shared by the LlamaIndex adapter tests (imported as ``_li_corpus``)."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

TEXTS = [
    "The aurora borealis is caused by charged particles from the solar wind hitting the upper atmosphere.",
    "Northern lights glow green when oxygen atoms are excited high above the poles.",
    "Ocean tides rise and fall because of the gravitational pull of the moon.",
    "Volcanoes erupt when molten magma rises through cracks in the crust.",
    "Part number XK-4471 is a titanium bolt rated for 400 bar.",
    "Photosynthesis converts sunlight, water and carbon dioxide into sugar in plant leaves.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "A glacier is a slow river of ice that carves valleys over thousands of years.",
    "Lava that cools quickly at the surface forms basalt and obsidian.",
    "Spring tides happen when the sun and the moon line up at new and full moon.",
]
IDS = [f"doc{i}" for i in range(len(TEXTS))]


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
