"""Conversions between LlamaIndex nodes and rlfb chunks and hits; nothing else lives here."""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode

from rlfb._caller import warn_at_app
from rlfb.errors import EmptyCorpusError, ValidationError
from rlfb.types import Chunk, Hit, copy_metadata

__all__ = [
    "EVENT_ID_KEY",
    "METADATA_KEYS",
    "node_text",
    "node_to_chunk",
    "nodes_to_chunks",
    "corpus_nodes",
    "hit_to_node",
    "event_id_of",
]

#: Metadata key of the retrieval event id on every node the adapters return.
EVENT_ID_KEY = "event_id"
#: Metadata keys the adapters add to the nodes they return (kept out of the LLM's and the embedder's text):
#: the event id, the 1-based rank, each retriever's raw score (``None`` where it had none) and the
#: retrievers whose own top list held the chunk. They replace a node's own keys of the same names (with a
#: warning, once per set of keys), as ``langchain_rlfb.METADATA_KEYS`` override a Document's.
METADATA_KEYS = (EVENT_ID_KEY, "rank", "scores", "proposed_by")

_warned: set[tuple[str, ...]] = set()  # the sets of a node's own keys replaced that a warning named already
_warned_lock = threading.Lock()


def node_text(node: BaseNode) -> str:
    """The text rlfb scores: the node's content as LlamaIndex embeds it (``""`` for a node without text).

    ``MetadataMode.EMBED`` is what ``VectorStoreIndex`` and ``llama-index-retrievers-bm25`` index,
    so every retriever scores the same text. The adapters' own metadata keys are left out.
    """
    try:
        text = node.get_content(metadata_mode=MetadataMode.EMBED)
    except Exception:  # a node type whose content cannot be rendered (no text, an unresolvable image)
        return ""
    return text if isinstance(text, str) else ""


def node_to_chunk(node: BaseNode) -> Chunk:
    """A node as an rlfb chunk: its ``node_id``, :func:`node_text` and a copy of its metadata."""
    return Chunk(str(node.node_id), node_text(node), copy_metadata(node.metadata))


def nodes_to_chunks(nodes: Iterable[BaseNode]) -> list[Chunk]:
    """Chunks of ``nodes``, in order; a node id seen twice keeps its first node."""
    seen: set[str] = set()
    out = []
    for node in nodes:
        if not isinstance(node, BaseNode):
            raise ValidationError(f"expected LlamaIndex nodes, got {type(node).__name__}")
        chunk = node_to_chunk(node)
        if chunk.id not in seen:
            seen.add(chunk.id)
            out.append(chunk)
    return out


def corpus_nodes(
    index: Any = None, nodes: Sequence[BaseNode] | None = None, docstore: Any = None
) -> list[BaseNode]:
    """The nodes of exactly one of ``index`` (its docstore), ``nodes`` or ``docstore``.

    Mirrors ``BM25Retriever.from_defaults`` of ``llama-index-retrievers-bm25``.
    """
    sources = (("index", index), ("nodes", nodes), ("docstore", docstore))
    given = [name for name, v in sources if v is not None]
    if len(given) != 1:
        raise ValidationError(
            f"pass exactly one of index, nodes or docstore (got {', '.join(given) if given else 'none'})"
        )
    if index is not None:
        docstore = getattr(index, "docstore", None)
        if docstore is None:
            raise ValidationError(f"{type(index).__name__} has no docstore; pass nodes= instead")
    if docstore is not None:
        nodes = list(docstore.docs.values())
        if not nodes:
            raise EmptyCorpusError(
                "the docstore holds no nodes (a vector store that keeps the text itself leaves it empty); "
                "pass nodes= with the indexed nodes"
            )
    nodes = list(nodes or [])
    if not nodes:
        raise EmptyCorpusError("cannot index an empty corpus: no nodes given")
    return nodes


#: Below this many chunks learned, a store that knows none of a corpus's nodes is no sign of ids made anew
_LEARNED_ENOUGH = 20


