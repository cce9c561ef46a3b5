"""The embedding cache's size policy: use is tracked, old files migrate, pruning keeps the most recently used."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfb.cli import main
from rlfb.errors import CorruptStateError, ValidationError
from rlfb.retrievers.cache import EmbeddingCache, SparseVector, cache_stats, cached_encode, prune_cache, text_hash

_V1_SCHEMA = """
CREATE TABLE encodings (
    model_key TEXT NOT NULL, text_hash TEXT NOT NULL, dim INTEGER NOT NULL, indices BLOB, vals BLOB NOT NULL,
    PRIMARY KEY (model_key, text_hash)
) WITHOUT ROWID
"""


def _dense(vector: np.ndarray | SparseVector) -> np.ndarray:
    """An encoding these tests made dense (the cache's lookups are typed dense or sparse)."""
    assert isinstance(vector, np.ndarray)
    return vector


def _file(folder: Path) -> Path:
    return folder / "embeddings.sqlite"


def _used_at(folder: Path) -> dict[str, int]:
    with sqlite3.connect(_file(folder)) as conn:
        return dict(conn.execute("SELECT text_hash, used_at FROM encodings").fetchall())


def _set_used_at(folder: Path, values: dict[str, int]) -> None:
    conn = sqlite3.connect(_file(folder))
    with conn:
        conn.executemany("UPDATE encodings SET used_at = ? WHERE text_hash = ?", [(v, h) for h, v in values.items()])
    conn.close()


def _v1_file(folder: Path, n: int = 5) -> None:
    """A cache written by rlfb before use was tracked: no used_at column."""
    folder.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(_file(folder))
    with conn:
        conn.execute(_V1_SCHEMA)
        conn.executemany(
            "INSERT INTO encodings VALUES (?, ?, ?, ?, ?)",
            [("m|query", f"old{i}", 4, None, np.full(4, i, dtype=np.float32).tobytes()) for i in range(n)],
        )
        conn.execute("PRAGMA user_version=1")
    conn.close()


def test_an_older_cache_file_is_migrated_in_place_and_keeps_its_encodings(tmp_path: Path) -> None:
    _v1_file(tmp_path)
    cache = EmbeddingCache(tmp_path, "m|query")
    assert len(cache) == 5
    assert _used_at(tmp_path) == {f"old{i}": 0 for i in range(5)}  # unused since the upgrade, as far as we know
    np.testing.assert_array_equal(cache.get_many(["old3"])["old3"], np.full(4, 3.0))
    assert _used_at(tmp_path)["old3"] >= time.time() - 60  # read: marked as used
    cache.close()
    again = EmbeddingCache(tmp_path, "m|query")  # opening a migrated file again changes nothing
    assert len(again) == 5
    # the file stays readable and writable by the rlfb that wrote it: same version, explicit columns
    conn = sqlite3.connect(_file(tmp_path))
    with conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        conn.execute("INSERT INTO encodings (model_key, text_hash, dim, indices, vals) VALUES ('m|query', 'o', 1, "
                     "NULL, ?)", (np.zeros(1, dtype=np.float32).tobytes(),))
    conn.close()
    assert _used_at(tmp_path)["o"] == 0 and len(again) == 6


_OPENER = """
import sys
from rlfb.retrievers.cache import EmbeddingCache
assert len(EmbeddingCache(sys.argv[1], "m|query")) == 5
"""


def test_processes_opening_an_older_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    _v1_file(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", _OPENER, str(tmp_path)]) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]


def test_a_newer_schema_is_passed_by_with_a_warning_and_named_by_a_look(tmp_path: Path) -> None:
    # a newer rlfb's cache stopped every index and search of an older one beside it (it raised at the first
    # lookup); it holds nothing that cannot be encoded again, so lookups and writes go on without it
    EmbeddingCache(tmp_path, "m").put_many({"h": np.zeros(2)})
    conn = sqlite3.connect(_file(tmp_path))
    conn.execute("PRAGMA user_version=7")
    conn.close()
    before = _file(tmp_path).read_bytes()
    cache = EmbeddingCache(tmp_path, "m")
    with pytest.warns(RuntimeWarning, match="schema 7.*without it"):
        assert cache.get_many(["h"]) == {}
    cache.put_many({"g": np.ones(2)})
    assert _file(tmp_path).read_bytes() == before
    with pytest.raises(CorruptStateError, match="schema 7"):
        cache_stats(tmp_path)


def test_reads_mark_use_at_most_once_a_day(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, "m")
    cache.put_many({"a": np.zeros(2), "b": np.zeros(2)})
    now = int(time.time())
    _set_used_at(tmp_path, {"a": now - 3 * 86400, "b": now - 3600})
    cache.get_many(["a", "b"])
    used = _used_at(tmp_path)
    assert used["a"] >= now and used["b"] == now - 3600  # an hour-old mark is left as it is: no write


def test_prune_keeps_the_most_recently_used_within_the_size(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, "m|document")
    query = EmbeddingCache(tmp_path, "m|query")
    cache.put_many({f"d{i}": np.zeros(256) for i in range(20)})  # about 1 kB each
    query.put_many({"q": SparseVector(np.arange(10), np.ones(10), 100)})
    now = int(time.time())
    _set_used_at(tmp_path, {f"d{i}": now - 1000 + i for i in range(20)} | {"q": now})
    before = cache_stats(tmp_path)
    assert {m["model_key"]: m["entries"] for m in before["models"]} == {"m|document": 20, "m|query": 1}
    entry = 1024 + len("d10") + len("m|document")
    report = prune_cache(tmp_path, max_mb=(3.5 * entry + 100) / 1024 / 1024)
    # newest first: the sparse query vector, then d19, d18, d17 fit; the other 17 documents go
    assert report["removed"] == 17
    assert sorted(_used_at(tmp_path)) == ["d17", "d18", "d19", "q"]
    assert report["bytes_after"] < report["bytes_before"] and report["bytes_after"] <= 3.5 * entry + 100
    assert report["file_bytes_after"] < report["file_bytes_before"]  # vacuumed
    # what was pruned is simply encoded again when asked for
    calls: list[list[str]] = []

    def encode(batch: list[str]) -> list[np.ndarray]:
        calls.append(batch)
        return [np.ones(2)]

    out = cached_encode(["x"], encode, disk=EmbeddingCache(tmp_path, "m"))
    assert calls == [["x"]] and _dense(out[0]).tolist() == [1.0, 1.0]


def test_prune_gives_back_pages_freed_earlier_even_when_it_removes_nothing(tmp_path: Path) -> None:
    # RLFB_CACHE_MAX_MB's trimming (or a prune with vacuum=False) frees pages for reuse; a later prune with
    # nothing to remove must still give them back, as the README says it does
    cache = EmbeddingCache(tmp_path, "m")
    cache.put_many({f"d{i}": np.zeros(4096) for i in range(50)})  # about 32 kB each
    assert prune_cache(tmp_path, max_mb=0.1, vacuum=False)["removed"] > 40

    def free_pages() -> int:
        conn = sqlite3.connect(_file(tmp_path))
        try:
            return int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        finally:
            conn.close()

    assert free_pages() > 0
    report = prune_cache(tmp_path, max_mb=1000)
    assert report["removed"] == 0 and free_pages() == 0
    assert report["file_bytes_after"] < report["file_bytes_before"]
    assert prune_cache(tmp_path, max_mb=1000)["file_bytes_after"] == report["file_bytes_after"]  # nothing more


def test_the_file_and_its_log_stay_near_max_mb_after_a_batch_larger_than_it(tmp_path: Path) -> None:
    # one 31 MB batch under a 5 MB bound left a 93 MB file and a 94 MB write-ahead log: the batch was written
    # whole and dropped in the same transaction, and each 1.5 kB vector took a 4 kB page of its own
    rng = np.random.default_rng(0)
    cache = EmbeddingCache(tmp_path, "m", max_mb=1.0)
    cache.put_many({f"h{i}": rng.random(384).astype(np.float32) for i in range(4000)})  # 6.4 MB of vectors
    for round_ in range(3):
        cache.put_many({f"g{round_}-{j}": rng.random(384).astype(np.float32) for j in range(200)})
    assert 400 <= len(cache) <= 700  # 0.9 MB of 1.6 kB entries
    def on_disk() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob("embeddings.sqlite*"))

    assert on_disk() < 8 * 1024 * 1024, on_disk()  # 37 MB before: 19 MB of file and as much of log
    assert _dense(cache.get_many(["g2-199"])["g2-199"]).shape == (384,)  # the newest are kept
    cache.close()  # the log goes into the file
    assert on_disk() < 2.5 * 1024 * 1024, on_disk()  # 19 MB before


def test_prune_by_age_and_bad_settings(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, "m")
    cache.put_many({"old": np.zeros(2), "new": np.zeros(2)})
    _set_used_at(tmp_path, {"old": int(time.time()) - 40 * 86400})
    assert prune_cache(tmp_path, unused_days=30, vacuum=False)["removed"] == 1
    assert sorted(_used_at(tmp_path)) == ["new"]
    for kwargs in ({}, {"max_mb": -1}, {"unused_days": float("nan")}, {"max_mb": True}):
        with pytest.raises(ValidationError):
            prune_cache(tmp_path, **kwargs)
    missing = tmp_path / "none"
    assert prune_cache(missing, max_mb=1)["removed"] == 0 and not missing.exists()  # nothing made
    assert cache_stats(missing)["models"] == []


def test_the_cache_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLFB_CACHE_MAX_MB", raising=False)
    EmbeddingCache(tmp_path, "m").put_many({f"h{i}": np.zeros(64) for i in range(4)})
    assert main(["cache", "stats", "--dir", str(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["models"][0]["entries"] == 4 and stats["max_mb"] is None
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 encodings" in out and "no bound" in out
    monkeypatch.setenv("RLFB_CACHE_MAX_MB", "250")
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 0
    assert "RLFB_CACHE_MAX_MB=250 MB" in capsys.readouterr().out
    monkeypatch.setenv("RLFB_CACHE_MAX_MB", "lots")
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 2
    assert "RLFB_CACHE_MAX_MB" in capsys.readouterr().err
    monkeypatch.delenv("RLFB_CACHE_MAX_MB")
    assert main(["cache", "prune", "--dir", str(tmp_path), "--max-mb", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 4
    assert main(["cache", "prune", "--dir", str(tmp_path)]) == 2
    assert "--max-mb" in capsys.readouterr().err
    assert main(["cache", "prune", "--dir", str(tmp_path), "--unused-days", "-2"]) == 2
    assert "--unused-days must be" in capsys.readouterr().err  # the option typed


def _entry(key: str, h: str, floats: int = 256) -> int:
    return 4 * floats + len(h) + len(key)


def test_a_bounded_cache_drops_the_least_recently_used_as_it_writes(tmp_path: Path) -> None:
    """With ``max_mb`` the writes themselves keep the file's entries (every model's) within the bound:
    what was read lately stays, the longest unused goes first, down to 90 % of the bound."""
    docs = EmbeddingCache(tmp_path, "m|document")  # unbounded: it fills the file
    docs.put_many({f"a{i}": np.zeros(256) for i in range(10)})
    now = int(time.time())
    _set_used_at(tmp_path, {f"a{i}": now - 3 * 86400 + i for i in range(10)})
    assert len(docs.get_many(["a0", "a1"])) == 2  # read today: marked as used now
    limit = 8 * _entry("m|document", "a0")
    bounded = EmbeddingCache(tmp_path, "m|query", max_mb=limit / 1024 / 1024)
    bounded.put_many({"q0": np.zeros(256)})  # 11 entries > 8: pruned to 90 % of the bound (7 entries)
    kept = set(_used_at(tmp_path))
    assert kept == {"q0", "a0", "a1", "a9", "a8", "a7", "a6"}
    assert sum(m["bytes"] for m in cache_stats(tmp_path)["models"]) <= limit
    for i in range(1, 6):  # each write that passes the bound prunes again; the sizes stay within it
        bounded.put_many({f"q{i}": np.zeros(256)})
        assert sum(m["bytes"] for m in cache_stats(tmp_path)["models"]) <= limit
    assert {f"q{i}" for i in range(6)} <= set(_used_at(tmp_path))  # the newest writes are kept
    assert len(bounded.get_many([f"q{i}" for i in range(6)])) == 6


def test_the_bound_comes_from_rlfb_cache_max_mb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLFB_CACHE_MAX_MB", raising=False)
    assert EmbeddingCache(tmp_path, "m").max_mb is None
    monkeypatch.setenv("RLFB_CACHE_MAX_MB", " ")
    assert EmbeddingCache(tmp_path, "m").max_mb is None
    monkeypatch.setenv("RLFB_CACHE_MAX_MB", "0.002")
    cache = EmbeddingCache(tmp_path, "m")
    assert cache.max_mb == 0.002 and EmbeddingCache(tmp_path, "m", max_mb=5).max_mb == 5
    cache.put_many({f"h{i}": np.zeros(256) for i in range(10)})
    assert 0 < len(cache) <= 2  # 0.002 MB holds two of these 1 kB vectors
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv("RLFB_CACHE_MAX_MB", bad)
        with pytest.raises(ValidationError, match="RLFB_CACHE_MAX_MB"):
            EmbeddingCache(tmp_path, "m")
    monkeypatch.delenv("RLFB_CACHE_MAX_MB")
    for bad_mb in (-1, float("nan"), True, "5"):
        with pytest.raises(ValidationError, match="max_mb"):
            EmbeddingCache(tmp_path, "m", max_mb=bad_mb)  # type: ignore[arg-type]


# -- a damaged file ---------------------------------------------------------------------------------------
def _damaged_cache(folder: Path) -> Path:
    """A cache file whose first page (header and schema) is intact and whose table pages are zeroed."""
    cache = EmbeddingCache(folder, "m")
    cache.put_many({f"h{i}": np.full(256, i, dtype=np.float32) for i in range(20)})
    cache.close()  # the last connection checkpoints the WAL into the file
    data = bytearray(_file(folder).read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the page size, from the file's header
    assert len(data) > page
    data[page:] = bytes(len(data) - page)
    _file(folder).write_bytes(bytes(data))
    return _file(folder)


def test_a_damaged_cache_file_warns_once_and_encoding_goes_on_without_it(tmp_path: Path) -> None:
    """sqlite3.DatabaseError ("malformed") escaped from every lookup and write, so indexing and search failed."""
    path = _damaged_cache(tmp_path)
    reader = EmbeddingCache(tmp_path, "m")
    with pytest.warns(RuntimeWarning, match="safe to delete") as caught:
        assert reader.get_many(["h0", "h1"]) == {}
    assert str(path) in str(caught[0].message)
    calls: list[list[str]] = []

    def encode(batch: list[str]) -> list[np.ndarray]:
        calls.append(list(batch))
        return [np.ones(4, dtype=np.float32) for _ in batch]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file's damage was reported: no second warning
        out = cached_encode(["a", "b"], encode, disk=reader)
        assert calls == [["a", "b"]] and [_dense(v).tolist() for v in out] == [[1.0] * 4] * 2
        writer = EmbeddingCache(tmp_path, "m|query")  # another cache on the same file, writing first
        writer.put_many({"x": np.ones(4)})
        assert writer.get_many(["x"]) == {}


def test_a_damaged_cache_file_found_by_a_write_warns(tmp_path: Path) -> None:
    path = _damaged_cache(tmp_path)
    with pytest.warns(RuntimeWarning, match=re.escape(str(path))):
        EmbeddingCache(tmp_path, "m").put_many({f"n{i}": np.ones(256) for i in range(50)})


def test_a_cache_file_that_is_no_database_is_passed_by_too(tmp_path: Path) -> None:
    # damage to the header shows when the file is opened, before any lookup: it raised CorruptStateError there
    EmbeddingCache(tmp_path, "m").put_many({"h0": np.ones(4)})
    EmbeddingCache(tmp_path, "m").close()
    for wal in tmp_path.glob("*-wal"):
        wal.unlink()
    data = bytearray(_file(tmp_path).read_bytes())
    data[:100] = b"not a database" * 7 + b"xx"
    _file(tmp_path).write_bytes(bytes(data))
    cache = EmbeddingCache(tmp_path, "m")
    with pytest.warns(RuntimeWarning, match="safe to delete"):
        assert cache.get_many(["h0"]) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put_many({"h1": np.ones(4)})  # dropped, without a second warning
        out = cached_encode(["a"], lambda b: [np.ones(4, dtype=np.float32) for _ in b], disk=cache)
    assert _dense(out[0]).tolist() == [1.0] * 4


def test_stats_and_prune_of_a_damaged_cache_file_name_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _damaged_cache(tmp_path)
    with pytest.raises(CorruptStateError, match=re.escape(str(path))):
        cache_stats(tmp_path)
    with pytest.raises(CorruptStateError, match="delete it"):
        prune_cache(tmp_path, max_mb=0)
    assert main(["cache", "stats", "--dir", str(tmp_path)]) == 2
    assert str(path) in capsys.readouterr().err


# -- a cache that cannot be written ----------------------------------------------------------------------
def _ones(batch: list[str]) -> list[np.ndarray]:
    return [np.ones(4, dtype=np.float32) for _ in batch]


def test_a_cache_folder_that_cannot_be_made_warns_once_and_encoding_goes_on_without_it(tmp_path: Path) -> None:
    """mkdir raised a raw OSError (FileNotFoundError under /proc, NotADirectoryError here) from every lookup."""
    (tmp_path / "afile").write_text("a file, not a folder")
    cache = EmbeddingCache(tmp_path / "afile" / "sub", "m")
    with pytest.warns(RuntimeWarning, match="cannot be used") as caught:
        out = cached_encode(["a", "b"], _ones, disk=cache)
    assert [_dense(v).tolist() for v in out] == [[1.0] * 4] * 2
    message = str(caught[0].message)
    assert str(cache.path) in message and "Not a directory" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once
        cache.put_many({"c": np.ones(4)})
        assert _dense(cached_encode(["c"], _ones, disk=cache)[0]).tolist() == [1.0] * 4
        assert EmbeddingCache(tmp_path / "afile" / "sub", "m|query").get_many(["c"]) == {}


def test_a_cache_file_that_cannot_be_opened_is_passed_by_not_called_damaged(tmp_path: Path) -> None:
    """SQLite's "unable to open database file" (a read-only folder) was a CorruptStateError saying it was damaged."""
    _file(tmp_path).mkdir()  # what SQLite cannot open, even as root
    cache = EmbeddingCache(tmp_path, "m")
    with pytest.warns(RuntimeWarning, match="unable to open database file"):
        assert cache.get_many(["h"]) == {}
    cache.put_many({"h": np.ones(4)})  # dropped
    assert _dense(cached_encode(["a"], _ones, disk=cache)[0]).tolist() == [1.0] * 4


def test_a_read_only_cache_file_is_still_read_and_its_writes_are_dropped(tmp_path: Path) -> None:
    """A new text's write raised sqlite3.OperationalError "attempt to write a readonly database", so a
    retriever over a read-only cache could not search a query it had not seen."""
    EmbeddingCache(tmp_path, "m").put_many({"h0": np.full(4, 2.0)})
    EmbeddingCache(tmp_path, "m").close()
    # SQLite opens a file whose header names a later write format read-only (root included); reads still work
    data = bytearray(_file(tmp_path).read_bytes())
    data[18] = 3
    _file(tmp_path).write_bytes(bytes(data))
    cache = EmbeddingCache(tmp_path, "m")
    assert _dense(cache.get_many(["h0"])["h0"]).tolist() == [2.0] * 4
    with pytest.warns(RuntimeWarning, match="cannot be written .*readonly") as caught:
        out = cached_encode(["new text"], _ones, disk=cache)
    assert str(_file(tmp_path)) in str(caught[0].message) and _dense(out[0]).tolist() == [1.0] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put_many({"h1": np.ones(4)})  # dropped, without a second warning
        got = cache.get_many(["h0", "h1"])
    assert list(got) == ["h0"]


def test_a_whole_cache_in_a_folder_that_cannot_be_written_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache on a read-only mount was not read at all: WAL mode needs its side files beside the file, so the
    connection failed, every text was encoded again, and `rlfb cache stats` exited 2. (Root writes anywhere,
    so the folder's refusal is what the usual connection is made to raise here.)"""
    import rlfb.retrievers.cache as cache_module
    import rlfb.retrievers.cache_admin as cache_admin

    EmbeddingCache(tmp_path, "m").put_many({"h0": np.full(4, 2.0)})
    EmbeddingCache(tmp_path, "m").close()

    def refused(path: Path) -> None:
        raise cache_module._CacheUnavailable(f"cannot open the embedding cache {path}: unable to open database file")

    # patched where it is looked up: by EmbeddingCache (cache) and by cache stats / prune (cache_admin)
    monkeypatch.setattr(cache_module, "_open", refused)
    monkeypatch.setattr(cache_admin, "_open", refused)
    cache = EmbeddingCache(tmp_path, "m")
    with pytest.warns(RuntimeWarning, match="cannot be written .*reading it"):
        assert _dense(cache.get_many(["h0"])["h0"]).tolist() == [2.0] * 4
    assert _dense(cached_encode(["new text"], _ones, disk=cache)[0]).tolist() == [1.0] * 4  # encoded, not stored
    assert list(cache.get_many(["h0", text_hash("new text")])) == ["h0"]
    assert main(["cache", "stats", "--dir", str(tmp_path), "--json"]) == 0
    assert [m["entries"] for m in json.loads(capsys.readouterr().out)["models"]] == [1]
    assert main(["cache", "prune", "--dir", str(tmp_path), "--max-mb", "0"]) == 2  # a prune must write


def test_stats_of_an_empty_cache_file_leave_it_empty(tmp_path: Path) -> None:
    # a read-only report wrote the schema into a 0-byte file
    _file(tmp_path).write_bytes(b"")
    assert cache_stats(tmp_path)["models"] == [] and _file(tmp_path).read_bytes() == b""


@pytest.mark.parametrize(("option", "value"), [("--max-mb", "1e13"), ("--max-mb", "1e308"),
                                                ("--unused-days", "1e15"), ("--unused-days", "1e306")])
def test_prune_bounds_beyond_sqlite_integers_keep_everything(tmp_path: Path, option: str, value: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """int(max_mb * 2**20) or the cutoff passed SQLite's 64-bit integers: OverflowError, exit 1."""
    cache = EmbeddingCache(tmp_path, "m")
    cache.put_many({"h": np.zeros(8)})
    assert main(["cache", "prune", "--dir", str(tmp_path), option, value, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 0
    assert len(cache) == 1
    bounded = EmbeddingCache(tmp_path, "m", max_mb=1e308)  # a write's bound is clamped alike
    bounded.put_many({"g": np.zeros(8)})
    assert len(bounded) == 2


def test_a_search_does_not_wait_on_another_process_holding_the_cache(tmp_path: Path) -> None:
    # a lookup's used-marks and a new query's encoding waited up to a minute for another process's write lock
    # (a prune's VACUUM): both are best effort, and now drop instead of waiting. No timing here: the waits are
    # read off the statements the cache's connection runs
    from rlfb.retrievers.cache import open_side_caches

    documents, queries = open_side_caches(tmp_path, "m")
    assert documents is not None and queries is not None
    queries.put_many({"old": np.zeros(2)})
    _set_used_at(tmp_path, {"old": int(time.time()) - 3 * 86400})
    holder = sqlite3.connect(_file(tmp_path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's write, under way
    try:
        statements: list[str] = []
        queries._connect().set_trace_callback(statements.append)
        assert set(queries.get_many(["old"])) == {"old"}
        queries.put_many({"new": np.ones(2)})  # dropped, not an error
        waits = [s for s in statements if s.startswith("PRAGMA busy_timeout")]
        assert waits[0] == "PRAGMA busy_timeout=0" and statements.index(waits[0]) < statements.index("BEGIN IMMEDIATE")
        assert waits.count("PRAGMA busy_timeout=0") == 2  # the marks' and the write's
        assert statements[-1] == "PRAGMA busy_timeout=60000"  # the connection's own wait put back
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert documents.write_wait == 60.0 and queries.write_wait == 0.0
    assert queries.get_many(["new"]) == {}
    queries.put_many({"new": np.ones(2)})  # free again: stored
    assert set(queries.get_many(["new"])) == {"new"}


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def _set_row(folder: Path, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(folder / "embeddings.sqlite")
    with conn:
        conn.execute(sql, args)
    conn.close()


def test_prune_by_unused_days_counts_whole_days(tmp_path: Path) -> None:
    """Bug guarded: unused_days was read in the wrong unit, removing encodings used two hours ago."""
    cache = EmbeddingCache(tmp_path, "toy|document", max_mb=100)
    cache.put_many({"recent": np.zeros(4), "old": np.zeros(4)})
    cache.close()
    now = int(time.time())
    _set_row(tmp_path, "UPDATE encodings SET used_at = ? WHERE text_hash = 'recent'", now - 7200)
    _set_row(tmp_path, "UPDATE encodings SET used_at = ? WHERE text_hash = 'old'", now - 2 * 86400)
    assert prune_cache(tmp_path, unused_days=1)["removed"] == 1
    assert sorted(EmbeddingCache(tmp_path, "toy|document", max_mb=100).get_many(["recent", "old"])) == ["recent"]


def test_a_bounded_cache_keeps_the_batch_it_just_wrote_over_one_written_in_the_same_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``used_at`` is in whole seconds: writes in quick succession tie, and ties went by key, so a batch whose keys
    sort last was dropped by the very write that stored it (a review, 2026-12-07). The batch just written counts as
    the newest."""
    import rlfb.retrievers.cache as cache_module

    frozen = float(int(time.time()))
    monkeypatch.setattr(cache_module.time, "time", lambda: frozen)  # every write in one second
    limit = 8 * _entry("m|query", "a0")
    bounded = EmbeddingCache(tmp_path, "m|query", max_mb=limit / 1024 / 1024)
    for batch in "abcdefgh":  # each 2 entries; "h" sorts last of all
        bounded.put_many({f"{batch}{i}": np.full(256, 1.0) for i in range(2)})
        assert {f"{batch}0", f"{batch}1"} <= set(_used_at(tmp_path)), batch
        assert sum(m["bytes"] for m in cache_stats(tmp_path)["models"]) <= limit
    assert len(bounded.get_many(["h0", "h1"])) == 2


def test_a_bounded_caches_write_that_fills_its_room_exactly_is_kept(tmp_path: Path) -> None:
    # a mutation review (2026-12-07): "beyond the room" read as "at it or beyond" dropped such a batch unwritten
    size = _entry("m", "h", 229)
    assert size % 9 == 0  # so that 90 % of the bound below is a whole number of bytes, the entry's size
    cache = EmbeddingCache(tmp_path, "m", max_mb=size // 9 * 10 / 2**20)  # a power-of-two divisor: exact
    cache.put_many({"h": np.zeros(229, dtype=np.float32)})
    assert len(cache) == 1
    cache.close()


def test_prune_with_no_vacuum_leaves_the_freed_pages_in_the_file(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # a mutation review (2026-12-07): --no-vacuum ignored ran the rewrite of the whole file the user had opted out of
    cache = EmbeddingCache(tmp_path, "m")
    cache.put_many({f"h{i}": np.zeros(256) for i in range(300)})
    cache.close()
    sizes = []
    for extra in (["--no-vacuum"], []):
        assert main(["cache", "prune", "--dir", str(tmp_path), "--max-mb", "0", "--json", *extra]) == 0
        report = json.loads(capsys.readouterr().out)
        sizes.append((report["file_bytes_before"], report["file_bytes_after"]))
    (kept_before, kept_after), (_, vacuumed) = sizes
    assert kept_after >= kept_before > 4 * 256 * 300  # the encodings removed, their pages still in the file
    assert vacuumed < kept_before / 4  # given back by the prune that vacuums (a tenth of the file is free)
