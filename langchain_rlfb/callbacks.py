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
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.runnables.config import var_child_runnable_config

from langchain_rlfb._checks import (
    check_store,
    flag,
    session_key,
    session_text,
    usable_score,
    with_configured_session,
)
from langchain_rlfb.retrievers import SESSION_KEY, document_to_chunk
from rlfb._at_exit import run_at_exit
from rlfb._caller import caller_stacklevel
from rlfb.errors import (
    DuplicateEventError,
    NoStoreError,
    NotCopyableError,
    RlfbError,
    StoreBusyError,
    ValidationError,
)
from rlfb.runs import (
    EXTERNAL_POLICY,
    SCORE_SCALES,
    default_implicit,
    key_or_score,
    learned_here,
    learns_after_commit,
    log_external,
    maker_of,
    observe_followup,
    record_run_feedback,
    same_store,
)

__all__ = ["FeedbackCallbackHandler"]

#: Open runs a handler keeps at most; past it the oldest are forgotten. LangChain reports no end nor error for
#: some runs (a chain whose ainvoke is cancelled before it starts: its start hook runs in a worker thread after
#: the cancellation), so without a bound their entries would pile up for the life of the handler.
_OPEN_RUNS = 100_000

#: The run name of ``Runnable.with_fallbacks``'s runnable, whose attempts LangChain reports under another run.
_FALLBACKS = "RunnableWithFallbacks"

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
            ensemble = _check_ensemble(ensemble)  # a retriever given as the ensemble, as from_ensemble takes it
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
        # name; oldest first, so that past _OPEN_RUNS the oldest (most likely never to end) are forgotten
        self._parents: OrderedDict[str, str | None] = OrderedDict()
        self._retrievals: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._fallbacks: set[str] = set()  # open runs of RunnableWithFallbacks
        # open top-level runs whose run id the store held retrievals under already (a run id given again), with
        # the runs directly under each that were marked failed, so feedback on the id passes them by
        self._refused: dict[str, set[str]] = {}
        # runs that failed while the store was locked, to mark failed in it (fail_run) at the next write
        self._unmarked: OrderedDict[str, None] = OrderedDict()
        # open top-level runs -> the identity of their start (_open): the same start reported twice is one run
        self._started_in: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # retrievals whose log the store was locked for, with their time: written at the next write
        self._unlogged: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # top-level run ids -> how many runs were refused as running at once under each (their ends: _ended)
        self._doubled: dict[str, int] = {}
        self._warned_unlearned = False  # feedback stored that no live learner learned was warned of

    @classmethod
    def from_ensemble(cls, ensemble: Any, **kwargs: Any) -> FeedbackCallbackHandler:
        """A handler on the ensemble's store whose feedback the ensemble learns from.

        ``ensemble`` is an :class:`rlfb.FeedbackEnsemble` or a retriever wrapping one
        (:class:`langchain_rlfb.FeedbackEnsembleRetriever`: its ``.ensemble`` is taken).
        """
        ensemble = _check_ensemble(ensemble)
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
            parent = self._parent_of(_str(parent_run_id))
            running = None
            if parent is None and start is not None:
                # checked and kept at once: LangChain runs a sync handler of an async run in executor threads
                running = self._started_in.setdefault(rid, start)
                _trim(self._started_in)
        if running is not None and running is not start:
            if running == start:
                return  # this very start reported again: the handler given to LangChain twice (with_config and invoke)
            # another run under the id of one still running (asyncio.gather, a request sent again while the first
            # runs, batch with one config for every item): their retrievals cannot be told apart by run id
            self._refuse(rid, running=True)
            with self._lock:  # its end is not the first run's: that one stays open (_ended)
                self._doubled[rid] = self._doubled.get(rid, 0) + 1
            return
        # a top-level chain or tool: LangChain makes each run id anew, so one the store knows was given by the
        # caller again (config={"run_id": ...}), and feedback on it would rate both runs' questions
        again = running is not None and self._given_again(rid)
        if again:
            try:
                self._refuse(rid)  # raises where the handler's errors reach the caller (raise_error)
            except DuplicateEventError:
                with self._lock:
                    self._started_in.pop(rid, None)  # it never runs: a later run under the id is not "running"
                raise
        with self._lock:
            self._opened(rid, parent)
            if fallbacks:
                self._fallbacks.add(rid)
            if again:
                self._refused[rid] = set()

    def _given_again(self, rid: str) -> bool:
        """Whether the store holds retrievals under the top-level run id ``rid`` already. Not where that run
        failed: a retry under the same id (its first attempt's runs, which answered nobody, are marked failed
        here, so that feedback on ``rid`` rates the retry). Nor where the store is locked or closed: this check
        is not worth a wait, nor an error LangChain prints as the handler's at every chain start."""
        with contextlib.suppress(StoreBusyError):
            self._write_unmarked()  # an attempt that failed on a locked store: its mark first
        with self._lock:
            if rid in self._unmarked:
                return False  # still locked: a retry of a run whose failed mark waits, not checked
        try:
            if not self.store.resolve_run(rid):
                return False
            if self.store.run_failed(rid):
                self.store.fail_children(rid)
                return False
        except RlfbError:  # a busy or closed store: the retrieval's own log says so, where there is one
            return False
        return True

    def _refuse(self, rid: str, *, running: bool = False) -> None:
        """A top-level run started under a run id that retrievals were logged under already.

        Refused as a retrieval's own run id given again is (:class:`DuplicateEventError`): raised where LangChain
        passes the handler's errors on (``handler.raise_error = True``), and the run does not start. Otherwise
        LangChain would only print the error and run it all the same, so a warning says so, and the retrievals
        made under it are passed by when feedback is given on ``rid`` (:meth:`_refused_below`).
        """
        said = (f"run id {rid!r} was given to an earlier run" + (", still running," if running else "")
                + " whose retrievals are logged under it: a run id names one run (give each invoke its own, or none)")
        if self.raise_error:
            raise DuplicateEventError(said)
        # runs at once under one id cannot be told apart: feedback on it rates both; a later one is passed by
        rates = ("both runs' retrievals: rate each retrieval by its own run id" if running else
                 "the earlier run's retrievals only: rate this run's by their own run ids")
        warnings.warn(
            f"{said}; this run goes on, but feedback on {rid!r} rates {rates} (handler.raise_error = True refuses "
            "such a run with a DuplicateEventError)",
            UserWarning,
            stacklevel=caller_stacklevel(("langchain_core", "langchain", "langchain_classic", "langgraph")),
        )

    def _refused_below(self, path: Sequence[tuple[str, str]]) -> None:
        """Mark failed the run directly under a refused run on ``path`` (``(run, parent)`` pairs up to the root),
        once: feedback on the refused run id then passes this run's retrievals by (:meth:`FeedbackStore.resolve_run
        <rlfb.store.FeedbackStore.resolve_run>` skips failed runs), as it passes a failed run's by."""
        with self._lock:
            below = [(run, top) for run, top in path if top in self._refused and run not in self._refused[top]]
            for run, top in below:
                self._refused[top].add(run)
        for run, _ in below:
            self._mark_failed(run)

    def _mark_failed(self, rid: str, *, wait: bool = True) -> None:
        """``store.fail_run(rid)``, kept in memory for the next write where the store is locked (``wait=False``:
        known to be locked, so it is not tried now)."""
        if wait:
            try:
                self.store.fail_run(rid)
                return
            except StoreBusyError:
                pass
        with self._lock:
            self._unmarked[rid] = None
            _trim(self._unmarked)
        _keep_until_written(self)

    def _write_unmarked(self) -> None:
        """Write the failed marks and the retrievals' logs kept while the store was locked (:meth:`_failed`,
        :meth:`on_retriever_end`); a busy store raises as the write that follows would, and keeps the rest."""
        self._write_kept(self._unlogged, self._log_kept)
        self._write_kept(self._unmarked, lambda rid, _: self.store.fail_run(rid))
        with self._lock:
            if not self._unlogged and not self._unmarked:
                _KEEPING.pop(id(self), None)

    def _log_kept(self, event_id: str, logged: dict[str, Any]) -> None:
        with contextlib.suppress(DuplicateEventError):  # written by another handler on the file meanwhile
            log_external(self.store, **logged)

    def _write_kept(self, kept: OrderedDict[str, Any], write: Callable[[str, Any], None]) -> None:
        """``write`` each entry of ``kept``, oldest first, taking it out once written (another thread may write
        the same entries: each is taken out once, and a second write of it is harmless)."""
        while kept:
            with self._lock:
                if not kept:
                    return
                key, value = next(iter(kept.items()))
            write(key, value)
            with self._lock:
                kept.pop(key, None)

    def _parent_of(self, reported: str | None) -> str | None:
        """The run a starting run is under (call under ``self._lock``): ``reported``, or an open run below it.

        LangChain (1.8) runs each attempt of a ``RunnableWithFallbacks`` with the config the fallbacks run was
        given, not its child's, so the attempt is reported under the run above the fallbacks (or under none,
        a top-level run), and feedback on the fallbacks run's id reached no retrieval. The child's config is in
        the context then (``var_child_runnable_config``): its callbacks name the fallbacks run as the parent.
        That run is taken only when it is an open fallbacks run (named ``RunnableWithFallbacks``: one given
        another ``run_name`` is not known as one) below ``reported``, or ``reported`` is ``None``: so a run is
        only ever placed deeper on its own branch, and a retrieval code starts as a trace of its own (with a
        callbacks list of its own) stays one.
        """
        config = var_child_runnable_config.get()
        in_context = _str(getattr(config.get("callbacks"), "parent_run_id", None)) if config else None
        if in_context is None or in_context == reported or in_context not in self._fallbacks \
                or in_context not in self._parents:
            return reported
        if reported is None or any(p == reported for _, p in self._ancestor_links(in_context)):
            return in_context
        return reported

    def _opened(self, rid: str, parent: str | None, retrieval: dict[str, Any] | None = None) -> None:
        """Keep ``rid`` open (under ``self._lock``), dropping the oldest open runs past :data:`_OPEN_RUNS`.

        A run forgotten so that later ends without being logged (a retrieval) or linked above it: one open
        while 100,000 newer runs started is almost surely one whose end LangChain never reports.
        """
        self._parents[rid] = parent
        while len(self._parents) > _OPEN_RUNS:
            gone = self._parents.popitem(last=False)[0]
            self._fallbacks.discard(gone)
            self._refused.pop(gone, None)
        if retrieval is not None:
            self._retrievals[rid] = retrieval
            _trim(self._retrievals)

    def _ended(self, rid: str) -> bool:
        """Whether the end (or failure) of a top-level run under ``rid`` is another run's, refused as running at
        once under the same id (call under ``self._lock``): then the run still open under it stays so, and a
        failure is not marked on the id, which the other run holds."""
        extra = self._doubled.get(rid, 0)
        if extra:
            if extra == 1:
                del self._doubled[rid]
            else:
                self._doubled[rid] = extra - 1
            return True
        return False

    def _close(self, run_id: UUID) -> None:
        with self._lock:
            if self._ended(str(run_id)):
                return
            self._forget(str(run_id))

    def _forget(self, rid: str) -> None:
        """Drop run ``rid`` from every table of open runs (call under ``self._lock``)."""
        self._parents.pop(rid, None)
        self._retrievals.pop(rid, None)
        self._fallbacks.discard(rid)
        self._refused.pop(rid, None)
        self._started_in.pop(rid, None)

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
            if self._ended(rid):
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
                self._forget(r)
        self._mark_failed(rid, wait=not isinstance(error, StoreBusyError))

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        # a fallbacks run: its attempts are reported under another run (_parent_of)
        kind = serialized.get("id") if isinstance(serialized, dict) else None
        fallbacks = kwargs.get("name") == _FALLBACKS or (isinstance(kind, list) and kind[-1:] == [_FALLBACKS])
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
        # the run's metadata, with the session its chain's configurable names (RunnableWithMessageHistory's)
        metadata = with_configured_session(metadata)
        # the run's session (session_id, else LangSmith's thread_id or conversation_id), else the one a
        # FeedbackEnsembleRetriever falls back to (its session_id), as it does
        key = session_key(metadata)
        session = metadata[key] if key is not None else metadata.get(SESSION_KEY)
        with self._lock:
            parent = self._parent_of(_str(parent_run_id))
            adopted = parent != _str(parent_run_id)
            self._opened(str(run_id), parent, {
                "query": query,
                "session_id": session_text(session),
                "raw_session_id": session,  # to name in the warning when it is dropped
                "name": kwargs.get("name") or metadata.get("ls_retriever_name") or "retriever",
            })
            links = self._ancestor_links(parent)
            nested = parent in self._retrievals or any(p in self._retrievals for _, p in links)
        if self._refused and parent is not None:
            self._refused_below([(str(run_id), parent), *links])  # under a run id given again
        if adopted and parent is not None:
            # under a run LangChain did not report as its parent (a fallback's attempt): the retrieval's own event
            # names the reported parent, so it is linked to the run it is under
            links = [(str(run_id), parent), *links]
        if links and not nested:
            # Linked before the retrieval runs, so that a FeedbackEnsembleRetriever's own follow-up check
            # (which knows only its parent run) sees the runs above it: an agent's second call of its
            # retriever tool is then known as the same run as its first.
            try:
                self.store.link_runs(links)
            except StoreBusyError:
                # the store stayed locked: the retrieval's own log waits for it too (and raises, for an rlfb
                # retriever on this store), so the links are written when the retrieval ends, not printed by
                # LangChain as this handler's error
                with self._lock:
                    if str(run_id) in self._retrievals:
                        self._retrievals[str(run_id)]["unlinked"] = links

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        # a retriever that raised after its members answered (an outer trimmer or reranker around an rlfb
        # retriever, retried or replaced by a fallback): the rankings under it produced no answer either
        self._failed(run_id, error)

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        rid = str(run_id)
        with self._lock:
            info = self._retrievals.pop(rid, None)
            parent = self._parents.pop(rid, _str(parent_run_id))
            links = self._ancestor_links(parent)
            # the outermost open retriever run above this one, also through a chain (with_retry, rewrite | retriever)
            outer = next((r for r in reversed([parent, *(p for _, p in links)]) if r in self._retrievals), None)
        if info is None:
            return
        with contextlib.suppress(StoreBusyError):  # kept for a later write: this retrieval's own log comes first
            self._write_unmarked()  # runs that failed, and retrievals not logged, while the store was locked
        if info.get("unlinked"):
            self.store.link_runs(info["unlinked"])  # links the store was locked for at the start
        decided = self.store.has_event(rid)  # a FeedbackEnsembleRetriever logged it, and observed the session
        if outer is not None:
            # A member of an outer retriever: the outer result is what the user saw, so a plain member is not
            # logged. An rlfb retriever's own decision is what its learner learns from: keep it reachable from
            # the outer run (links through the runs between them), which then stands above it (see below).
            if not decided and not self._in_ensemble_store(rid):
                return
            self.store.link_runs(links)
            with self._lock:
                if outer in self._retrievals:
                    self._retrievals[outer]["decided_below"] = True
            if decided:
                return
            # made on the ensemble's own store: a copy here, as for an outermost one, which feedback resolves to
        elif decided:
            return
        event_id = rid
        if outer is None and info.get("decided_below"):
            below = self.store.resolve_run(rid)  # the decisions still under it (a failed branch's are passed by)
            if below:
                # rlfb retrievers decided inside this one (a wrapper that trims, compresses or re-ranks their
                # documents). Logged under the run id, this result would be an event, and resolve_run never looks
                # below an event: feedback on the run id would rate this copy alone and no learner would learn.
                # So the run id stays a run above their decisions and this result, logged as "<run id>/result",
                # as the LlamaIndex handler does with a bare retrieval that had rlfb learners inside.
                if parent is not None:
                    self.store.link_runs([(rid, parent)])
                self._mark_cut(documents, below)
                if self._is_decision(documents, below):
                    return  # the wrapper returned one decision as it was logged: no copy to add
                event_id, parent = f"{rid}/result", rid
        session = info["session_id"]
        if session is not None and self.observe_followups:
            # given, else the ensemble's as they are now (ens.implicit), else word overlap
            implicit = self._implicit if self._implicit is not None else default_implicit(self.ensemble)
            # a retrieval under the same run (parent or any run above it) is a restatement on purpose; so is one
            # under this very retrieval (an rlfb retriever inside a wrapper retriever logged it moments ago)
            ancestors = {p for _, p in links} | ({parent} if parent is not None else set()) | {rid}
            observe_followup(self.store, session, info["query"], ensemble=self.ensemble,
                             implicit=implicit, run_ancestors=ancestors)
        results, dropped = _results(documents)
        if session is None and info["raw_session_id"] is not None:
            dropped.insert(0, f"its session_id {info['raw_session_id']!r} (not a non-empty str, int or UUID)")
        if dropped:
            # LangChain only prints a callback's exception, so failing here would lose the retrieval and every
            # later feedback on it; log what is usable and say once what was left out.
            warnings.warn(f"rlfb logged retrieval {rid} without " + "; ".join(dropped), stacklevel=2)
        logged = dict(query=info["query"], results=results, source=info["name"], event_id=event_id, parent_id=parent,
                      session_id=session, metadata={"framework": "langchain", "run_name": info["name"]},
                      timestamp=time.time())
        try:
            log_external(self.store, **logged)
        except StoreBusyError:
            # the store stayed locked past busy_timeout: LangChain would print this as the handler's error, and the
            # retrieval was lost (feedback on its run found nothing). Kept, and logged at the handler's next write
            with self._lock:
                self._unlogged[event_id] = logged
                _trim(self._unlogged)
            _keep_until_written(self)
            warnings.warn(f"rlfb could not log retrieval {rid} now (its feedback store stayed locked): it is kept, "
                          "and logged before this handler next logs a retrieval or takes feedback", RuntimeWarning,
                          stacklevel=2)

    def _in_ensemble_store(self, rid: str) -> bool:
        """Whether the handler's ensemble, keeping its log in another store, logged a retrieval under ``rid``."""
        ens = self.ensemble
        return (ens is not None and ens.store is not None and not same_store(ens.store, self.store)
                and ens.store.has_event(rid))

    def _mark_cut(self, documents: Sequence[Document], event_ids: Sequence[str]) -> None:
        """The chunks of the rlfb decisions ``event_ids`` that the outer result ``documents`` left out (a
        ``ContextualCompressionRetriever``'s compressor, a trimmer, a re-ranker's cutoff) are marked unused in
        each decision's event, in this store and in the learner's where that is another file, as the LlamaIndex
        handler marks the nodes a later step cut: praise of the outer run is not shared with documents the user
        never saw, nor reads them as passed over. All of a decision's chunks where the result is empty. A
        document counts as kept by its chunk id (``Document.id``, or the ``metadata["chunk_id"]`` rlfb's
        Documents carry, which a compressor that makes new Documents keeps with their metadata). A result none
        of whose documents is any decision's (a wrapper that wrote new Documents without their ids: summaries,
        parent documents) tells nothing of what was kept, and marks nothing."""
        kept: set[str] = set()
        for doc in documents:
            kept.add(document_to_chunk(doc).id)
            cid = (doc.metadata or {}).get("chunk_id")
            if isinstance(cid, str):
                kept.add(cid)
        rankings = {eid: [c["chunk_id"] for c in self.store.event(eid)["chunks"]] for eid in event_ids}
        if documents and not any(c in kept for ranked in rankings.values() for c in ranked):
            return
        for eid, ranked in rankings.items():
            cut = [c for c in ranked if c not in kept]
            if not cut:
                continue
            for store in self._stores_of(eid):
                store.mark_unused(eid, cut)

    def _stores_of(self, eid: str) -> list[Any]:
        """The stores that hold decision ``eid``: the handler's, and its learner's where that is another file
        (the live ensemble of this process that made it, else the handler's ``ensemble``)."""
        stores = [self.store]
        for learner in (maker_of(eid), self.ensemble):
            theirs = getattr(learner, "store", None)
            if theirs is not None and not any(same_store(theirs, s) for s in stores) and theirs.has_event(eid):
                stores.append(theirs)
        return stores

    def _is_decision(self, documents: Sequence[Document], event_ids: Sequence[str]) -> bool:
        """Whether ``documents`` are one of ``event_ids`` as logged: its Documents, in its order."""
        eid = (documents[0].metadata or {}).get("event_id") if documents else None
        if not isinstance(eid, str) or eid not in event_ids:
            return False
        if any((d.metadata or {}).get("event_id") != eid for d in documents):
            return False
        logged = [c["chunk_id"] for c in self.store.event(eid)["chunks"]]
        return logged == [cid for cid, _ in _results(documents)[0]]

    def _ancestor_links(self, run_id: str | None) -> list[tuple[str, str]]:
        """``(run, parent)`` pairs from ``run_id`` up to the root, as far as this handler saw the tree."""
        links: list[tuple[str, str]] = []
        seen: set[str] = set()
        while run_id is not None and run_id not in seen:
            seen.add(run_id)
            parent = self._parents.get(run_id)
            if parent is None:
                break
            links.append((run_id, parent))
            run_id = parent
        return links

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
    ) -> list[Any]:
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
        self._write_unmarked()  # so feedback passes by the runs that failed while the store was locked
        ens = self.ensemble
        elsewhere = self._learners_elsewhere(run_id)
        if not elsewhere:
            records = record_run_feedback(self.store, run_id, signal, ensemble=ens, **fb)
            self._warn_unlearned(run_id, records, elsewhere)
            self._warn_chunk_unlearned(run_id, chunk_id, records, elsewhere)
            return records
        # The run tree (links) lives in this handler's store: resolve here, record per event there. The learner's
        # writes inside the handler's block, so that a refusal there (an idempotency conflict, a locked file)
        # undoes the handler's rows too; each is a transaction of the learner's file, as before, since a block
        # held on that file would keep waiting a learner on another connection to it (another ensemble of the
        # same file that made the decision). Not where a learner keeps the handler's file through another
        # connection: it learns after the handler's commit, which a block around it would keep waiting.
        with ExitStack() as block:
            if not learns_after_commit(self.store, run_id):
                block.enter_context(self.store.exclusive())
            records = record_run_feedback(self.store, run_id, signal, ensemble=ens, **fb)
            ikey = fb.pop("idempotency_key", None)
            rated = [r.event_id for r in records]
            for eid in rated:
                learner = elsewhere.get(eid)
                if learner is not None:
                    # the same key per event as record_run_feedback gave it in this store
                    key_there = ikey if ikey is None or len(rated) == 1 else f"{ikey}:{eid}"
                    records += record_run_feedback(learner.store, eid, signal, ensemble=learner,
                                                   idempotency_key=key_there, **fb)
        self._warn_unlearned(run_id, records, elsewhere)
        self._warn_chunk_unlearned(run_id, chunk_id, records, elsewhere)
        return records

    def _warn_chunk_unlearned(self, run_id: Any, chunk_id: str | None, records: Sequence[Any],
                              elsewhere: dict[str, Any]) -> None:
        """Warn where feedback on ``chunk_id`` was stored on a copy of what the run returned (its
        ``"<run id>/result"``) while the rlfb decisions below it never returned that document: a wrapper that
        returns other documents than those ranked (a ``ParentDocumentRetriever`` or ``MultiVectorRetriever`` gives
        the parents of the chunks rlfb ranked) took the click, and no learner learned it (an audit, 2026-12-06:
        silent before)."""
        if chunk_id is None:
            return

        def decided(eid: str) -> bool:  # an rlfb decision, here or in its ensemble's own store
            return eid in elsewhere or self.store.event(eid).get("policy") != EXTERNAL_POLICY

        if any(decided(r.event_id) for r in records):
            return
        try:
            below = self.store.resolve_run(str(run_id))
        except RlfbError:
            return
        if any(decided(eid) for eid in below):
            warnings.warn(
                f"feedback on document {chunk_id!r} of run {str(run_id)!r} was stored but taught no rlfb learner: "
                "no rlfb retrieval of the run returned that document (a ParentDocumentRetriever or "
                "MultiVectorRetriever returns the parents of the chunks rlfb ranked); give the id of a document "
                "the rlfb retriever returned, or feedback on the whole run",
                RuntimeWarning, stacklevel=3,
            )

    def _warn_unlearned(self, run_id: Any, records: Sequence[Any], elsewhere: dict[str, Any]) -> None:
        """Warn, once per handler, where feedback was stored on an rlfb decision that no live learner of this
        process learned: a handler made from the store alone (no ``ensemble``), after a restart or in another
        process than the retriever's, stores the feedback and teaches nothing. A plain retriever's log (an
        external event) has no learner to teach, and is not warned of."""
        if self._warned_unlearned:
            return
        for eid in dict.fromkeys(r.event_id for r in records):
            # learned by its ensemble on its own store, or by the live one that logged it here (as
            # record_run_feedback picks it; it made the decision, so it owns it), or by the handler's own
            if eid in elsewhere or learned_here(self.store, eid, self.ensemble):
                continue
            self._warned_unlearned = True
            warnings.warn(
                f"feedback on run {str(run_id)!r} was stored, but no rlfb learner of this process learned it: "
                f"the ensemble that made retrieval {eid!r} is not alive here (a restart, another process) and "
                "the handler was given none that made it; make the handler with "
                "FeedbackCallbackHandler.from_ensemble(retriever) where the retriever runs "
                "(this warning is given once per handler)",
                RuntimeWarning, stacklevel=3,
            )
            return

    def _learners_elsewhere(self, run_id: Any) -> dict[str, Any]:
        """The retrievals under ``run_id`` whose decision an ensemble keeps in another store than this handler's,
        by event id, with that ensemble: the live one of this process that made it (any adapter's, on any store),
        else the handler's own ``ensemble`` where its store holds the event (made before a restart)."""
        try:
            event_ids = self.store.resolve_run(str(run_id))
        except RlfbError:  # a bad run id: record_run_feedback names it
            return {}
        out = {}
        for eid in event_ids:
            learner = maker_of(eid)
            if learner is None:  # compared with None: an ensemble of no chunks (members only) has length 0
                learner = self.ensemble
            theirs = getattr(learner, "store", None)
            if theirs is not None and not same_store(theirs, self.store) and theirs.has_event(eid):
                out[eid] = learner
        return out

    def retrievals(self, run_id: Any) -> list[dict[str, Any]]:
        """The logged retrievals a run id stands for (store event dicts, with their ranked ``chunks``)."""
        with contextlib.suppress(StoreBusyError):  # a read: the kept marks wait for a write that can wait
            self._write_unmarked()
        return [self.store.event(e) for e in self.store.resolve_run(str(run_id))]