def warn_if_ids_were_made_anew(nodes: Sequence[BaseNode], ensemble: Any) -> None:
    """Warn when every node has a random id (LlamaIndex's node parsers' default, a new one at each build of an
    index from its documents) and the store's learned state knows 20 chunks or more, none of them these:
    what rlfb learns about a node is kept by its id, so an app that builds its index anew at each start loses
    every chunk's confidence and memory at each start, silently (an audit, 2026-12-05). An index loaded from
    storage keeps its ids, and a store that knows some of them is no such case."""
    if not nodes or not all(_random_uuid(str(n.node_id)) for n in nodes):
        return
    confidence = ensemble.learner.confidence
    if len(confidence) < _LEARNED_ENOUGH or confidence.known([str(n.node_id) for n in nodes]) > 0:
        return
    warn_at_app(
        f"these {len(nodes)} nodes have random ids (the node parser's default) and the store has learned about "
        f"{len(confidence)} chunks, none of them these: what rlfb learns about a node is kept by its node id, so "
        "an index built again from its documents starts every chunk afresh. Give the node parser ids of your "
        "own (SentenceSplitter(id_func=lambda i, doc: f\"{doc.doc_id}-{i}\")), or load the persisted index",
        UserWarning,
    )


def _random_uuid(text: str) -> bool:
    """Whether ``text`` is a version-4 UUID in its 36-character form, as ``str(uuid.uuid4())`` writes it."""
    if len(text) != 36:
        return False
    try:
        return uuid.UUID(text).version == 4
    except ValueError:
        return False



def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def hit_to_node(hit: Hit, event_id: str | None, node: BaseNode | None = None) -> NodeWithScore:
    """A fused hit as a ``NodeWithScore`` with the fused score and :data:`METADATA_KEYS` in its metadata.

    ``node`` is the original node (copied, never changed); without one a ``TextNode`` is
    built from the hit. The added keys are excluded from the LLM's and the embedder's view.
    A node's own metadata under one of those keys is replaced in the copy (so also gone
    from the LLM's view); a warning names such keys, once per set of keys in the process.
    """
    extra = {
        EVENT_ID_KEY: event_id,
        "rank": hit.rank,
        "scores": {name: _finite(v) for name, v in hit.scores.items()},
        "proposed_by": list(hit.proposed_by),
    }
    if node is None:
        node = TextNode(id_=hit.chunk_id, text=hit.text, metadata=dict(hit.metadata))
    _warn_replaced(node)
    update = {
        "metadata": {**copy_metadata(node.metadata), **extra},  # the original node's lists stay its own
        "excluded_llm_metadata_keys": _with_keys(node.excluded_llm_metadata_keys),
        "excluded_embed_metadata_keys": _with_keys(node.excluded_embed_metadata_keys),
    }
    return NodeWithScore(node=node.model_copy(update=update), score=float(hit.score))


def _warn_replaced(node: BaseNode) -> None:
    """Say (once per set of keys) that the node's own metadata under :data:`METADATA_KEYS` is replaced.

    The keys are not renamed: users and the README read ``metadata["scores"]``. But a document's own ``rank``
    or ``scores`` used to vanish from the LLM's prompt without a word.
    """
    meta = node.metadata or {}
    own = tuple(k for k in METADATA_KEYS if k in meta)
    if not own:
        return
    if len(own) == len(METADATA_KEYS) and set(METADATA_KEYS) <= set(node.excluded_llm_metadata_keys or ()):
        return  # a node an adapter returned (re-ranked again): the keys are rlfb's already
    with _warned_lock:
        if own in _warned:
            return
        _warned.add(own)
    # past LlamaIndex and its dispatcher (stacklevel=3 named the adapter's module)
    warn_at_app(
        f"the metadata keys {list(own)} of node {node.node_id!r} (and of any node that has them) are replaced by "
        f"rlfb's own on the nodes it returns ({', '.join(METADATA_KEYS)}), which the LLM and the embedder do not "
        "see: rename those keys to keep their values in the prompt",
    )


def _with_keys(keys: Sequence[str] | None) -> list[str]:
    keys = list(keys or [])
    return keys + [k for k in METADATA_KEYS if k not in keys]


def event_id_of(nodes: Sequence[NodeWithScore]) -> str | None:
    """The one rlfb event id every node carries (nodes an adapter returned), else ``None``."""
    ids = {(n.node.metadata or {}).get(EVENT_ID_KEY) for n in nodes}
    if len(ids) != 1:
        return None
    (eid,) = ids
    return eid if isinstance(eid, str) and eid else None
