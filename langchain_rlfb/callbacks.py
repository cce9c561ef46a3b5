"""``FeedbackCallbackHandler``: log what any LangChain retriever returned, and take feedback by run id.

Attach it to a run (``chain.invoke(q, config={"callbacks": [handler]})``).

* ``on_retriever_end`` logs the documents of every outermost retrieval under
  its LangChain ``run_id`` (:func:`rlfb.runs.log_external`), for any retriever:
  ``BM25Retriever``, a vector store retriever, an ``EnsembleRetriever``...
  Chunk ids come from :func:`~langchain_rlfb.retrievers.document_to_chunk`; a
  finite numeric ``metadata["score"]`` on a document is kept as its score (any
  other is logged as no score, with a warning: LangChain only prints a
  callback's errors, so raising would silently lose the retrieval).
  A retriever run nested anywhere below another open retriever run (an
  ensemble's members, also through a chain such as ``bm25.with_retry()``,
  ``rewrite | bm25`` or ``bm25 | trim``) is not logged: what the user saw is
  the outer result. A :class:`~langchain_rlfb.FeedbackEnsembleRetriever`
  nested so (inside a wrapper retriever that trims, compresses or re-ranks
  its documents) keeps its decision, linked below the outer run: the outer
  run id then stands for that decision and for the outer result, logged as
  ``"<run id>/result"`` (not at all when it is the decision as logged), so
  feedback on it teaches the ensemble. The decision's documents the outer
  result left out (a compressor cut them) are marked unused in it
  (:meth:`~rlfb.store.FeedbackStore.mark_unused`), so praise of the outer run
  is not shared with documents the user never saw.
* A :class:`~langchain_rlfb.FeedbackEnsembleRetriever` already logs its own
  retrieval under the same run id, with the decision its learner needs. The
  handler sees that event in the store and does not log it again (nor observe
  the session for it: the retriever did). With a handler on a different store
  than the retriever's ensemble, the handler logs its own copy; feedback on it
  is recorded in the handler's store and, when the handler was given that
  ``ensemble``, also on the ensemble's own event in the ensemble's store, so
  the ensemble learns.
* The start / end / error hooks of chains, tools, LLMs and chat models keep
  the open run tree in memory; when a retrieval ends, its ancestors' links are
  written to the store (:meth:`~rlfb.store.FeedbackStore.link_runs`), so
  feedback given on the top-level run id of a chain or an agent finds the
  retrieval inside it (also one made through a tool, as with
  ``create_retriever_tool``), in any process. It keeps the newest 100,000
  open runs: LangChain reports no end for some (an ``ainvoke`` cancelled early).
* ``on_retriever_error`` forgets the run: a failed retrieval logs nothing, and
  the error reaches the caller as usual. A run that failed because the store
  stayed locked (:class:`rlfb.errors.StoreBusyError`) is not marked failed in
  that store at once, which would wait ``busy_timeout`` a second time and end in
  LangChain's "Error in FeedbackCallbackHandler" line: the mark is kept in
  memory and written before the handler next logs a retrieval or takes feedback,
  or when the process exits, whichever comes first (so is the log of a retrieval
  the locked store could not take).
* A top-level run (a chain, a tool) whose run id the store already holds
  retrievals under (the caller gave ``config={"run_id": ...}`` again) is refused:
  with ``handler.raise_error = True`` its start raises
  :class:`rlfb.errors.DuplicateEventError` and nothing runs; otherwise (LangChain
  only prints a callback's errors) a warning says so, and the run's retrievals
  are passed by, as a failed run's are: feedback on that run id rates the
  earlier run's retrievals alone, and theirs is given by their own run ids.
* The session comes from the run's metadata (``config={"metadata":
  {"session_id": ...}}``, else LangSmith's ``thread_id`` or ``conversation_id``:
  a non-empty str, an int or a UUID; any other value is
  dropped with a warning and the retrieval logged without a session), else
  from a :class:`~langchain_rlfb.FeedbackEnsembleRetriever`'s own
  ``session_id``, as the retriever takes it; a
  follow-up that restates the session's previous query is recorded as a
  ``"reformulation"`` on it (:func:`rlfb.runs.observe_followup`).

Feedback follows LangSmith's ``create_feedback(run_id, key, score=..., comment=...)``:
``handler.record_feedback(run_id, score=1.0, key="user_score")``. Scores are
read on [0, 1] (``0`` thumbs down, ``1`` thumbs up) unless the handler was built
with ``score_scale="signed"`` ([-1, 1]); see :func:`rlfb.runs.score_value`.

The handler is assembled here from its parts, a module each, taking the handler as their first argument: the
open run tree it keeps in memory (``_runs``), a top-level run id given again (``_given_again``), what it does when
a retrieval starts and ends and what it logs of it (``_retrievals``), what it keeps while its store is locked and
writes later or at exit (``_kept``), and feedback whose learners keep their log in another store (``_feedback``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from langchain_rlfb._checks import check_ensemble, check_store, flag
from langchain_rlfb._feedback import learners_elsewhere, record_in_both_stores, warn_chunk_unlearned, warn_unlearned
from langchain_rlfb._given_again import given_again, refuse
from langchain_rlfb._kept import mark_failed, write_unmarked
from langchain_rlfb._retrievals import retrieval_ended, retrieval_started
from langchain_rlfb._runs import FALLBACKS, ended, forget, opened, parent_of, run_str, trim
from rlfb.errors import DuplicateEventError, NoStoreError, NotCopyableError, StoreBusyError, ValidationError
from rlfb.runs import SCORE_SCALES, key_or_score, record_run_feedback

if TYPE_CHECKING:
    from rlfb.store.records import FeedbackRecord

__all__ = ["FeedbackCallbackHandler"]


class FeedbackCallbackHandler(BaseCallbackHandler):
    """Logs every retrieval of a run by its run id and records feedback given on a run id later.

    Parameters
    ----------
    store
        A path to an SQLite file, a :class:`rlfb.store.FeedbackStore`, or
        ``None`` with ``ensemble``.
    ensemble
        A :class:`rlfb.FeedbackEnsemble`: feedback on its retrievals is learned
        from (:meth:`from_ensemble`).
    score_scale
        ``"unit"`` (LangSmith thumbs, [0, 1]) or ``"signed"`` ([-1, 1]).
    implicit
        The :class:`rlfb.implicit.ImplicitSignals` that detects reformulations
        (by default as the ensemble's ``observe`` builds it).
    observe_followups
        Record restated follow-ups in a session as reformulations.
    """

    def __init__(
        self,
        store: Any = None,
        *,
        ensemble: Any = None,
        score_scale: str = "unit",
        implicit: Any = None,
        observe_followups: bool = True,
    ) -> None:
        if ensemble is not None:
            ensemble = check_ensemble(ensemble)  # a retriever given as the ensemble, as from_ensemble takes it
        if ensemble is not None and ensemble.store is None:
            # with store= too it was taken, and feedback on its retrievals was stored and taught it nothing: its
            # retrievals are logged in no store. ("needs a store or an ensemble" would mislead without store=)
            raise NoStoreError()
        if store is None and ensemble is not None:
            store = ensemble.store
        if store is None:
            raise ValidationError("FeedbackCallbackHandler needs a store (a path or a FeedbackStore) "
                                  "or an ensemble")
        store = check_store(store)
        if score_scale not in SCORE_SCALES:
            raise ValidationError(f"score_scale must be one of {SCORE_SCALES}, got {score_scale!r}")
        self.store = store
        self.ensemble = ensemble
        self.score_scale = score_scale
        self.observe_followups = flag(observe_followups, "observe_followups")
        self._implicit = implicit
        self._lock = threading.Lock()
        # open runs (chains, tools, models, retrievers) -> parent, and open retriever runs -> query, session,
        # name; oldest first, so that past _runs.OPEN_RUNS the oldest (most likely never to end) are forgotten
        self._parents: OrderedDict[str, str | None] = OrderedDict()
        self._retrievals: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._fallbacks: set[str] = set()  # open runs of RunnableWithFallbacks
        # open top-level runs whose run id the store held retrievals under already (a run id given again), with
        # the runs directly under each that were marked failed, so feedback on the id passes them by
        self._refused: dict[str, set[str]] = {}
        # runs that failed while the store was locked, to mark failed in it (fail_run) at the next write
        self._unmarked: OrderedDict[str, int] = OrderedDict()
        # open top-level runs -> the identity of their start (_open): the same start reported twice is one run
        self._started_in: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # retrievals whose log the store was locked for, with their time: written at the next write
        self._unlogged: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._kept_order = itertools.count()  # numbers what the two tables above keep: written in that order
        # top-level run ids -> how many runs were refused as running at once under each (their ends: _runs.ended)
        self._doubled: dict[str, int] = {}
        self._warned_unlearned = False  # feedback stored that no live learner learned was warned of

    @classmethod
    def from_ensemble(cls, ensemble: Any, **kwargs: Any) -> FeedbackCallbackHandler:
        """A handler on the ensemble's store whose feedback the ensemble learns from.

        ``ensemble`` is an :class:`rlfb.FeedbackEnsemble` or a retriever wrapping one
        (:class:`langchain_rlfb.FeedbackEnsembleRetriever`: its ``.ensemble`` is taken).
        """
        ensemble = check_ensemble(ensemble)
        if ensemble.store is None:
            raise NoStoreError()
        return cls(ensemble.store, ensemble=ensemble, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> FeedbackCallbackHandler:
        # itself, as LangChain's tracers give (BaseTracer.__deepcopy__): a config deep-copied per request
        # (copy.deepcopy(base_config)) keeps the one handler, whose open runs and store are shared state
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        # its open runs, lock and store connection (and the ensemble it teaches) cannot be pickled: a bare
        # "cannot pickle '_thread.lock' object" before
        raise NotCopyableError(
            "a FeedbackCallbackHandler cannot be pickled: it holds its store's connection, the runs it has open "
            "and the learner it teaches; pass the same handler, or make another one on the same store"
        )

    def __copy__(self) -> FeedbackCallbackHandler:
        # a shallow copy shares everything (the store, the open runs, the lock), as it did before pickling was
        # refused: copy.copy goes through __reduce_ex__ otherwise
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    # ------------------------------------------------------------------ run tree
    # Every run type that can sit between a retrieval and the run feedback is given on
    # (chains, tools of agents, and models that call retrievers) is kept while open,
    # so the links written when a retrieval ends reach the top-level run.
    def _open(self, run_id: UUID, parent_run_id: UUID | None, *, fallbacks: bool = False,
              start: tuple[int, ...] | None = None) -> None:
        """Keep a starting run (its parent, through the open runs). ``start``: the identity of a top-level chain's
        or tool's start (its inputs and metadata objects, which LangChain hands each handler of one start and
        makes anew for each call), to tell the same start reported twice from another run under the same id;
        ``None`` for a model's run, which is not checked for an id given again."""
        rid = str(run_id)
        with self._lock:
            parent = parent_of(self, run_str(parent_run_id))
            running = None
            if parent is None and start is not None:
                # checked and kept at once: LangChain runs a sync handler of an async run in executor threads
                running = self._started_in.setdefault(rid, start)
                trim(self._started_in)
        if running is not None and running is not start:
            if running == start:
                return  # this very start reported again: the handler given to LangChain twice (with_config and invoke)
            # another run under the id of one still running (asyncio.gather, a request sent again while the first
            # runs, batch with one config for every item): their retrievals cannot be told apart by run id
            refuse(self, rid, running=True)
            with self._lock:  # its end is not the first run's: that one stays open (_runs.ended)
                self._doubled[rid] = self._doubled.get(rid, 0) + 1
            return
        # a top-level chain or tool: LangChain makes each run id anew, so one the store knows was given by the
        # caller again (config={"run_id": ...}), and feedback on it would rate both runs' questions
        again = running is not None and given_again(self, rid)
        if again:
            try:
                refuse(self, rid)  # raises where the handler's errors reach the caller (raise_error)
            except DuplicateEventError:
                with self._lock:
                    self._started_in.pop(rid, None)  # it never runs: a later run under the id is not "running"
                raise
        with self._lock:
            opened(self, rid, parent)
            if fallbacks:
                self._fallbacks.add(rid)
            if again:
                self._refused[rid] = set()

    def _close(self, run_id: UUID) -> None:
        with self._lock:
            if ended(self, str(run_id)):
                return
            forget(self, str(run_id))

    def _failed(self, run_id: UUID, error: BaseException | None = None) -> None:
        """A run that raised: what was retrieved under it produced no answer (a retry's first attempt, a
        branch a fallback replaced), so feedback on the runs above it must not rate those retrievals.

        Where it raised because a store stayed locked (a :class:`StoreBusyError`, the retrieval's own log
        most often), the mark is not written now: the handler's store is most likely the one locked, and
        writing would wait ``busy_timeout`` once more, then fail (LangChain printing it as the handler's error).
        It is kept in memory and written before the handler next logs a retrieval or takes feedback, or at exit.
        """
        rid = str(run_id)
        with self._lock:
            if ended(self, rid):
                return
            # with the open runs under it: a run cancelled in ainvoke fails its chain, but LangChain reports no
            # error for the retriever or tool that was awaiting (CancelledError is not an Exception), so their
            # entries would stay for ever; a branch still running under a failed run answers nobody either
            gone = {rid}
            under = {r for r, p in self._parents.items() if p in gone} - gone
            while under:
                gone |= under
                under = {r for r, p in self._parents.items() if p in under} - gone
            for r in gone:
                forget(self, r)
        mark_failed(self, rid, wait=not isinstance(error, StoreBusyError))

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        # a fallbacks run: its attempts are reported under another run (_runs.parent_of)
        kind = serialized.get("id") if isinstance(serialized, dict) else None
        fallbacks = kwargs.get("name") == FALLBACKS or (isinstance(kind, list) and kind[-1:] == [FALLBACKS])
        self._open(run_id, parent_run_id, fallbacks=fallbacks, start=(id(inputs), id(kwargs.get("metadata"))))

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._failed(run_id, error)

    def on_tool_start(
        self, serialized: Any, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._open(run_id, parent_run_id, start=(id(input_str), id(kwargs.get("metadata"))))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._failed(run_id, error)

    def on_llm_start(
        self, serialized: Any, prompts: list[str], *, run_id: UUID, parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._open(run_id, parent_run_id)  # a model's run holds no retrievals of its own: not checked

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        # Defined so LangChain does not fall back to on_llm_start with the messages rendered as text.
        self._open(run_id, parent_run_id)  # a model's run holds no retrievals of its own: not checked

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id)

    # ------------------------------------------------------------------ retrievals
    def on_retriever_start(
        self,
        serialized: Any,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        retrieval_started(self, query, run_id, parent_run_id, metadata, kwargs.get("name"))

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        # a retriever that raised after its members answered (an outer trimmer or reranker around an rlfb
        # retriever, retried or replaced by a fallback): the rankings under it produced no answer either
        self._failed(run_id, error)

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        retrieval_ended(self, documents, run_id, parent_run_id)

    # ------------------------------------------------------------------ feedback
    def record_feedback(
        self,
        run_id: Any,
        *args: Any,
        score: float | bool | None = None,
        rating: float | None = None,
        signal: str | None = None,
        value: float | None = None,
        chunk_id: str | None = None,
        comment: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> list[FeedbackRecord]:
        """Feedback on a run: a retrieval's run id, or a chain's (every retrieval below it is rated).

        LangSmith's shape: ``record_feedback(run_id, score=1.0, key="user_score", comment=...)``, also with
        the key second, as ``create_feedback(run_id, "user_score", score=1.0)`` takes it; a number second is
        the score (``record_feedback(run_id, 1.0)``), and a signal's name second is the signal where nothing else
        rates the run (``record_feedback(run_id, "thumbs_down")``).
        Or a ``rating`` (1-5), a ``signal`` (``"thumbs_up"``, ``"explicit_negative"``,
        ``"click"``, ...) or a raw ``value`` in [-1, 1]. ``chunk_id`` rates one
        retrieved chunk. ``kwargs``: ``timestamp``, ``session_id``, ``user_id``,
        ``idempotency_key``. Returns one :class:`~rlfb.store.FeedbackRecord` per
        retrieval rated; an ensemble learns from those it made.

        When the ensemble that made a rated retrieval keeps its log in another
        store (the handler's ``ensemble``, or any live one of this process: two
        rlfb retrievers on two files in one chain), the feedback goes to its
        event there too, so that ensemble learns; the returned records then
        include those second records. A refusal by
        the ensemble's store (an idempotency conflict, a locked file) undoes
        the handler's rows; where the run holds two of the ensemble's
        retrievals, the first one's row and learning stay. The handler's file
        is locked first.

        Raises :class:`rlfb.errors.UnknownEventError` when nothing was logged
        under ``run_id`` or below it, and :class:`rlfb.errors.UnknownSignalError` for a name second that no
        signal has, with nothing else rating the run (a LangSmith key needs its ``score``).
        """
        key, score, signal = key_or_score(args, key, score, "record_feedback", signal=signal,  # LangSmith puts
                                          rated=rating is not None or value is not None,  # the key second
                                          reward=getattr(self.store, "reward", None))
        fb: dict[str, Any] = dict(score=score, score_scale=self.score_scale, value=value, rating=rating,
                                  chunk_id=chunk_id, comment=comment, key=key, **kwargs)
        write_unmarked(self)  # so feedback passes by the runs that failed while the store was locked
        ens = self.ensemble
        elsewhere = learners_elsewhere(self, run_id)
        if not elsewhere:
            records = record_run_feedback(self.store, run_id, signal, ensemble=ens, **fb)
            warn_unlearned(self, run_id, records, elsewhere)
            warn_chunk_unlearned(self, run_id, chunk_id, records, elsewhere)
            return records
        records = record_in_both_stores(self, run_id, signal, fb, elsewhere)
        warn_unlearned(self, run_id, records, elsewhere)
        warn_chunk_unlearned(self, run_id, chunk_id, records, elsewhere)
        return records

    def retrievals(self, run_id: Any) -> list[dict[str, Any]]:
        """The logged retrievals a run id stands for (store event dicts, with their ranked ``chunks``)."""
        with contextlib.suppress(StoreBusyError):  # a read: the kept marks wait for a write that can wait
            write_unmarked(self)
        return [self.store.event(e) for e in self.store.resolve_run(str(run_id))]
