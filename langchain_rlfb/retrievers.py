"""``FeedbackEnsembleRetriever``: an rlfb :class:`~rlfb.FeedbackEnsemble` as a LangChain retriever.

Thin by design: retrieval, fusion, logging and learning all happen in
:mod:`rlfb`; this module converts ``Document`` to and from rlfb chunks and hits
and maps LangChain's run ids, run metadata and retrievers onto the core.

* Each retrieval is logged with the LangChain **run id as its event id** (and
  the parent run id as its parent), so a
  :class:`~langchain_rlfb.callbacks.FeedbackCallbackHandler` and this retriever
  name the same event, and feedback can be given by run id.
* The **session** comes from the run's metadata
  (``config={"metadata": {"session_id": ...}}``, else LangSmith's ``thread_id`` or
  ``conversation_id``), else from the retriever's
  ``session_id`` field (reported in the run's metadata as ``rlfb_session_id``,
  so that a handler's copy of the retrieval has it too). A follow-up in the
  same session that restates the previous query is recorded as a
  ``"reformulation"`` on the previous retrieval (:func:`rlfb.runs.observe_followup`).
* Any LangChain retriever or vector store can join the ensemble as a
  search-only member (:func:`as_member`): the ensemble learns a weight for it.

Each returned ``Document`` has ``id`` = the chunk id and, besides the chunk's
own metadata, the keys of :data:`METADATA_KEYS`: ``chunk_id``, ``score`` (fused),
``scores`` (each retriever's raw score, ``None`` where a member did not return
the chunk), ``rank`` (1-based), ``event_id`` (``None`` without a store) and
``proposed_by`` (the retrievers whose own top list held the chunk).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import run_in_executor
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever
from pydantic import ConfigDict, Field

from langchain_rlfb._checks import flag, positive_count, session_key, session_text, with_configured_session
from rlfb._caller import app_line_for_threads, warn_at_app
from rlfb.defaults import ADAPTER_RETRIEVERS, LEARNING_POLICY
from rlfb.ensemble import FeedbackEnsemble
from rlfb.errors import DuplicateEventError, DuplicateIdError, NoStoreError, ValidationError
from rlfb.members import SearchMember
from rlfb.runs import content_id, default_implicit, observe_followup, record_run_feedback
from rlfb.types import Chunk, Hit, check_known_options, copy_metadata, keyword_options

if TYPE_CHECKING:
    from rlfb.store.records import FeedbackRecord

__all__ = [
    "FeedbackEnsembleRetriever",
    "METADATA_KEYS",
    "as_member",
    "document_to_chunk",
    "hit_to_document",
]

# the adapters' defaults are rlfb.defaults': a learner, and the retrievers both adapters run (one store, shared)
_DEFAULT_POLICY = LEARNING_POLICY
_DEFAULT_RETRIEVERS = ADAPTER_RETRIEVERS

#: Metadata keys every returned Document carries. They replace a chunk's own keys of the same names (with a
#: warning, once per set of keys, as ``llamaindex_rlfb.METADATA_KEYS`` replace a node's).
METADATA_KEYS = ("chunk_id", "score", "scores", "rank", "event_id", "proposed_by")

_warned: set[tuple[str, ...]] = set()  # the sets of a chunk's own keys replaced that a warning named already
_warned_lock = threading.Lock()

#: The run metadata key under which a retriever reports its own ``session_id`` (the session of a call whose run
#: metadata has none), for a :class:`~langchain_rlfb.FeedbackCallbackHandler` to log its copy under it too.
SESSION_KEY = "rlfb_session_id"

# Callbacks for members' runs, so a member retriever's run nests under the ensemble's run.
_MEMBER_CALLBACKS: ContextVar[Any] = ContextVar("rlfb_member_callbacks", default=None)
#: LangChain retriever members' documents that ``ainvoke`` fetched with their ``ainvoke``, by (member, query)
_FETCHED: ContextVar[dict[tuple[int, str], Any] | None] = ContextVar("rlfb_fetched_members", default=None)

MemberLike = Any  # a BaseRetriever / Runnable[str, list[Document]], a VectorStore, or a SearchMember


def _given_id(doc: Document) -> Any:
    """The id the user gave ``doc``: ``doc.id``, else ``metadata["chunk_id"]`` (what rlfb's Documents carry).

    ``metadata["id"]`` is not an id here: loaders (Notion, Confluence, ...) set it to the page's id, which
    every chunk split from the page inherits, and taking it merged those chunks into one.
    """
    meta = doc.metadata or {}
    return doc.id or meta.get("chunk_id")


def document_to_chunk(doc: Document) -> Chunk:
    """A ``Document`` as a chunk.

    Its id is ``doc.id``, else ``metadata["chunk_id"]``,
    else a hash of the content (:func:`rlfb.runs.content_id`).
    """
    cid = _given_id(doc)
    return Chunk(str(cid) if cid is not None else content_id(doc.page_content), doc.page_content,
                 copy_metadata(doc.metadata))


def _documents_to_chunks(documents: Sequence[Document]) -> list[Chunk]:
    """Chunks of ``documents``, in order (ids from :func:`document_to_chunk`).

    Documents without an id and with the same ``page_content`` are one chunk
    (their content id is the same): the first is kept, as the LlamaIndex
    adapter keeps the first of nodes with one id. An id the user gave twice is
    a :class:`rlfb.errors.DuplicateIdError` naming both documents.
    """
    first: dict[str, int] = {}  # chunk id -> index of the document it came from
    out = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise ValidationError(f"documents[{i}]: expected a LangChain Document, got {type(doc).__name__}")
        chunk = document_to_chunk(doc)
        if chunk.id in first:
            if _given_id(doc) is None:  # a repeated boilerplate text (a footer, a header): index it once
                continue
            raise DuplicateIdError(f"documents {first[chunk.id]} and {i} both have the id {chunk.id!r}")
        first[chunk.id] = i
        out.append(chunk)
    return out


def hit_to_document(hit: Hit, event_id: str | None = None) -> Document:
    """A fused hit as a ``Document`` whose metadata adds :data:`METADATA_KEYS` to the chunk's metadata.

    The chunk's own metadata under one of those keys is replaced; a warning names such keys, once per set of
    keys in the process (:func:`_warn_replaced`).
    """
    _warn_replaced(hit)
    meta = {
        **dict(hit.metadata),
        "chunk_id": hit.chunk_id,
        "score": hit.score,
        "scores": dict(hit.scores),
        "rank": hit.rank,
        "event_id": event_id,
        "proposed_by": list(hit.proposed_by),
    }
    return Document(page_content=hit.text, metadata=meta, id=hit.chunk_id)


def _warn_replaced(hit: Hit) -> None:
    """Say (once per set of keys) that the chunk's own metadata under :data:`METADATA_KEYS` is replaced, as the
    LlamaIndex adapter says it of a node's.

    Not for the keys of a Document an rlfb retriever returned, indexed or fused again (as a member, or through
    ``add_documents``): it holds every one of them, its ``chunk_id`` naming the chunk, and they are rlfb's
    already. Nor for a ``chunk_id`` that names the chunk (:func:`document_to_chunk` reads the id from it).
    """
    meta = hit.metadata or {}
    present = [k for k in METADATA_KEYS if k in meta]
    if len(present) == len(METADATA_KEYS) and meta.get("chunk_id") == hit.chunk_id:
        return  # a Document an rlfb retriever returned: the keys are rlfb's already
    own = tuple(k for k in present if not (k == "chunk_id" and meta[k] == hit.chunk_id))
    if not own:
        return
    with _warned_lock:
        if own in _warned:
            return
        _warned.add(own)
    warn_at_app(
        f"the metadata keys {list(own)} of document {hit.chunk_id!r} (and of any document that has them) are "
        f"replaced by rlfb's own on the Documents it returns ({', '.join(METADATA_KEYS)}): rename those keys "
        "to keep their values",
        UserWarning,
    )


def as_member(name: str, source: MemberLike, *, scores: str = "auto") -> SearchMember:
    """Wrap a LangChain retriever or vector store as a search-only ensemble member.

    A vector store (or a ``similarity`` ``VectorStoreRetriever``) is searched
    directly for as many results as the ensemble's candidate pool asks for.
    ``scores`` says which of its scores to fuse: ``"auto"`` uses
    ``similarity_search_with_relevance_scores`` (higher is better) where the
    store implements it and ranks otherwise; ``"similarity"`` /
    ``"distance"`` use ``similarity_search_with_score`` as a similarity (higher
    is better) or a distance (lower is better, negated); ``"rank"`` fuses by
    rank. Any other retriever is invoked as is (its own ``k`` sets how many
    results it gives) and fused by rank. Its run nests under the ensemble's run.

    Members' chunk ids come from :func:`document_to_chunk`; give the
    documents the ids of the ensemble's chunks (``vs.add_documents(docs, ids=ids)``)
    so each chunk gets every retriever's score.
    """
    return _member(name, source, scores, warn_unscored=True)


def _member(name: str, source: MemberLike, scores: str, *, warn_unscored: bool) -> SearchMember:
    """:func:`as_member`; ``warn_unscored``: warn where a vector store in ``"auto"`` gives no relevance scores."""
    if isinstance(source, SearchMember):
        if source.name != name:
            raise ValidationError(f"member {source.name!r} is listed under the name {name!r}")
        return source
    if scores not in ("auto", "similarity", "distance", "rank"):
        raise ValidationError(f"scores must be 'auto', 'similarity', 'distance' or 'rank', got {scores!r}")
    store: VectorStore | None = None
    extra: dict[str, Any] = {}
    if isinstance(source, VectorStore):
        store = source
    elif isinstance(source, VectorStoreRetriever) and source.search_type == "similarity":
        store = source.vectorstore
        extra = {k: v for k, v in source.search_kwargs.items() if k != "k"}
    if store is not None:
        return SearchMember(name, _vectorstore_search(name, store, extra, scores, warn_unscored))
    if isinstance(source, Runnable):
        return SearchMember(name, _runnable_search(name, source))
    raise ValidationError(
        f"member {name!r}: expected a LangChain retriever, a vector store or a SearchMember, "
        f"got {type(source).__name__}"
    )


def _vectorstore_search(name: str, store: VectorStore, extra: dict[str, Any], scores: str, warn: bool) -> Any:
    warned = not warn

    def search(query: str, k: int) -> list[tuple[Chunk, float | None]]:
        nonlocal warned
        pairs: list[tuple[Document, float | None]]
        if scores == "auto":
            try:
                pairs = list(store.similarity_search_with_relevance_scores(query, k=k, **extra))
            except NotImplementedError:
                if not warned:  # LangChain's own InMemoryVectorStore among them: its scores went unused, unsaid
                    warned = True
                    warn_at_app(
                        f"member {name!r}: {type(store).__name__} gives no relevance scores, so it is fused by "
                        f"rank; as_member({name!r}, store, scores='similarity') (or 'distance') fuses the scores "
                        "of its similarity_search_with_score", UserWarning)
                pairs = [(d, None) for d in store.similarity_search(query, k=k, **extra)]
        elif scores == "rank":
            pairs = [(d, None) for d in store.similarity_search(query, k=k, **extra)]
        else:
            sign = 1.0 if scores == "similarity" else -1.0
            pairs = [(d, sign * s) for d, s in store.similarity_search_with_score(query, k=k, **extra)]
        return [(document_to_chunk(d), s) for d, s in pairs]

    return search


def _runnable_search(name: str, retriever: Runnable) -> Any:
    def search(query: str, k: int) -> list[tuple[Chunk, None]]:
        fetched = _FETCHED.get()
        key = (id(retriever), query)  # not by name: an rlfb retriever called inside has members of its own
        if fetched is not None and key in fetched:  # ainvoke searched it already, with its ainvoke
            docs = fetched[key]
        else:
            # Explicit callbacks: without them the run would inherit an enclosing chain's and show up
            # as a sibling retrieval of the ensemble's own run.
            docs = retriever.invoke(query, config={"callbacks": _MEMBER_CALLBACKS.get() or []})
        for wrong in (docs,) if not isinstance(docs, (list, tuple)) else docs:
            if not isinstance(wrong, Document):
                raise ValidationError(f"member {name!r} returned a {type(wrong).__name__}, where a retriever "
                                      "returns a list of Documents")
        return [(document_to_chunk(d), None) for d in docs]

    search.runnable = retriever  # type: ignore[attr-defined]  # what ainvoke awaits, all members at once
    return search


async def _fetch_runnables(members: Sequence[SearchMember], query: str,
                           callbacks: Any) -> dict[tuple[int, str], Any]:
    """Each LangChain retriever member's documents for ``query``, from its ``ainvoke``, all at once (as
    LangChain's ``EnsembleRetriever`` does), by the member's identity and the query: a member with an async
    search only works under ``ainvoke``, and remote ones are searched side by side."""
    runnables = [r for m in members if (r := getattr(m.function, "runnable", None)) is not None]
    tasks = [asyncio.ensure_future(r.ainvoke(query, config={"callbacks": callbacks})) for r in runnables]
    try:
        found = await asyncio.gather(*tasks)
    except BaseException:
        # one member failed (or the call was cancelled): the others are cancelled and awaited, so none ends
        # after the ensemble's run has ended, an orphan in the trace
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return {(id(r), query): docs for r, docs in zip(runnables, found, strict=True)}


def _members(members: Mapping[str, MemberLike] | Sequence[MemberLike] | None,
             fusion: object = None) -> list[SearchMember]:
    if not members:
        return []
    # RRF fuses ranks alone: the warning that a store without relevance scores "is fused by rank" would be said
    # of every member (the scores a store gives are still kept in each Document's metadata and the log)
    warn = fusion != "rrf"
    if isinstance(members, Mapping):
        return [_member(name, m, "auto", warn_unscored=warn) for name, m in members.items()]
    unnamed = [type(m).__name__ for m in members if not (isinstance(getattr(m, "name", None), str) and m.name)]
    if unnamed:  # a list of LangChain retrievers, named by an attribute they leave None: "needs a non-empty name"
        raise ValidationError(f"members must map a name to each retriever or vector store ({{'bm25': retriever, "
                              f"...}}), or name each one; got an unnamed {unnamed[0]} in a sequence")
    return [_member(m.name, m, "auto", warn_unscored=warn) for m in members]


def _check_call_options(unknown: Mapping[str, Any]) -> None:
    """Refuse an option ``invoke`` passed on that the retriever does not take, by name: ``invoke(q, explor=False)``
    raised a bare ``TypeError`` from inside langchain_core. ``verbose``, which ``BaseRetriever.invoke`` reads for
    its callback manager and passes on too, is taken and has no use here."""
    given = {name for name in unknown if name != "verbose"}
    if given:
        check_known_options(given, ("k", "explore", "log", "verbose"), "FeedbackEnsembleRetriever.invoke (ainvoke)")


# each option's check: (value, option name) -> the value checked
_CHECKS: dict[str, Callable[[Any, str], int | bool]] = {
    "k": positive_count, "explore": flag, "log": flag, "observe_followups": flag,
}


def _check_options(ensemble_kwargs: Mapping[str, Any], method: str) -> None:
    """Refuse an option that neither ``FeedbackEnsembleRetriever.<method>`` nor the ensemble takes, before any
    indexing, naming the method the caller called with every option it takes (the ensemble's refusal named
    ``FeedbackEnsemble``, which the caller never called, and listed none of the retriever's own)."""
    ensemble = keyword_options(FeedbackEnsemble.__init__, leave_out=("retrievers", "chunks"))
    if ensemble is None:  # pragma: no cover - a FeedbackEnsemble of the user's own that takes anything
        return
    own = _named_options(getattr(FeedbackEnsembleRetriever, method))
    # from_texts and from_documents index through FeedbackEnsemble.from_chunks, which takes retriever_options
    # (a dense model's device or path) and show_progress besides the constructor's
    indexing = _named_options(FeedbackEnsemble.from_chunks) if method != "from_retrievers" else []
    check_known_options(ensemble_kwargs, {*own, *indexing, *ensemble}, f"FeedbackEnsembleRetriever.{method}")


def _named_options(func: Any) -> list[str]:
    """The keyword-only options ``func`` names (its ``**kwargs`` aside)."""
    return [n for n, p in inspect.signature(func).parameters.items() if p.kind is p.KEYWORD_ONLY]


def _checked_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``data`` the retriever checks itself, validated (rlfb's ``ValidationError``)."""
    out: dict[str, Any] = {name: check(data[name], name) for name, check in _CHECKS.items() if name in data}
    if data.get("session_id") is not None:
        session = data["session_id"]
        if session_text(session) is None:
            raise ValidationError(f"session_id must be a non-empty str, an int or a UUID, got {session!r}")
        out["session_id"] = session_text(session)
    return out


def _run_session(metadata: Mapping[str, Any], default: str | None) -> str | None:
    """The run metadata's session id (:data:`~langchain_rlfb._checks.SESSION_KEYS`: ``session_id``, else
    LangSmith's ``thread_id`` or ``conversation_id``), else ``default``; one that cannot be a session id is dropped.

    Run metadata is inherited by every run of a chain, so it is not the retriever's argument to refuse:
    the retrieval goes ahead and is logged without a session, with a warning (as the callback handler does).
    """
    key = session_key(metadata)  # session_id, else LangSmith's thread_id or conversation_id
    if key is None:
        return default
    if metadata[key] is None:  # an explicit None: this call has no session
        return None
    session = session_text(metadata[key])
    if session is None:
        warn_at_app(f"ignoring run metadata {key} {metadata[key]!r}: "
                    "not a non-empty str, int or UUID")
    return session


class FeedbackEnsembleRetriever(BaseRetriever):
    """A LangChain retriever over a :class:`~rlfb.FeedbackEnsemble` whose fusion weights learn from feedback.

    Build it with :meth:`from_texts`, :meth:`from_documents`,
    :meth:`from_retrievers` or :meth:`from_ensemble`. ``k`` is set here and
    per call (``retriever.invoke(query, k=3)``); so are ``explore``
    (``explore=False`` for the greedy ranking) and ``log`` (``log=False``
    writes nothing to the store, for evaluation; the documents then carry no
    ``event_id``, and a :class:`FeedbackCallbackHandler` on the run still logs
    what it returned, as for any retriever).

    Example:
        .. code-block:: python

            retriever = FeedbackEnsembleRetriever.from_texts(
                texts, ids=ids, retrievers=("bm25", "dense"), store="fb.db", k=3)
            docs = retriever.invoke("what causes the aurora?")
            retriever.feedback(docs[0].metadata["event_id"], "thumbs_up")
            retriever.weights
    """

    # forbid: a misspelt option (explor=False) was silently ignored, against the checks of every other argument
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    ensemble: FeedbackEnsemble
    """The rlfb ensemble that retrieves, logs and learns."""
    k: int = Field(default=4, gt=0)
    """Number of documents to return (overridden by ``invoke(..., k=...)``)."""
    session_id: str | None = None
    """Session of every call whose run metadata has no ``session_id``."""
    explore: bool = True
    """Let the policy explore (overridden by ``invoke(..., explore=...)``)."""
    log: bool = True
    """Log each retrieval to the store so feedback can reach it (overridden by ``invoke(..., log=...)``)."""
    observe_followups: bool = True
    """Record a restated follow-up in the same session as a reformulation of the previous query."""

    def __init__(self, **data: Any) -> None:
        # Checked before pydantic, which would read k=2.0 as 2 and explore="no" as False, and would wrap
        # rlfb's ValidationError in its own; invoke(k=0) raises rlfb's, so construction does too.
        super().__init__(**{**data, **_checked_fields(data)})

    def __setattr__(self, name: str, value: Any) -> None:
        # pydantic checks no assignment: retriever.session_id = uuid4() failed every later invoke, and
        # retriever.observe_followups = "no" was read as true
        if name in _CHECKS or name == "session_id":
            value = _checked_fields({name: value}).get(name, value)
        super().__setattr__(name, value)

    # ------------------------------------------------------------------ LangChain hooks
    def _get_ls_params(self, **kwargs: Any) -> Any:
        # LangChain adds these to the run's metadata, which is all a callback handler sees of the retriever: a
        # FeedbackCallbackHandler on another store then logged its copy without the session this retriever used,
        # and saw no follow-up in it
        params = super()._get_ls_params(**kwargs)
        return params if self.session_id is None else {**params, SESSION_KEY: self.session_id}

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        explore: bool | None = None,
        log: bool | None = None,
        **unknown: Any,
    ) -> list[Document]:
        _check_call_options(unknown)
        return self._retrieve(query, run_manager, run_manager.get_child(), k, explore, log)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        explore: bool | None = None,
        log: bool | None = None,
        **unknown: Any,
    ) -> list[Document]:
        _check_call_options(unknown)
        # The core is synchronous (numpy, SQLite): run it in a thread, as LangChain's default does.
        cancelled = threading.Event()
        child = run_manager.get_child()
        token = None
        try:
            members = self.ensemble.members
            if any(getattr(m.function, "runnable", None) is not None for m in members):
                self._call_options(run_manager, k, explore, log)  # refused before any member is searched
                token = _FETCHED.set(await _fetch_runnables(members, query, child))  # the thread copies it
            with app_line_for_threads():  # the thread's warnings name the app's await, not the thread pool
                return await run_in_executor(None, self._retrieve, query, run_manager, child, k, explore, log,
                                             cancelled)
        except asyncio.CancelledError as exc:
            # A cancelled ainvoke (asyncio.wait_for timing out) is a BaseException, which BaseRetriever.ainvoke
            # does not pass to the callbacks' error hook: say it here, so a FeedbackCallbackHandler drops the
            # run's entries and a tracer closes the run. The thread goes on, but logs nothing once it sees the flag.
            cancelled.set()
            await asyncio.shield(run_manager.on_retriever_error(exc))
            raise
        finally:
            if token is not None:
                _FETCHED.reset(token)

    def _call_options(self, run: Any, k: int | None, explore: bool | None,
                      log: bool | None) -> tuple[int, bool, bool]:
        """This call's ``(k, explore, logging)``, checked, before anything is searched or written.

        The fields are checked too: one set after construction (retriever.k = "2") is not checked by pydantic.
        ``log`` is checked also where there is no store. A run id logged before is refused: the refusal came
        after a reformulation of the session's previous retrieval had been stored and learned.
        """
        k = positive_count(self.k if k is None else k, "k")
        explore = flag(self.explore if explore is None else explore, "explore")
        wanted = flag(self.log if log is None else log, "log")
        store = self.ensemble.store
        logging = store is not None and wanted
        has_event = getattr(store, "has_event", None) if logging else None  # a store of the user's own may lack it
        if has_event is not None and has_event(str(run.run_id)):
            raise DuplicateEventError(f"event id {str(run.run_id)!r} was already logged (a run id given twice)")
        return k, explore, logging

    def _retrieve(
        self, query: str, run: Any, child_callbacks: Any, k: int | None, explore: bool | None, log: bool | None,
        cancelled: threading.Event | None = None,
    ) -> list[Document]:
        ens = self.ensemble
        k, explore, logging = self._call_options(run, k, explore, log)
        session = _run_session(with_configured_session(run.metadata), self.session_id)
        token = _MEMBER_CALLBACKS.set(child_callbacks)
        try:
            ctx = ens.context(query, session_id=session, k=k)  # the slow part: encoding, scoring, members
        finally:
            _MEMBER_CALLBACKS.reset(token)
        if cancelled is not None and cancelled.is_set():
            # nobody will see this ranking: logging it would give the session's next question a "previous
            # retrieval" to be a reformulation of, and the learner a decision nobody rated
            return []
        if session is not None and logging and self.observe_followups:
            # once the search has worked, as the callback handler does: a search that raised answered nobody,
            # and its question had already been stored as a reformulation of the previous one
            parent = None if run.parent_run_id is None else str(run.parent_run_id)
            # the ensemble's settings as they are now (ens.implicit), not as they were at the first follow-up
            observe_followup(ens.store, session, query, ensemble=ens, implicit=default_implicit(ens),
                             run_ancestors=() if parent is None else (parent,))
        result = ens.rank_context(
            ctx,
            k,
            explore=explore,
            log=logging,
            event_id=str(run.run_id) if logging else None,
            parent_id=str(run.parent_run_id) if logging and run.parent_run_id is not None else None,
            metadata={"framework": "langchain", "run_name": self.get_name()},
        )
        return [hit_to_document(h, result.event_id) for h in result.hits]

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_ensemble(
        cls, ensemble: FeedbackEnsemble, *, k: int = 4, **kwargs: Any
    ) -> FeedbackEnsembleRetriever:
        """Wrap an existing ensemble (``kwargs``: the other retriever fields, ``tags``, ``metadata``)."""
        return cls(ensemble=ensemble, k=k, **kwargs)

    @classmethod
    def from_texts(
        cls,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        members: Mapping[str, MemberLike] | Sequence[MemberLike] | None = None,
        k: int = 4,
        session_id: str | None = None,
        explore: bool = True,
        log: bool = True,
        observe_followups: bool = True,
        retrievers: Sequence[Any] = _DEFAULT_RETRIEVERS,
        policy: Any = _DEFAULT_POLICY,
        **ensemble_kwargs: Any,
    ) -> FeedbackEnsembleRetriever:
        """Index ``texts`` with rlfb's retrievers; ``members`` adds LangChain retrievers or vector stores.

        ``members`` maps a name to a retriever or vector store (see :func:`as_member`).
        ``retrievers`` are rlfb's own, ``("bm25", "dense")`` by default: what ``rlfb[langchain,dense]``
        installs, and the LlamaIndex adapter's default, so that both share a store's learned weights
        (add ``"splade"`` with ``rlfb[splade]``). ``policy`` is the weights' learner, ``"thompson"`` by
        default (the one the README's results measure learning with; ``"fixed"`` keeps the weights you give).

        ``ensemble_kwargs`` go to :meth:`rlfb.FeedbackEnsemble.from_texts`:
        ``store``, ``fusion``, ``weights``, ``candidate_k``, ``seed``, ...
        """
        opts = _checked_fields({"k": k, "session_id": session_id, "explore": explore, "log": log,
                                "observe_followups": observe_followups})  # before indexing
        _check_options(ensemble_kwargs, "from_texts")
        members_ = _members(members, ensemble_kwargs.get("fusion"))
        ens = FeedbackEnsemble.from_texts(texts, ids, metadatas, retrievers=retrievers, members=members_,
                                          policy=policy, **ensemble_kwargs)
        return cls(ensemble=ens, **opts)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        *,
        members: Mapping[str, MemberLike] | Sequence[MemberLike] | None = None,
        k: int = 4,
        session_id: str | None = None,
        explore: bool = True,
        log: bool = True,
        observe_followups: bool = True,
        retrievers: Sequence[Any] = _DEFAULT_RETRIEVERS,
        policy: Any = _DEFAULT_POLICY,
        **ensemble_kwargs: Any,
    ) -> FeedbackEnsembleRetriever:
        """Index ``documents``; otherwise as :meth:`from_texts`.

        Ids come from :func:`document_to_chunk`. Documents without an id and
        with the same ``page_content`` (a repeated header or footer) are indexed
        once, keeping the first, as the LlamaIndex adapter keeps the first of
        nodes with one id; an id given to two documents raises
        :class:`rlfb.errors.DuplicateIdError` naming both.
        """
        opts = _checked_fields({"k": k, "session_id": session_id, "explore": explore, "log": log,
                                "observe_followups": observe_followups})  # before indexing
        _check_options(ensemble_kwargs, "from_documents")
        chunks = _documents_to_chunks(documents)
        members_ = _members(members, ensemble_kwargs.get("fusion"))
        ens = FeedbackEnsemble.from_chunks(chunks, retrievers=retrievers, members=members_, policy=policy,
                                           **ensemble_kwargs)
        return cls(ensemble=ens, **opts)

    @classmethod
    def from_retrievers(
        cls,
        retrievers: Mapping[str, MemberLike] | Sequence[MemberLike],
        *,
        k: int = 4,
        session_id: str | None = None,
        explore: bool = True,
        log: bool = True,
        observe_followups: bool = True,
        policy: Any = _DEFAULT_POLICY,
        **ensemble_kwargs: Any,
    ) -> FeedbackEnsembleRetriever:
        """Fuse existing LangChain retrievers / vector stores only (no rlfb index), with learned weights.

        ``retrievers`` maps a member name to a retriever or vector store
        (see :func:`as_member`), or lists members that carry their own ``name``; ``policy`` as in
        :meth:`from_texts` (``"thompson"``);
        ``ensemble_kwargs`` go to :class:`rlfb.FeedbackEnsemble`.
        """
        if not retrievers:
            raise ValidationError("from_retrievers needs at least one retriever")
        opts = _checked_fields({"k": k, "session_id": session_id, "explore": explore, "log": log,
                                "observe_followups": observe_followups})
        _check_options(ensemble_kwargs, "from_retrievers")  # a named error, not a TypeError
        ens = FeedbackEnsemble({}, members=_members(retrievers, ensemble_kwargs.get("fusion")), policy=policy,
                                **ensemble_kwargs)
        return cls(ensemble=ens, **opts)

    # ------------------------------------------------------------------ a changing corpus
    def add_documents(self, documents: Sequence[Document], *, ids: Sequence[str] | None = None) -> list[str]:
        """Index more documents, as a vector store's ``add_documents``; returns their ids.

        A document whose id is already indexed replaces it. Ids come from ``ids``,
        else as in :meth:`from_documents`. See :meth:`rlfb.FeedbackEnsemble.add_chunks`.
        """
        documents = list(documents)
        if ids is not None:
            ids = [str(i) for i in ids]
            if len(ids) != len(documents):
                raise ValidationError(f"got {len(documents)} documents but {len(ids)} ids")
            documents = [d.model_copy(update={"id": i}) if isinstance(d, Document) else d
                         for d, i in zip(documents, ids, strict=True)]
        chunks = _documents_to_chunks(documents)
        self.ensemble.add_chunks(chunks)
        # one id per document given, as a vector store returns them: a repeated text without an id is indexed
        # once, and the list used to come back shorter, so zipping it with the documents paired them wrongly
        return [document_to_chunk(d).id for d in documents]

    def delete(self, ids: Sequence[str]) -> None:
        """Remove the documents with these ids from the index (:meth:`rlfb.FeedbackEnsemble.delete_chunks`)."""
        self.ensemble.delete_chunks(ids)

    # ------------------------------------------------------------------ learning
    @property
    def weights(self) -> dict[str, float]:
        """The ensemble's current global fusion weights, ``{retriever name: weight}``.

        A query type with clear evidence of its own (thompson's contextual arms) is ranked with its own
        weights, which can move while these stay put: ``retriever.ensemble.weights_for(query)``.
        """
        return self.ensemble.weights

    def feedback(
        self,
        run_id: Any,
        signal: str | float | None = None,
        *,
        score: float | bool | None = None,
        score_scale: str = "unit",
        rating: float | None = None,
        value: float | None = None,
        chunk_id: str | None = None,
        comment: str | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> list[FeedbackRecord]:
        """Feedback on a retrieval (its ``event_id``, which is its run id) or on the chain run just above it.

        The ensemble learns from it. The retriever knows only its parent run: for a run further
        up (a whole chain's ``run_id``), pass a :class:`FeedbackCallbackHandler` in the chain's
        callbacks, which links every run of the chain to its parent.

        ``score`` follows LangSmith (``0``/``1`` thumbs by default; see
        :func:`rlfb.runs.score_value`), and a number second is the score
        (``retriever.feedback(run_id, 1.0)``), as the handler's ``record_feedback`` takes it;
        or give a ``signal`` (``"thumbs_up"``, ``"explicit_negative"``, ...), a
        ``rating`` (1-5) or a raw ``value`` in [-1, 1]. ``kwargs``: ``timestamp``, ``session_id``, ``user_id``,
        ``idempotency_key``. Returns the stored
        :class:`~rlfb.store.FeedbackRecord` of each retrieval the run id stands for.
        """
        if self.ensemble.store is None:
            raise NoStoreError()
        return record_run_feedback(
            self.ensemble.store, run_id, signal, ensemble=self.ensemble, score=score, score_scale=score_scale,
            value=value, rating=rating,
            chunk_id=chunk_id, comment=comment, key=key, **kwargs,
        )
