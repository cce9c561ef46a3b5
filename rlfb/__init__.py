"""rlfb: reinforcement learning from feedback for the retrieval layer of LLM apps.

The LLM stays frozen; what learns is which chunks are retrieved and how they
are ranked. Importing :mod:`rlfb` is cheap: models, torch and the store load
only when used.
"""

from __future__ import annotations

from typing import Any

from rlfb.ensemble import FeedbackEnsemble
from rlfb.errors import (
    CorruptStateError,
    DuplicateEventError,
    DuplicateIdError,
    EmptyCorpusError,
    FeedbackBeforeEventError,
    FutureTimestampError,
    IdempotencyConflictError,
    InvalidWeightsError,
    ModelNotFoundError,
    NonFiniteValueError,
    NoStoreError,
    NotCopyableError,
    RatingOutOfRangeError,
    ReadOnlyFolderError,
    ReadOnlyStoreError,
    RlfbError,
    SaveNotFoundError,
    StoreBusyError,
    StoreClosedError,
    StoreFileGoneError,
    StoreFullError,
    UnknownChunkError,
    UnknownEventError,
    UnknownFeedbackError,
    UnknownOptionError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.members import SearchMember
from rlfb.types import Chunk, Hit, RetrievalResult

__version__ = "0.1.0"

__all__ = [
    "FeedbackEnsemble",
    "FeedbackStore",
    "SearchMember",
    "Chunk",
    "Hit",
    "RetrievalResult",
    "RlfbError",
    "ValidationError",
    "EmptyCorpusError",
    "DuplicateIdError",
    "DuplicateEventError",
    "UnknownChunkError",
    "UnknownEventError",
    "UnknownFeedbackError",
    "UnknownSignalError",
    "InvalidWeightsError",
    "NonFiniteValueError",
    "RatingOutOfRangeError",
    "FutureTimestampError",
    "FeedbackBeforeEventError",
    "IdempotencyConflictError",
    "CorruptStateError",
    "SaveNotFoundError",
    "ReadOnlyStoreError",
    "ReadOnlyFolderError",
    "StoreBusyError",
    "StoreClosedError",
    "StoreFileGoneError",
    "StoreFullError",
    "NotCopyableError",
    "NoStoreError",
    "ModelNotFoundError",
    "UnknownOptionError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # the store (sqlite-utils) loads on first use, so that `import rlfb` stays cheap
    if name == "FeedbackStore":
        from rlfb.store import FeedbackStore

        return FeedbackStore
    raise AttributeError(f"module 'rlfb' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily loaded FeedbackStore too: without this, "FeedbackStore" in dir(rlfb) was False (and editors'
    # completion left it out)
    return sorted({*globals(), *__all__})
