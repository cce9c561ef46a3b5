"""Helpers for damaged-file tests: edits a saved file the way a bit flip or a foreign tool would."""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path


def zip_method(name: str, method: int) -> Callable[[Path], None]:
    """A mutation of the folder it is given: every member's compression method field in the headers of the
    zip file ``name`` set to ``method`` (99 is one ``zipfile`` does not support)."""

    def mutate(root: Path) -> None:
        data = bytearray((root / name).read_bytes())
        for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # local headers, central directory
            at = data.find(signature)
            while at != -1:
                struct.pack_into("<H", data, at + offset, method)
                at = data.find(signature, at + 4)
        (root / name).write_bytes(bytes(data))

    return mutate


def unchecked(root: Path) -> Path:
    """``root``, a saved folder, without the ``checksums.json`` files of it and of the saves nested in it: a save
    as rlfb wrote it before the checksums (2026-12-05), or one whose files are edited on purpose, whose content
    checks alone then stand between a damaged file and a load (what these tests exercise)."""
    for file in root.rglob("checksums.json"):
        file.unlink()
    return root


def damage_newest_snapshot(path: Path) -> int:
    """Write a learner state no learner can read into the newest policy snapshot of the store file ``path``, as a
    foreign tool would; returns that snapshot's version."""
    with sqlite3.connect(path) as db:
        newest = db.execute("SELECT MAX(version) FROM policy_snapshots").fetchone()[0]
        db.execute("UPDATE policy_snapshots SET state = ? WHERE version = ?", ('{"broken": 1}', newest))
    db.close()
    return int(newest)
