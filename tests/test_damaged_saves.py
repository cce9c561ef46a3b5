"""Damaged saves raise CorruptStateError naming the file, or, in the embedding cache, count as a miss.

A saved dense or SPLADE index, a weights file and a cache row: each case below raised a raw error
(ValueError, zipfile.BadZipFile, RecursionError), blamed the caller (ValidationError) or loaded
silently (a NaN vector: its chunk then scored None) before.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _damage import unchecked, zip_method

from rlfb.cli import main
from rlfb.errors import CorruptStateError, InvalidWeightsError
from rlfb.retrievers import load_retriever
from rlfb.retrievers.base import Retriever
from rlfb.retrievers.cache import EmbeddingCache, SparseVector, cached_encode, text_hash
from rlfb.retrievers.dense import DenseRetriever
from rlfb.retrievers.splade import SpladeRetriever
from rlfb.store import FeedbackStore
from rlfb.types import make_chunks
from rlfb.weight_config import import_weights

TEXTS = [
    "The aurora is caused by charged particles from the sun hitting the atmosphere.",
    "Tides are caused by the gravity of the moon.",
    "Volcanoes erupt when magma rises through the crust.",
]
IDS = ["aurora", "tides", "volcano"]
DEEP = "[" * 100_000 + "]" * 100_000  # json gives up on it with a RecursionError


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """Intact dense and SPLADE indexes of TEXTS, under ``dense`` and ``splade``: copy before damaging."""
    root = tmp_path_factory.mktemp("saved")
    chunks = make_chunks(TEXTS, ids=IDS)
    DenseRetriever(cache_dir=cache_dir).index(chunks).save(root / "dense")
    SpladeRetriever(cache_dir=cache_dir).index(chunks).save(root / "splade")
    return root


# -- mutations of a saved folder ----------------------------------------------------------------------
Mutation = Callable[[Path], None]


def _meta(key: str, value: object) -> Mutation:
    def mutate(root: Path) -> None:
        meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        meta[key] = value
        (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")

    return mutate


def _metas(**values: Any) -> Mutation:
    def mutate(root: Path) -> None:
        meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        (root / "meta.json").write_text(json.dumps({**meta, **values}), encoding="utf-8")

    return mutate


def _write(name: str, content: str | bytes) -> Mutation:
    def mutate(root: Path) -> None:
        file = root / name
        file.write_bytes(content) if isinstance(content, bytes) else file.write_text(content, encoding="utf-8")

    return mutate


def _cut(name: str, keep: float) -> Mutation:
    def mutate(root: Path) -> None:
        data = (root / name).read_bytes()
        (root / name).write_bytes(data[: int(len(data) * keep)])

    return mutate


def _embeddings(change: Callable[[np.ndarray], np.ndarray]) -> Mutation:
    def mutate(root: Path) -> None:
        file = root / "embeddings.npy"
        np.save(file, change(np.load(file)))

    return mutate


def _put(index: tuple[int | slice, ...] | slice, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[index] = value
        return a

    return change


def _matrix(change: Callable[[dict[str, np.ndarray]], None]) -> Mutation:
    """Edit the arrays scipy's ``save_npz`` wrote (data, indices, indptr, shape, format)."""

    def mutate(root: Path) -> None:
        file = root / "doc_matrix.npz"
        with np.load(file) as npz:
            arrays = dict(npz)
        change(arrays)
        np.savez(file, **arrays)

    return mutate


