"""Saved folders read whole: a save swapped in while a load reads, and a save killed between its two renames."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from rlfb import CorruptStateError, FeedbackEnsemble, RlfbError, SaveNotFoundError, ValidationError, saved_folder
from rlfb.retrievers import BM25Retriever
from rlfb.retrievers.base import ChunkTable
from rlfb.saved_folder import saving_into
from rlfb.types import make_chunks

posix_only = pytest.mark.skipif(os.name != "posix", reason="a killed save's process is told apart on POSIX only")

OLD_TEXTS = ["aurora physics", "storm weather", "moon light"]
NEW_TEXTS = ["volcano geology", "ocean tides", "sun light", "rock layers"]
#: a process id above Linux's largest (4,194,304): no such process
NO_PROCESS = 99_999_999


def _ensemble(texts: list[str], seed: int) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(texts, retrievers=("bm25",), seed=seed)


def _swap_once_during_chunks_read(monkeypatch: pytest.MonkeyPatch, save) -> list[int]:
    """Make the first ``ChunkTable.load`` (a step of every load) swap another save in first; returns the calls."""
    calls: list[int] = []
    original = ChunkTable.load.__func__  # type: ignore[attr-defined]

    def patched(cls, path, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            save()
        return original(cls, path, **kwargs)

    monkeypatch.setattr(ChunkTable, "load", classmethod(patched))
    return calls


def test_an_ensemble_save_swapped_in_mid_load_is_read_whole(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=1).save(root)
    newer = _ensemble(NEW_TEXTS, seed=2)
    # the settings (ensemble.json) are read from the first save, then the second one is swapped in before
    # the chunks are read: a load that went on would build the first save's settings over the second's chunks
    calls = _swap_once_during_chunks_read(monkeypatch, lambda: newer.save(root))
    loaded = FeedbackEnsemble.load(root)
    assert len(calls) >= 2  # read again
    assert loaded.seed == 2 and sorted(loaded.chunks.texts) == sorted(NEW_TEXTS)


def test_a_retriever_save_swapped_in_mid_load_is_read_whole(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "bm25"
    first = BM25Retriever().index(make_chunks(OLD_TEXTS))
    second = BM25Retriever(k1=1.2).index(make_chunks(NEW_TEXTS))
    first.save(root)
    _swap_once_during_chunks_read(monkeypatch, lambda: second.save(root))
    loaded = BM25Retriever.load(root)
    assert loaded.k1 == 1.2 and loaded.ids == second.ids
    assert loaded.search("ocean tides", 1) == second.search("ocean tides", 1)


def test_damage_that_stays_is_raised_at_once(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=1).save(root)
    (root / "chunks.jsonl").write_text("{not json\n", encoding="utf-8")
    reads: list[int] = []
    original = ChunkTable.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(ChunkTable, "load", classmethod(lambda c, p, **kw: (reads.append(1), original(c, p, **kw))[1]))  # type: ignore[func-returns-value]
    with pytest.raises(CorruptStateError, match="chunks.jsonl"):
        FeedbackEnsemble.load(root)
    assert len(reads) == 1  # not read again: the folder did not change
    with pytest.raises(CorruptStateError, match="cannot read an ensemble from .*never-saved: there is no such folder"):
        FeedbackEnsemble.load(tmp_path / "never-saved")
    # a damaged file of the save is named (its repr dropped the name: "JSONDecodeError(...)")
    (root / "chunks.jsonl").unlink()
    (root / "learner.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CorruptStateError, match="cannot read .*learner.json: JSONDecodeError: Expecting"):
        FeedbackEnsemble.load(root)
    (root / "ensemble.json").unlink()
    with pytest.raises(CorruptStateError, match="holds no ensemble.json"):
        FeedbackEnsemble.load(root)


def test_a_missing_save_is_a_file_not_found_error_too(tmp_path: Path) -> None:
    # a missing save was a CorruptStateError alone, which `except FileNotFoundError` around a first start's
    # load (load when saved, else build) did not catch, though nothing was corrupt
    with pytest.raises(FileNotFoundError, match="there is no such folder") as missing:
        FeedbackEnsemble.load(tmp_path / "never-saved")
    assert isinstance(missing.value, SaveNotFoundError) and isinstance(missing.value, CorruptStateError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SaveNotFoundError, match="holds no ensemble.json"):
        FeedbackEnsemble.load(tmp_path / "empty")
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=1).save(root)
    (root / "learner.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CorruptStateError) as damaged:  # a damaged save is no missing one
        FeedbackEnsemble.load(root)
    assert not isinstance(damaged.value, FileNotFoundError)


def test_a_folder_replaced_on_every_read_gives_up_with_a_named_error(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=1).save(root)
    newer = _ensemble(NEW_TEXTS, seed=2)
    original = ChunkTable.load.__func__  # type: ignore[attr-defined]

    def always_swapped(c, p, **kw):
        newer.save(root)
        return original(c, p, **kw)

    monkeypatch.setattr(ChunkTable, "load", classmethod(always_swapped))
    monkeypatch.setattr(saved_folder, "READ_ATTEMPTS", 3)
    monkeypatch.setattr(saved_folder, "_FIRST_WAIT", 0.0)
    with pytest.raises(CorruptStateError, match="replaced by another save 3 times"):
        FeedbackEnsemble.load(root)


def _killed_between_renames(root: Path, tag: str) -> Path:
    """What a save killed after moving the previous save aside and before moving its own in leaves."""
    aside = root.with_name(f".{root.name}.old-{tag}")
    root.rename(aside)
    return aside


def _lock_file(root: Path, tag: str) -> Path:
    """A save's lock file as a killed save leaves it: there, and held by no process."""
    path = root.with_name(f".{root.name}.lock-{tag}")
    path.write_bytes(b"")
    return path


