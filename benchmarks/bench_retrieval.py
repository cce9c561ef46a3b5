"""Retrieval latency at 50,000 chunks: rlfb's FeedbackEnsemble against LangChain's EnsembleRetriever.

Both sides get the same precomputed document embeddings and the same cached
query embedding, so model time is out of the comparison. Both return the top 10; rlfb fuses each of its
retrievers' 100 best (its default ``candidate_k``) where each LangChain retriever gives its 10, so rlfb does
more work per query than its peer:

* rlfb: ``FeedbackEnsemble`` over ``BM25Retriever`` (bm25s) and ``DenseRetriever``
  (a numpy matrix product and ``argpartition``), weighted RRF;
* LangChain: ``EnsembleRetriever`` over ``BM25Retriever`` (rank_bm25) and an
  ``InMemoryVectorStore`` retriever, weighted RRF: what a LangChain app builds;
* LangChain with rlfb's vector search: the same ``EnsembleRetriever`` with the vector
  store replaced by a retriever doing what rlfb's dense one does (a numpy matrix
  product and ``argpartition``), so that the ratio is the rest of the stack's.
  ``InMemoryVectorStore`` turns every stored vector from a Python list into an array
  at each query, which is most of the first ratio: each part's time alone is printed.

Then the full three-retriever ensemble (with SPLADE) end to end, with the
time spent encoding the query by the real models shown separately, and the
fusion layer's own cost per query at 100 candidates per retriever.

Document vectors are random (dense) and random sparse (SPLADE), cached the way
the retrievers cache real encodings; encoding 50,000 documents would take the
better part of an hour on 2 cores and says nothing about retrieval speed.

    python benchmarks/bench_retrieval.py [--chunks 50000] [--queries 50] [--lc-queries 15]
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from langchain_core.retrievers import BaseRetriever

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import int_at_least, plural, positive_int  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def synthetic_corpus(n: int, seed: int = 0, vocab: int = 30_000, length: int = 60) -> list[str]:
    """Zipf-distributed words, so that BM25 sees realistic term statistics."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(vocab)])
    ranks = np.minimum(rng.zipf(1.2, size=(n, length)), vocab) - 1
    return [" ".join(words[row]) for row in ranks]


def unit(rows: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def precomputed_embeddings(documents: dict[str, list[float]], queries: dict[str, list[float]]):  # noqa: ANN201
    """A LangChain ``Embeddings`` that looks the vectors up: both sides get the same vectors, model time is out."""
    from langchain_core.embeddings import Embeddings

    class Precomputed(Embeddings):
        def embed_documents(self, docs: list[str]) -> list[list[float]]:
            return [documents[d] for d in docs]

        def embed_query(self, text: str) -> list[float]:
            return queries[text]

    return Precomputed()


def numpy_dense_retriever(texts: list[str], ids: list[str], vectors: np.ndarray, queries: dict[str, np.ndarray],
                          k: int = 10) -> BaseRetriever:
    """A LangChain retriever searching ``vectors`` as rlfb's dense retriever does: one matrix product, then
    ``argpartition`` and a sort of the top ``k`` (the query's vector looked up, as both sides' are)."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    class NumpyDense(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                    ) -> list[Document]:
            scores = vectors @ queries[query]
            top = np.argpartition(-scores, k)[:k]
            top = top[np.argsort(-scores[top])]
            return [Document(page_content=texts[i], id=ids[i], metadata={"score": float(scores[i])}) for i in top]

    return NumpyDense()


def interleaved_ms(fns: dict[str, Callable[[Any], object]], items: list) -> dict[str, float]:
    """The median ms of each of ``fns`` over ``items``, the functions taking turns on each item: a change of
    the machine's load falls on all of them, where timing one after another compared other moments."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for item in items:
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(item)
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(ts) for name, ts in times.items()}


def times(ratio: float) -> str:
    """A ratio as printed: whole numbers, one decimal below 10 (a small run's 0.4 was printed as 0).

    >>> times(88.6), times(8.24)
    ('89', '8.2')
    """
    return f"{ratio:.0f}" if ratio >= 10 else f"{ratio:.1f}"


