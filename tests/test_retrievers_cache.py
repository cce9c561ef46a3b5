"""The embedding cache is keyed by what a model is, never hands one model's vectors to another, and takes any str."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from rlfb.errors import ValidationError
from rlfb.retrievers.base import top_k
from rlfb.retrievers.cache import text_hash
from rlfb.retrievers.models import LazyModel, model_fingerprint


def _model_folder(root, weights: bytes):
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(weights)
    return root


def test_model_folders_are_keyed_by_their_contents(tmp_path) -> None:
    weights = np.random.default_rng(0).bytes(3 << 20)  # above the old 1 MiB size-only threshold
    base = _model_folder(tmp_path / "base", weights)
    moved = tmp_path / "elsewhere" / "base"
    shutil.copytree(base, moved)
    tuned = _model_folder(tmp_path / "tuned", weights[:-1] + bytes([weights[-1] ^ 1]))  # same size, one bit
    assert model_fingerprint(str(base)) == model_fingerprint(str(moved))  # one model, two places: one cache
    assert model_fingerprint(str(tuned)) != model_fingerprint(str(base))
    # a file rewritten in place gets hashed again
    (moved / "model.safetensors").write_bytes(weights[::-1])
    os.utime(moved / "model.safetensors", ns=(1, 1))
    assert model_fingerprint(str(moved)) != model_fingerprint(str(base))


def test_a_model_handed_over_loaded_is_not_cached_on_disk_unless_named(tmp_path) -> None:
    folder = _model_folder(tmp_path / "m", b"weights")

    class Loaded:  # stands for a SentenceTransformer whose settings or weights may have been changed
        model_card_data = type("Card", (), {"base_model": str(folder)})()

    def loader(name, device=None):
        return Loaded()

    by_path = LazyModel(str(folder), kind="dense", loader=loader, default=lambda: str(folder))
    assert by_path.key is not None and by_path.key.startswith("dense:dir:")
    by_path.get()
    assert by_path.key is not None  # loading a named model does not change its key
    handed = LazyModel(Loaded(), kind="dense", loader=loader, default=lambda: str(folder))
    assert handed.name == str(folder) and handed.key is None
    named = LazyModel(Loaded(), kind="dense", loader=loader, default=lambda: str(folder), key="my-tuned-v2")
    assert named.key == "dense:my-tuned-v2"  # under its kind, so a SPLADE model of that name is another key
    assert LazyModel(Loaded(), kind="splade", loader=loader, default=lambda: str(folder), key="my-tuned-v2").key \
        == "splade:my-tuned-v2"
    assert LazyModel(Loaded(), kind="dense", loader=loader, default=lambda: str(folder),
                     key=named.key).key == named.key  # a key read back from a save is not prefixed twice


def test_any_str_can_be_hashed_and_nan_scores_rank_last() -> None:
    assert text_hash("caf\udce9") != text_hash("café")  # a lone surrogate hashes instead of raising
    assert top_k(np.array([0.1, np.nan, 0.5, 0.3]), 2).tolist() == [2, 3]
    assert top_k(np.array([np.nan, np.nan, 0.5]), 3).tolist() == [2, 0, 1]


def test_vectors_put_under_cache_key_are_the_ones_used(tmp_path) -> None:
    # what benchmarks do to keep model time out of a comparison: precompute, put under the retriever's key, index
    from rlfb.retrievers.cache import open_side_caches
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.types import make_chunks

    texts, query = ["first text", "second text"], "a question"
    docs = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
    dense = DenseRetriever(cache_dir=tmp_path, model_key="precomputed")
    assert dense.cache_key == "dense:precomputed"
    doc_cache, query_cache = open_side_caches(tmp_path, dense.cache_key)
    assert doc_cache is not None and query_cache is not None
    doc_cache.put_many({text_hash(t): v for t, v in zip(texts, docs, strict=True)})
    query_cache.put_many({text_hash(query): np.array([0.6, 0.8, 0.0], dtype=np.float32)})
    dense.index(make_chunks(texts, ["a", "b"]))
    np.testing.assert_allclose(dense.score_all(query), [0.6, 0.8], rtol=1e-6)  # no model was asked


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_cache_dir_is_refused_not_the_working_directory(tmp_path, monkeypatch, blank: str) -> None:
    """Path("") is ".": cache_dir="" wrote embeddings.sqlite into the working directory without a word."""
    from rlfb.retrievers.cache import EmbeddingCache, cache_stats, cached_encode, open_side_caches
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.retrievers.splade import SpladeRetriever

    monkeypatch.chdir(tmp_path)
    for make in (lambda: DenseRetriever(cache_dir=blank), lambda: SpladeRetriever(cache_dir=blank),
                 lambda: EmbeddingCache(blank, "m"), lambda: open_side_caches(blank, "m"),
                 lambda: cache_stats(blank)):
        with pytest.raises(ValidationError, match="cache_dir must name a folder"):
            make()
    cached_encode(["a"], lambda b: [np.ones(2, dtype=np.float32) for _ in b],
                  disk=EmbeddingCache(tmp_path / "c", "m"))  # a named folder still works
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


# -- found by a mutation review of the retrievers and the cache (2026-12-07): each fails with the bug it names ------
def test_texts_that_differ_only_in_spacing_or_case_are_cached_apart() -> None:
    # a hash of the stripped text gave "solar wind" and "solar wind " one cached embedding, which a model that
    # reads the spacing (most tokenizers drop it; not all) encodes apart
    assert len({text_hash(t) for t in ("solar wind", "solar wind ", " solar wind", "Solar wind")}) == 4


def test_a_models_query_and_document_encodings_are_cached_apart(tmp_path) -> None:
    # a query looked up among the cached documents was served the document's encoding: invisible with a model
    # that encodes both sides alike (the bundled ones), wrong with one that prompts queries (e5, bge)
    from rlfb.retrievers.cache import cache_stats
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.types import make_chunks

    class Prompted:  # documents along one axis, queries along the other
        def encode_document(self, texts: list[str], **_: object) -> np.ndarray:
            return np.array([[1.0, 0.0]] * len(texts), dtype=np.float32)

        def encode_query(self, texts: list[str], **_: object) -> np.ndarray:
            return np.array([[0.0, 1.0]] * len(texts), dtype=np.float32)

    chunks = make_chunks(["solar wind"], ids=["a"])
    for _ in range(2):  # encoded, then read back from the cache
        retriever = DenseRetriever(Prompted(), cache_dir=tmp_path, model_key="prompted").index(chunks)
        assert retriever.score_all("solar wind").tolist() == [0.0]
    keys = {m["model_key"] for m in cache_stats(tmp_path)["models"]}
    assert keys == {"dense:prompted|document", "dense:prompted|query"}


def test_a_model_that_ignores_normalize_embeddings_still_gives_cosines(tmp_path) -> None:
    # a model wrapper whose encode takes no notice of normalize_embeddings=True gave "cosines" of 25.0, and the
    # save of its index could not be loaded again ("not unit vectors")
    from rlfb.retrievers.dense import DenseRetriever
    from rlfb.types import make_chunks

    class Raw:
        def encode(self, texts: list[str], **_: object) -> np.ndarray:
            return np.array([[3.0, 4.0] if t == "a" else [0.0, 2.0] for t in texts], dtype=np.float32)

    retriever = DenseRetriever(Raw(), cache_dir=False).index(make_chunks(["a", "b"], ids=["a", "b"]))
    np.testing.assert_allclose(np.linalg.norm(retriever.embeddings, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(retriever.score_all("a"), [1.0, 0.8], rtol=1e-6)
    retriever.save(tmp_path / "ix")
    np.testing.assert_allclose(DenseRetriever.load(tmp_path / "ix", model=Raw()).score_all("a"), [1.0, 0.8], rtol=1e-6)
