"""Argument types the benchmark scripts share: a count out of range is a one-line usage error (exit status 2),
not a traceback from deep in the run (``--queries 0`` died in ``statistics.median``, ``--rounds 0`` in a
division). Each script puts its own folder on ``sys.path`` before importing this, so that it is found when the
script is loaded by path (as the tests load some) as well as when it is run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``minimum``, else an ``ArgumentTypeError`` that argparse
    prints as ``argument --NAME: must be at least 1, got 0`` (and exits with status 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 seed``, ``2 seeds``; ``many`` where adding an s does not make the plural (``query``, ``queries``)."""
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def collection_folder(name: str) -> Path:
    """The folder of the collection ``name`` (a path, else a name under ``RLFB_DATASETS`` or the checkout's sibling
    ``../shared/datasets``, as the CLI takes it); ``ValueError`` saying where it was looked for, where none is."""
    from rlfb.datasets import DATASETS_ENV, datasets_dir, find_dataset
    from rlfb.errors import RlfbError

    try:
        folder = find_dataset(name)
    except RlfbError as exc:
        raise ValueError(str(exc)) from exc
    if not folder.is_dir():
        unset = "" if datasets_dir() is not None else (
            f"; set {DATASETS_ENV} to the folder that holds the BEIR collections, or give the collection's path")
        raise ValueError(f"no collection at {folder}{unset}")
    return folder