# Handlers holding failed marks or retrieval logs kept while their store was locked, with the process that kept
# them: written when it exits, and held until then (a handler made per request, collected on its return, took
# them with it; so did a script that ended before its next write). Filled on first use, not at import.
_KEEPING: dict[int, tuple[int, FeedbackCallbackHandler]] = {}


def _keep_until_written(handler: FeedbackCallbackHandler) -> None:
    """``handler`` keeps marks or logs for a later write: write them at exit if nothing has by then."""
    _KEEPING[id(handler)] = (os.getpid(), handler)
    run_at_exit(_write_kept_at_exit)


def _write_kept_at_exit() -> None:
    """At exit: write what each handler of this process kept while its store was locked, warning where that fails
    (the store still locked, or closed already)."""
    pid = os.getpid()
    for key, (owner, handler) in list(_KEEPING.items()):
        if owner != pid:  # a forked child's copy of its parent's entry: the parent writes it
            continue
        try:
            handler._write_unmarked()
        except Exception as exc:  # noqa: BLE001 - at exit there is no caller to raise to
            warnings.warn(
                f"rlfb: {len(handler._unlogged)} retrieval log(s) and {len(handler._unmarked)} failed run mark(s) "
                f"kept while the feedback store was locked were not written at exit: {exc!r}",
                RuntimeWarning, stacklevel=1)
        _KEEPING.pop(key, None)


