"""langchain-tests' standard retriever suite against FeedbackEnsembleRetriever (BM25 + the offline MiniLM)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_rlfb import FeedbackEnsembleRetriever


class TestFeedbackEnsembleRetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _ensemble(self, make_ensemble: Any) -> None:
        self._ens = make_ensemble()

    @property
    def retriever_constructor(self) -> type[FeedbackEnsembleRetriever]:
        return FeedbackEnsembleRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"ensemble": self._ens, "k": 2}

    @property
    def retriever_query_example(self) -> str:
        return "what causes the northern lights"
