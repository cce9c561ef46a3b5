"""rlfb: reinforcement learning from feedback for the retrieval layer of LLM apps.

The LLM stays frozen; what learns is which chunks are retrieved and how they
are ranked. Importing :mod:`rlfb` is cheap: models, torch and the store load
only when used.
"""

from __future__ import annotations

from rlfb.ensemble import FeedbackEnsemble
from rlfb.errors import (
    CorruptStateError,
    DuplicateIdError,
    EmptyCorpusError,
    InvalidWeightsError,
    RlfbError,
    UnknownChunkError,
    UnknownEventError,
    UnknownSignalError,
    ValidationError,
)
from rlfb.types import Chunk, Hit, RetrievalResult

__version__ = "0.1.0"

__all__ = [
    "FeedbackEnsemble",
    "Chunk",
    "Hit",
    "RetrievalResult",
    "RlfbError",
    "ValidationError",
    "EmptyCorpusError",
    "DuplicateIdError",
    "UnknownChunkError",
    "UnknownEventError",
    "UnknownSignalError",
    "InvalidWeightsError",
    "CorruptStateError",
    "__version__",
]