class _Held:
    """A save's lock file held, as by a save still running (in another process: another open file)."""

    def __init__(self, path: Path) -> None:
        import fcntl

        path.write_bytes(b"")
        self.fd = os.open(path, os.O_RDWR)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        os.close(self.fd)


TAG = f"host~{NO_PROCESS}~0123456789ab"


@posix_only
def test_a_save_killed_between_its_renames_is_put_back_at_load(tmp_path: Path) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=7).save(root)
    _killed_between_renames(root, TAG)
    _lock_file(root, TAG)
    assert not root.exists()
    with pytest.warns(RuntimeWarning, match="put back"):
        loaded = FeedbackEnsemble.load(root)
    assert loaded.seed == 7 and sorted(loaded.chunks.texts) == sorted(OLD_TEXTS)
    _ensemble(OLD_TEXTS, seed=8).save(root)  # clears the killed save's lock file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ens"]


@posix_only
def test_a_live_save_between_its_renames_is_waited_for_not_taken_over(tmp_path: Path, monkeypatch) -> None:
    # its process may be alive where this one cannot see it (another PID namespace: a container with the
    # host's name), so only a lock that can be taken tells a killed save; a save of rlfb before 2026-12-05 left
    # no lock file, and is never taken either
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=7).save(root)
    aside = _killed_between_renames(root, TAG)
    held = _Held(root.with_name(f".ens.lock-{TAG}"))
    monkeypatch.setattr(saved_folder, "READ_ATTEMPTS", 2)
    monkeypatch.setattr(saved_folder, "_FIRST_WAIT", 0.0)
    with pytest.raises(CorruptStateError, match=f"{aside.name}: rename it back"):
        FeedbackEnsemble.load(root)
    assert aside.exists() and not root.exists()
    held.release()
    (tmp_path / f".ens.lock-{TAG}").unlink()  # as an older rlfb's save: no lock file at all
    legacy = aside.rename(root.with_name(f".ens.old-{NO_PROCESS}-0123456789ab"))
    with pytest.raises(CorruptStateError, match="rename it back"):
        FeedbackEnsemble.load(root)
    assert legacy.exists()