def _set(name: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda arrays: arrays.__setitem__(name, change(arrays[name]))


def _falling_pointers(indptr: np.ndarray) -> np.ndarray:
    """From 0 to the number of weights still, but falling in between: rows that overlap."""
    out = indptr.copy()
    out[1], out[2] = out[2], out[1]
    return out


# (kind, mutation, the file the error must name)
def _npy_header(shape: tuple[int, ...]) -> bytes:
    """A version-1 ``.npy`` file of float64 claiming ``shape``, with no data."""
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (118 - len(header) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64


HUGE_NPY = _npy_header((10**11, 2))

DAMAGE: dict[str, tuple[str, Mutation, str]] = {
    # dense: non-finite vectors loaded silently, and their chunks scored None
    "dense embedding NaN": ("dense", _embeddings(_put((0, 0), np.nan)), "embeddings.npy"),
    "dense embedding row inf": ("dense", _embeddings(_put((2, slice(None)), np.inf)), "embeddings.npy"),
    # dense: raw ValueError, or a settings error that blamed the caller
    "dense embeddings strings": ("dense", _embeddings(lambda a: a.astype(str)), "embeddings.npy"),
    "dense embeddings integers": ("dense", _embeddings(lambda a: (a * 100).astype(np.int64)), "embeddings.npy"),
    "dense embeddings truncated": ("dense", _cut("embeddings.npy", 0.5), "embeddings.npy"),
    # numpy's own message advised loading it with allow_pickle=True, which runs the file's code
    "dense embeddings of Python objects": ("dense", _embeddings(lambda a: a.astype(object)), "embeddings.npy"),
    "dense batch_size garbage": ("dense", _meta("batch_size", "x"), "meta.json"),
    "dense batch_size negative": ("dense", _meta("batch_size", -1), "meta.json"),
    "dense batch_size fraction": ("dense", _meta("batch_size", 2.5), "meta.json"),
    "dense format_version unknown": ("dense", _meta("format_version", 99), "meta.json"),
    "dense dim disagrees": ("dense", _meta("dim", 17), "meta.json"),
    "dense meta nested too deep": ("dense", _write("meta.json", DEEP), "meta.json"),
    # a header whose shape is beyond memory: numpy's MemoryError escaped
    "dense embeddings header beyond memory": ("dense", _write("embeddings.npy", HUGE_NPY), "embeddings.npy"),
    "dense chunks nested too deep": ("dense", _write("chunks.jsonl", DEEP + "\n"), "chunks.jsonl"),
    # SPLADE: non-finite weights loaded silently
    "splade weight NaN": ("splade", _matrix(_set("data", lambda d: d * np.nan)), "doc_matrix.npz"),
    "splade weight inf": ("splade", _matrix(_set("data", lambda d: np.where(d > 0, np.inf, d))), "doc_matrix.npz"),
    # SPLADE: zipfile.BadZipFile, or a structure scipy takes without a word
    "splade matrix not a zip": ("splade", _write("doc_matrix.npz", b"PK\x03\x04junk"), "doc_matrix.npz"),
    "splade matrix truncated": ("splade", _cut("doc_matrix.npz", 0.5), "doc_matrix.npz"),
    "splade term id beyond vocabulary": ("splade", _matrix(_set("indices", lambda i: i + 10**6)), "doc_matrix.npz"),
    "splade term id negative": ("splade", _matrix(_set("indices", lambda i: i - 10**6)), "doc_matrix.npz"),
    "splade row pointers falling": ("splade", _matrix(_set("indptr", _falling_pointers)), "doc_matrix.npz"),
    "splade weights integers": ("splade", _matrix(_set("data", lambda d: (d * 100).astype(np.int64))),
                                "doc_matrix.npz"),
    "splade batch_size garbage": ("splade", _meta("batch_size", "x"), "meta.json"),
    "splade max_active_dims garbage": ("splade", _meta("max_active_dims", "x"), "meta.json"),
    "splade max_active_dims zero": ("splade", _meta("max_active_dims", 0), "meta.json"),
    "splade format_version unknown": ("splade", _meta("format_version", "1"), "meta.json"),
    "splade vocab_size disagrees": ("splade", _meta("vocab_size", 7), "meta.json"),
    "splade meta nested too deep": ("splade", _write("meta.json", DEEP), "meta.json"),
    # a bare NotImplementedError ("That compression method is not supported") escaped
    "splade matrix of an unknown compression method": ("splade", zip_method("doc_matrix.npz", 99),
                                                       "doc_matrix.npz"),
    # taken for a model handed over already loaded: the load went through and the first query raised
    # AttributeError: 'int' object has no attribute 'encode'
    "dense model not a name": ("dense", _metas(model=5, default_model=False), "meta.json"),
    "splade model a list": ("splade", _metas(model=["x"], default_model=False), "meta.json"),
    "dense default_model not a bool": ("dense", _meta("default_model", "yes"), "meta.json"),
}
LOADERS: dict[str, Callable[..., Retriever]] = {"dense": DenseRetriever.load, "splade": SpladeRetriever.load}


@pytest.mark.parametrize("checks", ["checksums", "content alone"])
@pytest.mark.parametrize("case", DAMAGE)
@pytest.mark.parametrize("via", ["class", "load_retriever"])
def test_damaged_index_raises_corrupt_state_naming_the_file(
    saved: Path, cache_dir: Path, tmp_path: Path, case: str, via: str, checks: str
) -> None:
    # "content alone": without checksums.json (a save from before the checksums, or edited on purpose), which
    # names any changed file first and so kept the checks of the content itself out of this test
    kind, mutate, named = DAMAGE[case]
    folder = tmp_path / kind
    shutil.copytree(saved / kind, folder)
    mutate(folder if checks == "checksums" else unchecked(folder))
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    load = LOADERS[kind] if via == "class" else load_retriever
    with pytest.raises(CorruptStateError, match=re.escape(named)) as info:
        load(folder, cache_dir=cache_dir)
    assert str(folder) in str(info.value)
    assert before == {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}  # loading wrote nothing


def test_a_pickled_array_is_named_damage_without_advice_to_unpickle_it(
    saved: Path, cache_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "dense"
    shutil.copytree(saved / "dense", folder)
    _embeddings(lambda a: a.astype(object))(folder)
    with pytest.raises(CorruptStateError, match="never unpickles") as info:
        DenseRetriever.load(folder, cache_dir=cache_dir)
    assert "allow_pickle" not in str(info.value)


@pytest.mark.parametrize("kind", ["dense", "splade"])
def test_intact_index_still_loads_and_scores_every_chunk(saved: Path, cache_dir: Path, kind: str) -> None:
    loaded = LOADERS[kind](saved / kind, cache_dir=cache_dir)
    scores = loaded.score_all("what causes the aurora")
    assert np.isfinite(scores).all()
    assert loaded.search("what causes the aurora", k=1)[0][0] == "aurora"


def test_saved_max_active_dims_null_still_loads(saved: Path, cache_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "splade"
    shutil.copytree(saved / "splade", folder)
    _meta("max_active_dims", None)(unchecked(folder))  # as a save from before max_active_dims was written
    assert SpladeRetriever.load(folder, cache_dir=cache_dir).max_active_dims is None
    _meta("max_active_dims", 16)(folder)
    with pytest.warns(RuntimeWarning, match="another model"):  # its vectors were not cut to 16: encoded again
        assert SpladeRetriever.load(folder, cache_dir=cache_dir).max_active_dims == 16


@pytest.mark.parametrize("kind", [["bm25"], {"bm25": 1}, 7])
def test_a_kind_that_is_not_a_name_is_corrupt_state(tmp_path: Path, kind: object) -> None:
    # a list or dict there was a bare TypeError (unhashable) from the kind lookup
    (tmp_path / "meta.json").write_text(json.dumps({"kind": kind}), encoding="utf-8")
    with pytest.raises(CorruptStateError, match="names retriever kind"):
        load_retriever(tmp_path)


def test_deeply_nested_meta_is_corrupt_state_in_the_kind_lookup(tmp_path: Path) -> None:
    """``load_retriever`` reads the kind before any class does: that read must translate the error too."""
    (tmp_path / "meta.json").write_text("{\"kind\": " + DEEP + "}", encoding="utf-8")
    with pytest.raises(CorruptStateError, match=re.escape(str(tmp_path / "meta.json"))):
        load_retriever(tmp_path)


# -- the embedding cache: a damaged row is a miss -------------------------------------------------------
def _damage_rows(directory: Path, sql: str, params: tuple = ()) -> int:
    conn = sqlite3.connect(directory / "embeddings.sqlite")
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


BOTH = frozenset({"dense", "sparse"})
# (SQL, its parameters, the rows it damages)
ROW_DAMAGE: dict[str, tuple[str, tuple, frozenset[str]]] = {
    # np.frombuffer raised ValueError on these before the "damaged row" check was reached
    "dense blob cut to 5 bytes": ("UPDATE encodings SET vals = substr(vals, 1, 5) WHERE indices IS NULL", (),
                                  frozenset({"dense"})),
    "sparse values cut to 5 bytes": ("UPDATE encodings SET vals = substr(vals, 1, 5) WHERE indices IS NOT NULL", (),
                                     frozenset({"sparse"})),
    "sparse ids cut to 6 bytes": ("UPDATE encodings SET indices = substr(indices, 1, 6)", (), frozenset({"sparse"})),
    # whole floats, and of unit norm, but one fewer than the row's dimension (a mutation review, 2026-12-07: read
    # as it was, it failed the index with "embeddings of different sizes", as if two models shared the cache)
    "dense row one value short": ("UPDATE encodings SET vals = ? WHERE indices IS NULL",
                                  (np.array([0.6, 0.8], np.float32).tobytes(),), frozenset({"dense"})),
    # SQLite's loose types: a blob read back as text (TypeError), a dimension as text (int('x'))
    "blob stored as text": ("UPDATE encodings SET vals = 'abcd'", (), BOTH),
    "dim stored as text": ("UPDATE encodings SET dim = 'x'", (), BOTH),
    # these were accepted: NaN or infinite scores, or ids that do not pair up with the values
    "dense NaN": ("UPDATE encodings SET vals = ? WHERE indices IS NULL", (np.full(3, np.nan, np.float32).tobytes(),),
                  frozenset({"dense"})),
    "sparse inf": ("UPDATE encodings SET vals = ? WHERE indices IS NOT NULL",
                   (np.full(2, np.inf, np.float32).tobytes(),), frozenset({"sparse"})),
    "sparse term id beyond dim": ("UPDATE encodings SET indices = ? WHERE indices IS NOT NULL",
                                  (np.array([1, 99], np.int32).tobytes(),), frozenset({"sparse"})),
    "sparse fewer ids than values": ("UPDATE encodings SET indices = ? WHERE indices IS NOT NULL",
                                     (np.array([1], np.int32).tobytes(),), frozenset({"sparse"})),
}


@pytest.mark.parametrize("case", ROW_DAMAGE)
def test_damaged_cache_row_is_a_miss_and_is_rewritten(tmp_path: Path, case: str) -> None:
    dense = np.array([0.5, 1.0, 2.0], dtype=np.float32)
    sparse = SparseVector(np.array([1, 4], dtype=np.int32), np.array([0.25, 3.0], dtype=np.float32), 10)
    keys = {"dense": text_hash("dense text"), "sparse": text_hash("sparse text")}
    cache = EmbeddingCache(tmp_path, "toy")
    cache.put_many({keys["dense"]: dense, keys["sparse"]: sparse})
    sql, params, damaged = ROW_DAMAGE[case]
    assert _damage_rows(tmp_path, sql, params) > 0
    got = cache.get_many(keys.values())
    assert {name for name, h in keys.items() if h not in got} == damaged  # the other row is still read
    # the miss is encoded again and its row rewritten: nothing stays lost
    encoded: list[str] = []

    def encode(texts: list[str]) -> list[np.ndarray | SparseVector]:
        encoded.extend(texts)
        return [dense if t.startswith("dense") else sparse for t in texts]

    texts = [f"{name} text" for name in sorted(damaged)]
    cached_encode(texts, encode, disk=cache)
    assert sorted(encoded) == texts
    assert set(cache.get_many(keys.values())) == set(keys.values())
    cache.close()


@pytest.mark.parametrize("mark", ["'x'", "9e999"], ids=["text", "infinite"])
def test_a_cache_rows_last_use_that_is_no_number_is_read_marked_again_and_pruned_first(tmp_path: Path,
                                                                                        mark: str) -> None:
    """A last-use mark stored as text (SQLite keeps one in an INTEGER column) failed every lookup of its row with
    a TypeError, and the cache's stats with a bare ValueError; and text sorts after every number, so pruning took
    the row for the newest and removed the sound ones around it. An infinite one, never pruned, failed the stats
    with an OverflowError. Either reads as never used now."""
    from rlfb.retrievers.cache_admin import cache_stats, prune_cache

    def damage() -> None:
        assert _damage_rows(tmp_path, f"UPDATE encodings SET used_at = {mark} WHERE text_hash = 'a'") == 1

    def kinds() -> dict[str, str]:
        conn = sqlite3.connect(tmp_path / "embeddings.sqlite")
        try:
            return dict(conn.execute("SELECT text_hash, typeof(used_at) FROM encodings").fetchall())
        finally:
            conn.close()

    cache = EmbeddingCache(tmp_path, "toy")
    cache.put_many({"a": np.full(4, 0.5), "b": np.full(4, 0.5)})
    damage()
    (model,) = cache_stats(tmp_path)["models"]
    assert model["entries"] == 2 and model["oldest_use"] == 0 < model["latest_use"]  # never used, as 0 means
    assert set(cache.get_many(["a", "b"])) == {"a", "b"}  # the encoding itself is sound: a hit
    assert kinds() == {"a": "integer", "b": "integer"}  # and its mark is written again
    damage()
    assert prune_cache(tmp_path, unused_days=1, vacuum=False)["removed"] == 1  # unused for a day: the damaged one
    assert set(cache.get_many(["a", "b"])) == {"b"}
    cache.put_many({"a": np.full(4, 0.5)})
    damage()
    one = cache_stats(tmp_path)["models"][0]["bytes"] // 2
    assert prune_cache(tmp_path, max_mb=one / 2**20, vacuum=False)["removed"] == 1  # least recently used first
    assert set(cache.get_many(["a", "b"])) == {"b"}
    cache.close()


@pytest.mark.parametrize("damage", ["substr(vals, 1, 5)", "?"])
def test_dense_index_over_a_damaged_cache_reencodes(tmp_path: Path, damage: str) -> None:
    """The audit's case: a truncated (raw ValueError) or NaN (scores silently None) cached vector."""
    chunks = make_chunks(TEXTS, ids=IDS)
    fresh = DenseRetriever(cache_dir=tmp_path).index(chunks)
    nan_blob = np.full(fresh.embeddings.shape[1], np.nan, dtype=np.float32).tobytes()
    params = (nan_blob,) if damage == "?" else ()
    assert _damage_rows(tmp_path, f"UPDATE encodings SET vals = {damage}", params) > 0
    again = DenseRetriever(cache_dir=tmp_path).index(chunks)
    np.testing.assert_allclose(again.embeddings, fresh.embeddings, rtol=0, atol=1e-5)
    assert np.isfinite(again.score_all("what causes the aurora")).all()


def test_dense_index_and_search_go_on_when_the_cache_folder_cannot_be_made(tmp_path: Path) -> None:
    """A cache folder that cannot be made (here: under a file) raised a raw OSError from index()."""
    (tmp_path / "afile").write_text("")
    chunks = make_chunks(TEXTS, ids=IDS)
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        retriever = DenseRetriever(cache_dir=tmp_path / "afile" / "sub").index(chunks)
    assert retriever.search("what causes the aurora", 1)[0][0] == "aurora"


# -- rlfb weights import ----------------------------------------------------------------------------------
@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "fb.db"
    with FeedbackStore(path) as store:
        store.save_policy_state({}, {"bm25": 0.5, "dense": 0.5})
    return path


def _version(db: Path) -> int:
    with FeedbackStore(db) as store:
        return store.state_version()


def test_deeply_nested_weights_file_is_a_clear_error(db: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "deep.json"
    bad.write_text(DEEP, encoding="utf-8")
    before = _version(db)
    with FeedbackStore(db) as store, pytest.raises(CorruptStateError, match=re.escape(str(bad))):
        import_weights(store, bad)
    assert main(["weights", "import", str(db), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "rlfb: error: cannot read weights from" in err and str(bad) in err
    assert _version(db) == before


@pytest.mark.parametrize("weights", ["NaN", "Infinity", "-0.5", "1e999"])
def test_non_finite_or_negative_weights_name_the_file(db: Path, tmp_path: Path, weights: str, capsys) -> None:
    bad = tmp_path / "bad-weights.json"
    bad.write_text(f'{{"weights": {{"bm25": {weights}, "dense": 1.0}}}}', encoding="utf-8")
    before = _version(db)
    with FeedbackStore(db) as store, pytest.raises(InvalidWeightsError, match=re.escape(str(bad))):
        import_weights(store, bad)
    assert main(["weights", "import", str(db), str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err
    assert _version(db) == before


def test_damaged_state_in_a_weights_file_names_the_file(db: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-state.json"
    bad.write_text(json.dumps({"weights": {"bm25": 0.5, "dense": 0.5}, "state": {"format": 99}}), encoding="utf-8")
    before = _version(db)
    with FeedbackStore(db) as store, pytest.raises(CorruptStateError, match=re.escape(str(bad))):
        import_weights(store, bad)
    assert _version(db) == before


def test_feedback_on_an_event_whose_logged_row_is_damaged_is_kept_unlearned(tmp_path: Path) -> None:
    from rlfb import FeedbackEnsemble

    path = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(["aurora lights", "tides moon", "sun wind"], retrievers=("bm25",),
                                      store=str(path))
    r = ens.retrieve("aurora", k=2)
    with sqlite3.connect(path) as conn:  # damaged outside rlfb: a chunk's normalised scores are not a mapping
        conn.execute("UPDATE event_chunks SET normalized = ? WHERE event_id = ?", ('"not a mapping"', r.event_id))
    with pytest.raises(CorruptStateError, match="is stored, but the event's logged row is damaged"):
        ens.feedback(r.event_id, "thumbs_up", idempotency_key="K")
    assert ens.store.counts()["feedback"] == 1 and ens.learner.n_learned == 0  # nothing lost, nothing mis-learned
    assert ens.feedback(r.event_id, "thumbs_up", idempotency_key="K").duplicate
    ens.close()


def _batch_ensemble(tmp_path: Path, **kwargs: Any):
    from rlfb import FeedbackEnsemble

    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="batch", **kwargs)
    r = ens.retrieve("aurora", k=2)
    ens.feedback(r.event_id, "thumbs_up")
    return ens


def test_weights_import_refuses_a_negative_batch_counter(tmp_path: Path, capsys) -> None:
    # it was imported (rc 0), and every ensemble on the store then failed at retrieve: sqrt(1 + n_batches)
    from rlfb import FeedbackEnsemble

    path = tmp_path / "bst.db"
    _batch_ensemble(tmp_path, store=str(path)).close()
    exported, damaged = tmp_path / "b.json", tmp_path / "b-damaged.json"
    assert main(["weights", "export", str(path), str(exported)]) == 0
    data = json.loads(exported.read_text(encoding="utf-8"))
    data["state"]["policy"]["state"]["n_batches"] = -5
    damaged.write_text(json.dumps(data), encoding="utf-8")
    before = _version(path)
    capsys.readouterr()
    assert main(["weights", "import", str(path), str(damaged)]) == 2
    err = capsys.readouterr().err
    assert "rlfb: error:" in err and "n_batches" in err and "Traceback" not in err
    assert _version(path) == before
    ens = FeedbackEnsemble.from_texts(TEXTS, ids=IDS, retrievers=("bm25",), policy="batch", store=str(path))
    assert ens.retrieve("aurora", k=2).hits  # the store's state is still the intact one
    ens.close()


def test_load_refuses_a_save_with_a_negative_batch_counter(tmp_path: Path) -> None:
    from rlfb import FeedbackEnsemble

    folder = tmp_path / "saved"
    ens = _batch_ensemble(tmp_path, store=str(tmp_path / "fb.db"))
    ens.save(folder)
    ens.close()
    state = json.loads((folder / "learner.json").read_text(encoding="utf-8"))
    state["policy"]["state"]["n_batches"] = -5
    (folder / "learner.json").write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(CorruptStateError, match="n_batches"):
        FeedbackEnsemble.load(folder)
