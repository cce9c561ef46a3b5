"""The public surface of llamaindex_rlfb, and LlamaIndex's MRO checks for integrations."""

from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.postprocessor.types import BaseNodePostprocessor

import llamaindex_rlfb
from llamaindex_rlfb import FeedbackEnsembleRetriever, FeedbackEventHandler, FeedbackFusionPostprocessor

EXPECTED_ALL = [
    "FeedbackFusionPostprocessor",
    "FeedbackEnsembleRetriever",
    "FeedbackEventHandler",
    "FeedbackRetrievalEvent",
    "instrument",
    "current_query_id",
    "EVENT_ID_KEY",
    "METADATA_KEYS",
    "hit_to_node",
    "node_to_chunk",
]


def test_all() -> None:
    assert sorted(EXPECTED_ALL) == sorted(llamaindex_rlfb.__all__)
    for name in llamaindex_rlfb.__all__:
        assert hasattr(llamaindex_rlfb, name)


def test_retriever_class() -> None:
    names_of_base_classes = [b.__name__ for b in FeedbackEnsembleRetriever.__mro__]
    assert BaseRetriever.__name__ in names_of_base_classes


def test_postprocessor_class() -> None:
    names_of_base_classes = [b.__name__ for b in FeedbackFusionPostprocessor.__mro__]
    assert BaseNodePostprocessor.__name__ in names_of_base_classes
    assert FeedbackFusionPostprocessor.class_name() == "FeedbackFusionPostprocessor"


def test_event_handler_class() -> None:
    names_of_base_classes = [b.__name__ for b in FeedbackEventHandler.__mro__]
    assert BaseEventHandler.__name__ in names_of_base_classes
    assert FeedbackEventHandler.class_name() == "FeedbackEventHandler"


def test_the_core_never_imports_llama_index() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rlfb, rlfb.store, rlfb.runs; "
        "print(any(m.startswith('llama_index') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