@posix_only
def test_a_save_clears_what_killed_saves_left_beside_it(tmp_path: Path) -> None:
    root = tmp_path / "ens"
    ens = _ensemble(OLD_TEXTS, seed=1)
    ens.save(root)
    killed = ["host~1~0123456789ab", "host~2~0123456789ac"]
    dead = [tmp_path / f".ens.saving-{killed[0]}", tmp_path / f".ens.old-{killed[1]}"]
    running = f"host~{os.getpid()}~0123456789ae"
    alive = [
        tmp_path / f".ens.saving-{running}",  # a save still running: its lock is held
        tmp_path / f".ens.saving-{NO_PROCESS}-0123456789ad",  # an older rlfb's: no lock file
        tmp_path / f".other.saving-{killed[0]}",  # another folder's
        tmp_path / "notes",
    ]
    for path in dead + alive:
        shutil.copytree(root, path)
    for tag in killed:
        _lock_file(root, tag)
    held = _Held(root.with_name(f".ens.lock-{running}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ens.save(root)
    held.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ens", f".ens.lock-{running}", *(p.name for p in alive)]
    )
    assert FeedbackEnsemble.load(root).seed == 1


def test_a_save_replaces_what_a_file_browser_left_in_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "ens"
    ens = _ensemble(OLD_TEXTS, seed=1)
    ens.save(root)
    for name in (".DS_Store", "Thumbs.db", "desktop.ini"):
        (root / name).write_bytes(b"\0")
    ens.save(root)
    assert ".DS_Store" not in {p.name for p in root.iterdir()}
    # a new folder the file browser has shown already: refused as "not empty" before
    new = tmp_path / "new"
    new.mkdir()
    (new / ".DS_Store").write_bytes(b"\0")
    ens.save(new)
    assert FeedbackEnsemble.load(new).seed == 1 and ".DS_Store" not in {p.name for p in new.iterdir()}


def test_a_save_refuses_a_folder_that_also_holds_other_files(tmp_path: Path) -> None:
    # a store kept beside the model in its folder was deleted, with every feedback row, by the next save
    root = tmp_path / "model"
    _ensemble(OLD_TEXTS, seed=1).save(root)
    ens = FeedbackEnsemble.load(root, store=root / "feedback.db")
    r = ens.retrieve("aurora", k=1)
    ens.feedback(r.event_id, "thumbs_up")
    with pytest.raises(ValidationError, match=r"holds \['feedback.db'.*not part of a saved ensemble"):
        ens.save(root)
    assert ens.store.counts()["feedback"] == 1 and (root / "feedback.db").exists()
    ens.close()
    assert FeedbackEnsemble.load(root).seed == 1  # the save is as it was
    bm25 = BM25Retriever().index(make_chunks(OLD_TEXTS))
    bm25.save(tmp_path / "bm25")
    (tmp_path / "bm25" / "notes.txt").write_text("keep me")
    with pytest.raises(ValidationError, match="notes.txt"):
        bm25.save(tmp_path / "bm25")
    assert (tmp_path / "bm25" / "notes.txt").read_text() == "keep me"


def test_every_kind_of_save_writes_only_the_names_a_later_save_replaces(tmp_path: Path) -> None:
    from rlfb.ensemble_folder import _SAVED_NAMES
    from rlfb.retrievers.base import SAVED_NAMES

    ens = FeedbackEnsemble.from_texts(OLD_TEXTS, retrievers=("bm25", "dense", "splade"))
    ens.save(tmp_path / "ens")
    ens.save(tmp_path / "ens")  # again over the first: nothing refused
    assert {p.name for p in (tmp_path / "ens").iterdir()} <= _SAVED_NAMES | {saved_folder.CHECKSUMS}
    for folder in (tmp_path / "ens" / "retrievers").iterdir():
        assert {p.name for p in folder.iterdir()} <= SAVED_NAMES | {saved_folder.CHECKSUMS}
        ens.retrievers[folder.name].save(tmp_path / folder.name)
        ens.retrievers[folder.name].save(tmp_path / folder.name)


@posix_only
def test_a_file_system_without_locks_still_saves(tmp_path: Path, monkeypatch) -> None:
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    _ensemble(OLD_TEXTS, seed=4).save(tmp_path / "ens")
    _ensemble(OLD_TEXTS, seed=5).save(tmp_path / "ens")
    assert FeedbackEnsemble.load(tmp_path / "ens").seed == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ens"]


# -- checksums: damage the content checks cannot see ------------------------------------------------------


def _flip_last_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01  # the lowest bit of the last number: a valid array still, a slightly different score
    file.write_bytes(bytes(data))


def test_a_byte_flipped_inside_a_saved_array_is_named(tmp_path: Path) -> None:
    """Before the checksums (2026-12-05) a flipped bit inside a saved array loaded: the arrays' shapes and
    values passed every content check, and the index scored with the damaged number."""
    ens = _ensemble(OLD_TEXTS, seed=0)
    ens.save(tmp_path / "ens")
    ens.retrievers["bm25"].save(tmp_path / "bm25")
    for root, rel in ((tmp_path / "ens", "retrievers/bm25/bm25s/data.csc.index.npy"),
                      (tmp_path / "bm25", "bm25s/data.csc.index.npy")):
        file = root / rel
        intact = file.read_bytes()
        _flip_last_byte(file)
        loader = FeedbackEnsemble.load if root.name == "ens" else BM25Retriever.load
        with pytest.raises(CorruptStateError, match=f"{rel}.* changed since it was saved"):
            loader(root)
        file.write_bytes(intact)
        loader(root)  # intact again


def test_a_learned_number_edited_within_its_bounds_is_named_and_loads_once_the_checksums_go(tmp_path: Path) -> None:
    ens = _ensemble(OLD_TEXTS, seed=0)
    root = tmp_path / "ens"
    ens.save(root)
    state = json.loads((root / "learner.json").read_text())
    state["now"] = state["now"] + 1.0  # a clock a little later: nothing about it is out of bounds
    (root / "learner.json").write_text(json.dumps(state))
    with pytest.raises(CorruptStateError, match=r"learner\.json has changed since it was saved.*remove .*checksums"):
        FeedbackEnsemble.load(root)
    (root / saved_folder.CHECKSUMS).unlink()  # edited on purpose: loaded unchecked, as a save from before
    assert FeedbackEnsemble.load(root).learner.state_dict()["now"] == state["now"]


def test_a_file_the_checksums_list_that_is_gone_is_named(tmp_path: Path) -> None:
    BM25Retriever().index(make_chunks(OLD_TEXTS)).save(tmp_path / "bm25")
    (tmp_path / "bm25" / "term_counts.npz").unlink()  # a load without it would tokenize everything again
    with pytest.raises(CorruptStateError, match="term_counts.npz is missing from the save"):
        BM25Retriever.load(tmp_path / "bm25")


def test_the_ensembles_checksums_cover_each_retrievers_own(tmp_path: Path) -> None:
    """A retriever's file changed and its own checksums.json written again to match: the ensemble's list,
    which holds the retriever's list's digest, still finds it."""
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=0).save(root)
    inner = root / "retrievers" / "bm25"
    _flip_last_byte(inner / "bm25s" / "data.csc.index.npy")
    (inner / saved_folder.CHECKSUMS).unlink()
    saved_folder._write_checksums(inner)
    with pytest.raises(CorruptStateError, match="retrievers/bm25/checksums.json has changed"):
        FeedbackEnsemble.load(root)


