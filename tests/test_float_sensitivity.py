"""``benchmarks/float_sensitivity.py`` moves every dense encoding, of documents and queries, and no SPLADE one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from rlfb.retrievers.cache import open_side_caches, text_hash
from rlfb.retrievers.dense import DenseRetriever
from rlfb.retrievers.encoding import ModelEncoding
from rlfb.retrievers.splade import SpladeRetriever

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "float_sensitivity.py"


def test_dense_encodings_are_perturbed_splade_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # it patched rlfb.retrievers.dense.cached_encode, which the dense retriever stopped calling (ModelEncoding
    # encodes for it): every perturbed run died with an AttributeError
    spec = importlib.util.spec_from_file_location("float_sensitivity", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name in ("_cached_documents", "_cached_queries"):  # undone when the test ends
        monkeypatch.setattr(DenseRetriever, name, getattr(DenseRetriever, name))

    texts, query = ["first text", "second text"], "a question"
    docs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
    q = np.array([0.6, 0.8, 0.0], dtype=np.float32)
    dense = DenseRetriever(cache_dir=tmp_path, model_key="precomputed")  # no model: every vector is cached
    doc_cache, query_cache = open_side_caches(tmp_path, dense.cache_key)
    assert doc_cache is not None and query_cache is not None
    doc_cache.put_many({text_hash(t): v for t, v in zip(texts, docs, strict=True)})
    query_cache.put_many({text_hash(query): q})

    script.perturb_dense("s1", 1e-3)
    moved_docs, moved_q = dense.encode_documents(texts), dense.encode_queries([query])[0]
    np.testing.assert_array_equal(moved_docs, np.stack([script.perturbed(v, t, "s1", 1e-3)
                                                        for t, v in zip(texts, docs, strict=True)]))
    np.testing.assert_array_equal(moved_q, script.perturbed(q, query, "s1", 1e-3))
    assert not np.array_equal(moved_docs, docs) and np.allclose(moved_docs, docs, atol=1e-2)
    assert SpladeRetriever._cached_documents is ModelEncoding._cached_documents
    assert SpladeRetriever._cached_queries is ModelEncoding._cached_queries
