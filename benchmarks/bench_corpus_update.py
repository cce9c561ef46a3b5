"""Adding documents to a live index: rlfb's FeedbackEnsemble against LangChain's EnsembleRetriever.

Both start from the same synthetic corpus (BM25 + dense, the same precomputed
vectors, as in ``bench_retrieval.py``) and take one new document at a time:

* rlfb: ``FeedbackEnsemble.add_texts`` (each retriever builds an updated copy of itself:
  BM25 tokenizes only the new text and recomputes every weight from the term counts it
  kept, the dense index keeps its vectors and encodes the new text; searches go on meanwhile);
* LangChain: ``BM25Retriever`` (rank_bm25) has no way to add a document, so it is
  built again over all texts, and the ``InMemoryVectorStore`` takes ``add_texts``;
  the ``EnsembleRetriever`` is then made again over the two.

The two take turns on each new document, so that a change of the machine's load falls on both.

    python benchmarks/bench_corpus_update.py [--chunks 50000] [--updates 5]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_retrieval's helpers, the shared argument types

import numpy as np  # noqa: E402
from _bench_args import positive_int  # noqa: E402
from bench_retrieval import precomputed_embeddings, synthetic_corpus, unit  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=positive_int, default=50_000,
                    help="synthetic chunks indexed before the updates (default: %(default)s)")
    ap.add_argument("--updates", type=positive_int, default=5,
                    help="documents added one at a time; the median is printed (default: %(default)s)")
    args = ap.parse_args()

    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever as LCBM25
    from langchain_core.vectorstores import InMemoryVectorStore

    from rlfb import FeedbackEnsemble
    from rlfb.retrievers import BM25Retriever, DenseRetriever
    from rlfb.retrievers.cache import open_side_caches, text_hash
    from rlfb.types import make_chunks

    rng = np.random.default_rng(1)
    texts = synthetic_corpus(args.chunks + args.updates)
    base, new = texts[: args.chunks], texts[args.chunks:]
    vectors = unit(len(texts), 384, rng)
    cache_dir = Path(tempfile.mkdtemp(prefix="rlfb-bench-"))
    atexit.register(shutil.rmtree, cache_dir, True)
    print(f"{len(base):,} synthetic chunks, {len(new)} added one at a time; cache in {cache_dir}")

    # both sides get every vector precomputed: model time is out of the comparison
    dense = DenseRetriever(cache_dir=cache_dir, model_key="bench-precomputed")
    doc_cache, _ = open_side_caches(cache_dir, dense.cache_key)  # where it looks: the key is kind-prefixed
    assert doc_cache is not None
    doc_cache.put_many({text_hash(t): v for t, v in zip(texts, vectors, strict=True)})
    chunks = make_chunks(base, [f"c{i}" for i in range(len(base))])
    ours = FeedbackEnsemble.from_chunks(chunks, retrievers=[BM25Retriever(), dense], fusion="rrf")

    lookup = {t: v.tolist() for t, v in zip(texts, vectors, strict=True)}
    store = InMemoryVectorStore(precomputed_embeddings(lookup, lookup))
    store.add_texts(base, ids=[f"c{i}" for i in range(len(base))])
    current = list(base)
    rlfb_s, lc_s = [], []
    for i, text in enumerate(new):  # taking turns on each document
        t = time.perf_counter()
        ours.add_texts([text], ids=[f"new{i}"])
        rlfb_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        current.append(text)
        lc_bm25 = LCBM25.from_texts(current, k=10)
        store.add_texts([text], ids=[f"new{i}"])
        lc = EnsembleRetriever(retrievers=[lc_bm25, store.as_retriever(search_kwargs={"k": 10})],
                               weights=[0.5, 0.5])
        lc_s.append(time.perf_counter() - t)
    assert ours.retrievers["bm25"].search(new[-1], 1)[0][0] == f"new{len(new) - 1}"  # it is searchable
    assert lc_bm25.invoke(new[-1])[0].page_content == new[-1] and len(lc.retrievers) == 2

    ours_m, lc_m = statistics.median(rlfb_s) * 1000, statistics.median(lc_s) * 1000
    print("\nadding one document to BM25 + dense, median per update:")
    print(f"  LangChain EnsembleRetriever (BM25 rebuilt, vector store add)  {lc_m:8.1f} ms")
    print(f"  rlfb FeedbackEnsemble.add_texts (both updated)                {ours_m:8.1f} ms")
    print(f"  ratio                                                         {lc_m / ours_m:8.1f}x")


if __name__ == "__main__":
    main()
