"""The files caught warnings name, read the same way by the tests of where warnings point."""

from __future__ import annotations

import re
import sys
from typing import Any


def named_files(caught: Any, pattern: str) -> list[str]:
    """The files the caught warnings matching ``pattern`` name (at least one, else the test fails)."""
    files = [w.filename for w in caught if re.search(pattern, str(w.message))]
    assert files, [str(w.message) for w in caught]
    return files


def noted(error: BaseException, caught: Any) -> str:
    """What rlfb said beside ``error``: its notes (Python 3.11+), else the warnings ``caught`` with it (Python
    3.10, whose exceptions take no notes: rlfb warns instead)."""
    if sys.version_info >= (3, 11):
        return "".join(getattr(error, "__notes__", []))
    return "".join(str(w.message) for w in caught)


def disk_full_once(ens: Any) -> None:
    """Make the ensemble's next snapshot write fail as a full disk does, once (the writes after it succeed)."""
    from rlfb.errors import StoreFullError

    persist = ens._persist

    def full_once(**kwargs: Any) -> None:
        ens._persist = persist
        raise StoreFullError("database or disk is full")

    ens._persist = full_once
