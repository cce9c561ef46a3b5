"""``rlfb cache``: see and bound the on-disk embedding cache.

``rlfb cache stats [--dir DIR] [--json]``
    The cache file's size, and per model key its entries, bytes and last use;
    and the bound that writes keep (``$RLFB_CACHE_MAX_MB``), if any.
``rlfb cache prune [--dir DIR] [--max-mb N] [--unused-days D] [--no-vacuum] [--json]``
    Remove the encodings unused for ``D`` days, then the least recently used
    beyond ``N`` MB (see :func:`rlfb.retrievers.cache_admin.prune_cache`); what is
    removed is encoded again when next needed. Run it from cron, say, to keep
    a long-lived service's cache bounded.

``DIR`` defaults to ``$RLFB_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlfb``, else ``~/.cache/rlfb``. A
``--dir`` that does not exist or is not a folder is an error; a folder (the default included) that holds no cache file
yet is reported as having none, and none is made. A file of that name that is a SQLite database
without the cache's table (another program's) is refused and left as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rlfb.errors import ValidationError

__all__ = ["register", "cmd_stats", "cmd_prune"]


_DIR_HELP = "cache folder (default: $RLFB_CACHE_DIR, else $XDG_CACHE_HOME/rlfb where that is set, else ~/.cache/rlfb)"
#: the table every cache file holds (rlfb.retrievers.cache_file's schema)
_CACHE_TABLE = "encodings"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``cache stats`` and ``cache prune`` to argparse ``subparsers``; return the ``cache`` parser."""
    cache = subparsers.add_parser(
        "cache",
        help="see and bound the on-disk embedding cache",
        description="See and bound the on-disk embedding cache (default $RLFB_CACHE_DIR, else "
                    "$XDG_CACHE_HOME/rlfb where that is set, else ~/.cache/rlfb).",
    )
    sub = cache.add_subparsers(dest="cache_command", metavar="COMMAND")
    sub.required = True

    stats = sub.add_parser("stats", help="the cache's size, and per model its entries, bytes and last use")
    stats.add_argument("--dir", default=None, metavar="DIR", help=_DIR_HELP)
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(func=cmd_stats)

    prune = sub.add_parser("prune", help="remove unused or least recently used encodings")
    prune.add_argument("--dir", default=None, metavar="DIR", help=_DIR_HELP)
    prune.add_argument("--max-mb", type=float, default=None, metavar="N",
                       help="keep at most N MB of encodings, the most recently used")
    prune.add_argument("--unused-days", type=float, default=None, metavar="D",
                       help="remove encodings unused for D days")
    prune.add_argument("--no-vacuum", action="store_true",
                       help="do not give the freed space back to the file system")
    prune.add_argument("--json", action="store_true", help="print JSON")
    prune.set_defaults(func=cmd_prune)
    return cache


def cmd_stats(args: argparse.Namespace) -> int:
    """``cache stats``."""
    from rlfb.retrievers.cache_admin import cache_stats
    from rlfb.retrievers.cache_file import default_max_mb

    _check_dir(args.dir)
    stats = {**cache_stats(args.dir), "max_mb": default_max_mb()}
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    made = Path(stats["path"]).is_file()
    print(f"{stats['path']}: {_mb(stats['file_bytes'])} on disk" if made
          else f"{stats['path']}: no cache file yet (nothing encoded there)")
    bound = stats["max_mb"]
    print(f"  writes keep it within RLFB_CACHE_MAX_MB={bound:g} MB" if bound is not None
          else "  no bound while writing (set RLFB_CACHE_MAX_MB, or run rlfb cache prune)")
    if made and not stats["models"]:
        print("  (no encodings)")
    for m in stats["models"]:
        print(f"  {m['model_key']}: {m['entries']:,} encodings, {_mb(m['bytes'])}, "
              f"last used {_day(m['latest_use'])}, least recently {_day(m['oldest_use'])}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """``cache prune``."""
    from rlfb.retrievers.cache_admin import check_prune_bounds, prune_cache

    if args.max_mb is None and args.unused_days is None:
        print("rlfb: error: cache prune needs --max-mb, --unused-days or both", file=sys.stderr)
        return 2
    check_prune_bounds(args.max_mb, args.unused_days, ("--max-mb", "--unused-days"))  # named as typed
    _check_dir(args.dir)
    report = prune_cache(args.dir, max_mb=args.max_mb, unused_days=args.unused_days, vacuum=not args.no_vacuum)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['path']}: removed {report['removed']:,} encodings; encodings "
          f"{_mb(report['bytes_before'])} -> {_mb(report['bytes_after'])}, on disk "
          f"{_mb(report['file_bytes_before'])} -> {_mb(report['file_bytes_after'])}")
    return 0


def _check_dir(directory: str | None) -> None:
    """Raise :class:`ValidationError` unless ``directory`` (``None``: the default) can hold the cache.

    The cache functions treat any path without a cache file as an empty cache, so a mistyped
    ``--dir`` would report "no encodings" or "removed 0". A ``--dir`` must be an existing folder.
    The default folder may not exist yet (nothing was ever encoded): that is an empty cache, not
    an error; but when it exists it must be a folder too. In either, ``embeddings.sqlite`` must
    be a file if it exists, and not another program's database (:func:`_refuse_foreign_file`).
    """
    from rlfb.retrievers.cache_file import _cache_file

    if directory is not None and not directory.strip():
        raise ValidationError("no embedding cache at '': --dir needs a folder")
    file = _cache_file(directory)  # where the cache functions look, so the check cannot drift from them
    folder = file.parent
    shown = folder if directory is None else directory
    if directory is not None and not folder.exists():
        raise ValidationError(f"no embedding cache at {shown}: no such folder")
    if folder.exists() and not folder.is_dir():
        raise ValidationError(f"no embedding cache at {shown}: not a folder")
    if file.exists() and not file.is_file():
        raise ValidationError(f"no embedding cache at {shown}: {file} is not a file")
    _refuse_foreign_file(file)


def _refuse_foreign_file(file: Path) -> None:
    """Raise :class:`ValidationError` where ``file`` is a SQLite database with tables but not the cache's: opening
    it as the cache (stats and prune do) writes the table into another program's file. Read without changing it;
    a missing or empty file is no cache yet, nor is one with no table at all (what an encoder stopped between
    setting the file's journal mode and making its table leaves, and uses as its cache), and one SQLite cannot
    read is the cache functions' to name."""
    from rlfb.commands import sqlite_tables

    if not file.is_file() or file.stat().st_size == 0:
        return
    tables = sqlite_tables(file)
    if tables and _CACHE_TABLE not in tables:
        held = f"other tables {tables[:5]}"
        raise ValidationError(
            f"{file} is not an rlfb embedding cache: it holds {held}; left as it is (move it away, and rlfb "
            "makes its cache there when it next encodes)"
        )


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


def _day(ts: int) -> str:
    # 0: written before rlfb tracked use, and not read since
    return "unknown" if ts <= 0 else time.strftime("%Y-%m-%d", time.gmtime(ts))
