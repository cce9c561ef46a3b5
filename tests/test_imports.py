"""Each package's public names, as LangChain's partner packages test theirs: a name added or dropped is a
change of the public API, made here on purpose (the adapters' own: tests/langchain, tests/llamaindex)."""

from __future__ import annotations

import importlib

import pytest

EXPECTED_ALL = {
    "rlfb": [
        "Chunk", "CorruptStateError", "DuplicateEventError", "DuplicateIdError", "EmptyCorpusError",
        "FeedbackBeforeEventError", "FeedbackEnsemble", "FeedbackStore", "FutureTimestampError", "Hit",
        "IdempotencyConflictError", "InvalidWeightsError", "ModelNotFoundError", "NoStoreError",
        "NonFiniteValueError", "NotCopyableError", "RatingOutOfRangeError", "ReadOnlyFolderError",
        "ReadOnlyStoreError", "RetrievalResult", "RlfbError", "SaveNotFoundError", "SearchMember", "StoreBusyError",
        "StoreClosedError", "StoreFileGoneError", "StoreFullError", "UnknownChunkError", "UnknownEventError",
        "UnknownFeedbackError", "UnknownOptionError", "UnknownSignalError", "ValidationError", "__version__",
    ],
    "rlfb.policies": [
        "BatchParams", "BatchPolicy", "Context", "Decision", "Episode", "EpsilonGreedyPolicy", "FixedParams",
        "FixedPolicy", "GradientParams", "GradientPolicy", "POLICIES", "Policy", "ThompsonParams", "ThompsonPolicy",
        "check_policy_name", "make_policy",
    ],
    "rlfb.store": [
        "ENSEMBLE_STORE_METHODS", "FeedbackRecord", "FeedbackStore", "MIGRATIONS", "Migrations", "as_store",
        "query_hash",
    ],
    "rlfb.simulation": ["CLICK_MODELS", "ClickModel", "Interaction", "SimulatedFeedback", "SimulatedUser"],
    "rlfb.retrievers": [
        "BM25Retriever", "ChunkTable", "CorpusRetriever", "DenseRetriever", "EmbeddingCache", "RETRIEVERS",
        "Retriever", "SpladeRetriever", "check_retriever_names", "load_retriever", "make_retriever",
        "retriever_names", "top_k",
    ],
}


@pytest.mark.parametrize("package", sorted(EXPECTED_ALL))
def test_all_is_the_public_api(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(EXPECTED_ALL[package]) == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
