"""Named exceptions raised by rlfb.

Every error a caller can trigger with bad input derives from :class:`RlfbError`,
so an application can catch one type. Each subclass also derives from the
built-in exception it refines (``ValueError``, ``KeyError``), so existing
``except ValueError`` code keeps working.
"""

from __future__ import annotations

import sqlite3

__all__ = [
    "RlfbError",
    "ValidationError",
    "EmptyCorpusError",
    "DuplicateIdError",
    "UnknownChunkError",
    "UnknownEventError",
    "UnknownFeedbackError",
    "UnknownSignalError",
    "InvalidWeightsError",
    "CorruptStateError",
    "SaveNotFoundError",
    "ModelNotFoundError",
    "NonFiniteValueError",
    "RatingOutOfRangeError",
    "FutureTimestampError",
    "FeedbackBeforeEventError",
    "DuplicateEventError",
    "IdempotencyConflictError",
    "ReadOnlyStoreError",
    "ReadOnlyFolderError",
    "StoreBusyError",
    "StoreFullError",
    "StoreFileGoneError",
    "StoreClosedError",
    "NotCopyableError",
    "NoStoreError",
    "UnknownOptionError",
]


class RlfbError(Exception):
    """Base class of every rlfb error."""


class ValidationError(RlfbError, ValueError):
    """An argument is out of range, of the wrong type, or not finite."""


class EmptyCorpusError(ValidationError):
    """A retriever or ensemble was asked to index no chunks."""


class DuplicateIdError(ValidationError):
    """Two chunks share one id."""


class UnknownChunkError(RlfbError, KeyError):
    """A chunk id is not in the index, or not part of the event it is attached to."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown chunk"


class UnknownEventError(RlfbError, KeyError):
    """Feedback names a retrieval event (or run id) that was never logged."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown event"


class UnknownFeedbackError(RlfbError, KeyError):
    """A feedback row id names no stored row (never given, or pruned)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown feedback row"


class UnknownSignalError(ValidationError):
    """A feedback signal type is not one the reward function knows."""


class InvalidWeightsError(ValidationError):
    """Fusion weights are not finite, are negative, or do not match the retrievers."""


class CorruptStateError(RlfbError, ValueError):
    """A saved index, weights file or policy state cannot be read back."""


class SaveNotFoundError(CorruptStateError, FileNotFoundError):
    """No save where one was to be loaded: no such folder, or a folder without an ensemble's settings.

    A :class:`CorruptStateError` (a load that waits out another process's save swapping the folder in
    catches that) and a :class:`FileNotFoundError`, which a caller checking for a missing save catches.
    """


class ModelNotFoundError(RlfbError, FileNotFoundError):
    """A bundled model package is not installed."""


class NonFiniteValueError(ValidationError):
    """A number is NaN or infinite where a finite value is required."""


class RatingOutOfRangeError(ValidationError):
    """A rating lies outside the accepted scale (1 to 5 by default)."""


class FutureTimestampError(ValidationError):
    """A timestamp lies in the future by more than the clock-skew tolerance."""


class FeedbackBeforeEventError(ValidationError):
    """Feedback is timestamped before the retrieval it rates (beyond the clock-skew tolerance)."""


class DuplicateEventError(DuplicateIdError):
    """A retrieval event id was logged twice."""


class IdempotencyConflictError(ValidationError):
    """An idempotency key was reused for different feedback (another event, signal, chunk or value).

    ``key`` is the key as stored and ``recorded`` what it recorded first (``"already recorded ..."``), where the
    store raised it; ``None`` otherwise."""

    key: str | None = None
    recorded: str | None = None


class ReadOnlyStoreError(RlfbError, PermissionError):
    """A feedback store's file (or, in WAL mode, its folder) cannot be written: nothing was recorded."""


class ReadOnlyFolderError(RlfbError, PermissionError):
    """The folder a save goes into cannot be written (no permission, a read-only mount): nothing was saved,
    and an earlier save there is as it was."""


class StoreFullError(RlfbError, OSError):
    """The disk (or a size limit) refused a write to the feedback store: nothing was recorded, and the file is
    as it was (not damaged)."""


class StoreFileGoneError(RlfbError, OSError):
    """The feedback store's file was deleted (``rm fb.db*``) or replaced by another file while the store had it
    open: a write would go to the old, unlinked file and be lost when the process exits, so it is refused and
    nothing of it was stored. Close the store and open the path again (or restart the process)."""


class StoreClosedError(RlfbError, RuntimeError):
    """A call needed a :class:`~rlfb.store.FeedbackStore` that was closed (``store.close()``, or
    ``FeedbackEnsemble.close()``, which closes the ensemble's store): in an app, a thread still serving while
    another shuts the ensemble down."""

    def __init__(self, message: str = "FeedbackStore is closed (close() was called); open the file again, or "
                                      "load the ensemble again, to go on") -> None:
        super().__init__(message)


class StoreBusyError(RlfbError, sqlite3.OperationalError):
    """The feedback store's write lock stayed taken for its whole ``busy_timeout``.

    Another connection to the file holds it: another process, or, in this thread, another
    ``FeedbackStore`` on the same file inside its ``exclusive()`` block (one that would wait for
    ever on itself). Still an ``sqlite3.OperationalError``, as it was before it had a name.
    """


class UnknownOptionError(ValidationError, TypeError):
    """A keyword argument a call does not take (a misspelt option), named with the closest one it does take.
    Also the ``TypeError`` Python raises for an unexpected keyword argument, which it replaced."""


class NotCopyableError(RlfbError, TypeError):
    """A live learner (a :class:`~rlfb.FeedbackEnsemble`, bound to its store and models) was deep-copied or
    pickled. Pass the same object to share it; ``save`` and ``load`` carry it elsewhere. Still a
    ``TypeError``, as copying an object that cannot be copied raised before it had a name."""


class NoStoreError(ValidationError):
    """Feedback, or an adapter that logs retrievals for feedback, was asked of an ensemble built without a
    feedback store."""

    def __init__(self, message: str = "the ensemble has no feedback store; build it with store='fb.db'") -> None:
        super().__init__(message)