def test_an_edited_retriever_file_in_an_ensemble_names_every_list_to_remove(tmp_path: Path) -> None:
    """The message named the retriever's checksums.json alone; removed, the ensemble's list (which holds its
    digest) refused the load again, with no word of itself."""
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=0).save(root)
    _flip_last_byte(root / "retrievers" / "bm25" / "bm25s" / "data.csc.index.npy")
    with pytest.raises(CorruptStateError) as caught:
        FeedbackEnsemble.load(root)
    inner, outer = root / "retrievers" / "bm25" / saved_folder.CHECKSUMS, root / saved_folder.CHECKSUMS
    assert f"remove {inner}, {outer} to load" in str(caught.value)
    inner.unlink()
    outer.unlink()
    FeedbackEnsemble.load(root)  # as it says


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("not json", "checksums.json is damaged"),
        (json.dumps({"sha256": {"chunks.jsonl": "abc"}}), "checksums.json is damaged"),
        (json.dumps({"sha256": ["chunks.jsonl"]}), "checksums.json is damaged"),
        (json.dumps({"files": {}}), "checksums.json is damaged"),
        (json.dumps({"sha256": {"../outside.txt": "0" * 64}}), "not a file inside the save"),
        (json.dumps({"sha256": {"/etc/passwd": "0" * 64}}), "not a file inside the save"),
        # not absolute on Windows, and outside the save all the same
        (json.dumps({"sha256": {"C:secret.txt": "0" * 64}}), "not a file inside the save"),
        (json.dumps({"sha256": {"\\Windows\\win.ini": "0" * 64}}), "not a file inside the save"),
        (json.dumps({"sha256": {"retrievers//bm25/meta.json": "0" * 64}}), "not a file inside the save"),
    ],
)
def test_a_damaged_checksums_file_is_named(tmp_path: Path, content: str, words: str) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=0).save(root)
    (root / saved_folder.CHECKSUMS).write_text(content)
    with pytest.raises(CorruptStateError, match=words):
        FeedbackEnsemble.load(root)


def test_a_save_lists_every_file_it_wrote(tmp_path: Path) -> None:
    root = tmp_path / "ens"
    _ensemble(OLD_TEXTS, seed=0).save(root)
    listed = set(json.loads((root / saved_folder.CHECKSUMS).read_text())["sha256"])
    assert listed == {"chunks.jsonl", "ensemble.json", "learner.json", "retrievers/bm25/checksums.json"}
    inner = root / "retrievers" / "bm25"
    files = {p.relative_to(inner).as_posix() for p in inner.rglob("*") if p.is_file()} - {saved_folder.CHECKSUMS}
    assert set(json.loads((inner / saved_folder.CHECKSUMS).read_text())["sha256"]) == files


# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_save_that_writes_a_name_its_kind_does_not_list_is_refused_and_not_swapped_in(tmp_path: Path) -> None:
    """Bug guarded: a save writing a file missing from its kind's list of names was kept, and every later save to
    the folder then refused it as holding something else."""
    root = tmp_path / "thing"
    with pytest.raises(RlfbError, match=r"wrote \['extra.txt'\], which its list of saved names lacks"):
        with saving_into(root, marker="thing.json", what="thing", names=frozenset({"thing.json"})) as tmp:
            (tmp / "thing.json").write_text("{}")
            (tmp / "extra.txt").write_text("not listed")
    assert not root.exists()
