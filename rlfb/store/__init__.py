"""FeedbackStore: the feedback memory, on SQLite through sqlite-utils.

What it keeps (one table each):

``events``
    One row per retrieval: time, the query text (or only its sha256 with
    ``store_text=False``), session, parent run, query features and type, and
    the policy's decision (weights, arm, exploration flag, propensity).
``event_chunks``
    The chunks each event returned: rank, fused score, every retriever's raw
    and normalised score, which retrievers proposed it, and whether it was used.
``feedback``
    Every feedback signal: the event (and optionally the chunk) it rates, the
    signal type and value, its arrival time and delay, user / session, an
    optional idempotency key, the reward it produced, and ``in_window`` (0 for
    feedback that arrived after the attribution window: stored, flagged, not
    learned from).
``rewards``
    The computed reward of each in-window feedback, one row per chunk it was
    attributed to (a single row with no chunk when the event returned none).
``policy_snapshots``
    The policy state and weights, the newest ``snapshots_kept`` of each kind of
    ensemble (all with ``None``); the newest row is the current one.

One module per part: :mod:`~rlfb.store.feedback_store` (the class: its settings,
lifecycle and public methods, which call the modules below),
:mod:`~rlfb.store.connection` (opening the file, transactions and the lock),
:mod:`~rlfb.store.event_log` (retrievals logged and looked up),
:mod:`~rlfb.store.run_tree` (run links and failed runs),
:mod:`~rlfb.store.feedback_log` (feedback, its rewards and their attribution),
:mod:`~rlfb.store.snapshots` (policy snapshots), :mod:`~rlfb.store.pruning`
(retention), :mod:`~rlfb.store.migrations` (the schema),
:mod:`~rlfb.store.records` (what reads return), :mod:`~rlfb.store.reports`
(counts, statistics and export), :mod:`~rlfb.store.checks` (validation at the
boundary) and :mod:`~rlfb.store.codec` (lossless text and JSON).

Schema changes are named migration functions in :data:`MIGRATIONS`, recorded
in ``_migrations`` and applied under an exclusive write lock, so opening a file
again, or from several processes at once, is safe.

Concurrency and durability. Files run in WAL mode with a busy timeout (30 s by
default); every write transaction starts with ``BEGIN IMMEDIATE``, so writers
queue on the busy handler instead of failing with "database is locked" when a
read transaction would have to be upgraded. ``synchronous=NORMAL`` is the
default: in WAL mode a committed transaction is in the WAL file before
``COMMIT`` returns, so a killed process (SIGKILL, a crash) loses nothing that was
committed; only an OS crash or power loss can roll back the last few
transactions (never corrupting the file). Pass ``synchronous="FULL"`` to fsync
the WAL on every commit and survive power loss too, at several times the cost
per single write. A file deleted (``rm fb.db*``) or replaced while a store has
it open would take every later write into the unlinked file, lost when the
process exits: each write transaction checks (one ``os.stat``, just before its
``COMMIT``) that the path still names the file opened, and otherwise raises
:class:`~rlfb.errors.StoreFileGoneError` with nothing of it stored. Reads are not
checked: the open file still answers them with what it holds.

Strings are stored verbatim through parameterised SQL. A string that UTF-8
cannot encode (one with a lone surrogate such as ``"\\ud800"``) is stored as a
BLOB of its ``surrogatepass`` encoding and decoded back on read, so every
``str`` round-trips exactly and equality lookups still work. JSON columns do
the same with their JSON text, whose surrogates stay raw characters rather than
``\\uXXXX`` escapes (JSON would merge an escaped high+low pair into one
character). The JSONL export cannot avoid that: it is UTF-8 JSON, so lone
surrogates are escaped there, and a high+low pair of lone surrogates reads back
as the one character they encode in UTF-16.

Timestamps are unix seconds (floats); ``datetime`` objects and ISO-8601 strings
are accepted wherever a timestamp is.

>>> store = FeedbackStore()
>>> eid = store.log_event(
...     "what causes the aurora",
...     {"weights": {"bm25": 0.5, "dense": 0.5}, "arm": "balanced", "propensity": 0.8, "explored": False},
...     [{"chunk_id": "c1", "rank": 1, "score": 0.9}, {"chunk_id": "c2", "rank": 2, "score": 0.4}],
...     timestamp=1000.0,
... )
>>> rec = store.record_feedback(eid, "thumbs_up", timestamp=1000.0 + 1800)
>>> rec.reward, rec.chunk_rewards
(0.5, {'c1': 0.5, 'c2': 0.5})
>>> store.record_feedback(eid, "opened", chunk_id="c2", timestamp=1060.0).chunk_rewards
{'c2': 0.3933...}
>>> store.close()
"""

from rlfb.store.codec import query_hash
from rlfb.store.feedback_store import ENSEMBLE_STORE_METHODS, FeedbackStore, as_store
from rlfb.store.migrations import MIGRATIONS, Migrations
from rlfb.store.records import FeedbackRecord

__all__ = [
    "FeedbackStore", "as_store", "ENSEMBLE_STORE_METHODS", "FeedbackRecord", "Migrations", "MIGRATIONS", "query_hash",
]