def _trim(table: OrderedDict[str, Any]) -> None:
    """Drop the oldest entries of one of the handler's tables past :data:`_OPEN_RUNS` (call under its lock)."""
    while len(table) > _OPEN_RUNS:
        table.popitem(last=False)


def _str(run_id: Any) -> str | None:
    return None if run_id is None else str(run_id)


def _results(documents: Sequence[Document]) -> tuple[list[tuple[str, float | None]], list[str]]:
    """``(chunk id, score)`` of each document, and a note on the scores that could not be kept.

    A ``metadata["score"]`` that is not a finite number (an int beyond float range, NaN, a string) is
    logged as no score, as for a document that has none: the ranking is still what the user saw.
    """
    results: list[tuple[str, float | None]] = []
    bad: list[str] = []
    for doc in documents:
        chunk = document_to_chunk(doc)
        score, usable = usable_score(chunk.metadata.get("score"))
        if not usable:
            bad.append(chunk.id)
        results.append((chunk.id, score))
    notes = [f"the scores of {len(bad)} documents (not finite numbers: {bad[:5]!r})"] if bad else []
    return results, notes


def _check_ensemble(ensemble: Any) -> Any:
    """The :class:`rlfb.FeedbackEnsemble` given, or the one a retriever wraps; else :class:`ValidationError`."""
    from rlfb.ensemble import FeedbackEnsemble

    ensemble = getattr(ensemble, "ensemble", ensemble)  # the retriever itself is the natural thing to pass
    if not isinstance(ensemble, FeedbackEnsemble):
        raise ValidationError(f"the handler needs an rlfb FeedbackEnsemble or a retriever wrapping one, "
                              f"got {type(ensemble).__name__}")
    return ensemble
