"""Helpers for damaged-file tests: edits a saved file the way a bit flip or a foreign tool would."""

from __future__ import annotations

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