def median_ms(fn: Callable[[Any], object], items: Iterable) -> float:
    """The median ms of ``fn`` over ``items``."""
    return interleaved_ms({"fn": fn}, list(items))["fn"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # more than the 10 retrieved: the numpy search's argpartition needs an 11th
    ap.add_argument("--chunks", type=int_at_least(11), default=50_000,
                    help="synthetic chunks indexed, at least 11 (default: %(default)s)")
    ap.add_argument("--queries", type=positive_int, default=50,
                    help="queries; the end-to-end SPLADE part times all but the first, so at least 2 with it "
                         "(default: %(default)s)")
    ap.add_argument("--lc-queries", type=positive_int, default=15,
                    help="LangChain is slow: the first N queries are timed on both sides (default: %(default)s)")
    ap.add_argument("--no-splade", action="store_true",
                    help="skip the end-to-end part with SPLADE and the real query encoders")
    args = ap.parse_args()
    if not args.no_splade and args.queries < 2:
        ap.error("--queries must be at least 2 unless --no-splade: the first warms the query encoders up")

    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever as LCBM25
    from langchain_core.vectorstores import InMemoryVectorStore

    from rlfb import FeedbackEnsemble
    from rlfb.retrievers import BM25Retriever, DenseRetriever, SpladeRetriever
    from rlfb.retrievers.cache import SparseVector, open_side_caches, text_hash
    from rlfb.types import make_chunks

    rng = np.random.default_rng(1)
    texts = synthetic_corpus(args.chunks)
    ids = [f"c{i}" for i in range(len(texts))]
    chunks = make_chunks(texts, ids)
    qrng = random.Random(2)
    queries = [" ".join(qrng.choice(texts[qrng.randrange(len(texts))].split()) for _ in range(5))
               for _ in range(args.queries)]
    doc_vecs = unit(len(texts), 384, rng)
    query_vecs = unit(len(queries), 384, rng)
    cache_dir = Path(tempfile.mkdtemp(prefix="rlfb-bench-"))
    atexit.register(shutil.rmtree, cache_dir, True)  # hundreds of MB of vectors: gone when the run ends
    print(f"{len(texts):,} synthetic chunks, {plural(len(queries), 'query', 'queries')}; cache in {cache_dir}")

    # ---- rlfb: the same precomputed vectors, put where DenseRetriever looks for them
    dense = DenseRetriever(cache_dir=cache_dir, model_key="bench-precomputed")
    doc_cache, query_cache = open_side_caches(cache_dir, dense.cache_key)  # the key is kind-prefixed
    assert doc_cache is not None and query_cache is not None  # a cache folder and a model key: caching is on
    doc_cache.put_many({text_hash(t): v for t, v in zip(texts, doc_vecs, strict=True)})
    query_cache.put_many({text_hash(q): v for q, v in zip(queries, query_vecs, strict=True)})
    t = time.perf_counter()
    bm25 = BM25Retriever().index(chunks)
    dense.index(chunks)
    ours = FeedbackEnsemble({"bm25": bm25, "dense": dense}, chunks, fusion="rrf")
    print(f"rlfb index (BM25 + cached vectors): {time.perf_counter() - t:.1f}s")
    for q in queries:  # warm-up: every query embedding in memory, as LangChain's lookup table has them
        ours.retrieve(q, k=10, log=False)
    # exploration runs only where feedback can reach the list, so the serving path: logged to a store
    served = FeedbackEnsemble({"bm25": bm25, "dense": dense}, chunks, fusion="rrf", store=cache_dir / "fb.db")

    # ---- LangChain: EnsembleRetriever over rank_bm25 and an InMemoryVectorStore, same vectors
    lookup = {t: v.tolist() for t, v in zip(texts, doc_vecs, strict=True)}
    qlookup = {q: v.tolist() for q, v in zip(queries, query_vecs, strict=True)}

    t = time.perf_counter()
    lc_bm25 = LCBM25.from_texts(texts, k=10)
    store = InMemoryVectorStore(precomputed_embeddings(lookup, qlookup))
    store.add_texts(texts, ids=ids)
    lc = EnsembleRetriever(retrievers=[lc_bm25, store.as_retriever(search_kwargs={"k": 10})], weights=[0.5, 0.5])
    print(f"LangChain index: {time.perf_counter() - t:.1f}s")
    # the same ensemble with rlfb's kind of vector search, and each of LangChain's parts alone, taking turns
    vs = store.as_retriever(search_kwargs={"k": 10})
    np_dense = numpy_dense_retriever(texts, ids, doc_vecs, dict(zip(queries, query_vecs, strict=True)))
    lc_np = EnsembleRetriever(retrievers=[lc_bm25, np_dense], weights=[0.5, 0.5])
    lc_np.invoke(queries[0])
    lc.invoke(queries[0])
    served.retrieve(queries[0], k=10)
    # both sides on the same queries (LangChain's are slow, so the first lc_queries), taking turns on each: rlfb
    # doing the same job as LangChain's (a deterministic fused ranking; exploration is timed apart, beside them)
    timings = interleaved_ms({"ensemble": lc.invoke, "numpy ensemble": lc_np.invoke,
                              "rlfb": lambda q: ours.retrieve(q, k=10, log=False, explore=False),
                              "rlfb served": lambda q: served.retrieve(q, k=10),
                              "rank_bm25 BM25Retriever": lc_bm25.invoke, "InMemoryVectorStore retriever": vs.invoke,
                              "numpy dense retriever (as rlfb's)": np_dense.invoke}, queries[: args.lc_queries])
    served.close()
    lc_ms, lc_np_ms = timings.pop("ensemble"), timings.pop("numpy ensemble")
    rlfb_ms, explore_ms = timings.pop("rlfb"), timings.pop("rlfb served")
    parts = timings
    print("\nBM25 + dense, median per query (same vectors, cached query embedding):")
    print(f"  LangChain EnsembleRetriever  {lc_ms:10.1f} ms  (rank_bm25 + InMemoryVectorStore, as an app builds it)")
    print(f"  the same, numpy vector search{lc_np_ms:10.1f} ms  (rank_bm25 + a retriever searching as rlfb's does)")
    print(f"  rlfb FeedbackEnsemble        {rlfb_ms:10.2f} ms")
    print(f"  ratio                        {times(lc_ms / rlfb_ms):>10}x faster than the first, "
          f"{times(lc_np_ms / rlfb_ms)}x than the second")
    print("  LangChain's parts alone: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in parts.items()))
    print(f"  rlfb serving: explored, logged {explore_ms:8.2f} ms (Thompson-sampled chunk exploration, event written "
          "to a store)")

    # ---- the fusion layer's own cost at 100 candidates per retriever: the context's normalisation (and the
    # question's features and type) made again each time from the retrievers' raw scores, then the decision
    ctx = ours.context(queries[0], k=10)
    ranks = ctx.ranks
    assert ranks is not None  # the ensemble's contexts carry each retriever's ranks

    def fuse(_: object) -> None:
        made = ours._make_context(ctx.query, ctx.candidate_ids, ctx.raw, ranks, None, ctx.proposed)
        ours.rank_context(made, 10, log=False)  # greedy: not logged

    fusion_ms = median_ms(fuse, range(200))
    print(f"\nfusion layer (normalise, decide, fuse, rank; {len(ctx.candidate_ids)} candidates): "
          f"{fusion_ms:.3f} ms per query")

    if args.no_splade:
        return
    # ---- three retrievers end to end: the real models encode each query
    real_dense = DenseRetriever(cache_dir=cache_dir)
    splade = SpladeRetriever(cache_dir=cache_dir)
    d_cache, _ = open_side_caches(cache_dir, real_dense._model.key)
    assert d_cache is not None
    d_cache.put_many({text_hash(t): v for t, v in zip(texts, doc_vecs, strict=True)})
    s_cache, _ = open_side_caches(cache_dir, splade._model.key)
    assert s_cache is not None
    dim = 30_522
    sparse = {}
    for t_ in texts:  # about as many active terms as splade-tiny gives a short passage
        idx = np.unique(rng.integers(0, dim, size=120)).astype(np.int32)
        sparse[text_hash(t_)] = SparseVector(idx, rng.random(idx.size, dtype=np.float32), dim)
    s_cache.put_many(sparse)
    three = FeedbackEnsemble.from_chunks(chunks, retrievers=[BM25Retriever(), real_dense, splade])
    fresh = [f"{q} {i}" for i, q in enumerate(queries)]  # not cached: the models run
    three.retrieve(fresh[0], k=10, log=False)
    enc, ret = [], []
    for q in fresh[1:]:
        t = time.perf_counter()
        real_dense.encode_queries([q])
        splade.encode_queries([q])
        enc.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        three.retrieve(q, k=10, log=False)
        ret.append((time.perf_counter() - t) * 1000)
    e, r = statistics.median(enc), statistics.median(ret)
    print("\nBM25 + dense + SPLADE end to end, median per query:")
    print(f"  query encoding (MiniLM + splade-tiny)  {e:8.1f} ms")
    print(f"  retrieval and fusion                   {r:8.1f} ms")
    print(f"  total                                  {e + r:8.1f} ms")


if __name__ == "__main__":
    main()
