"""``rlfb store``: inspect and export a feedback store.

``rlfb store stats FILE [--json] [--window-days N]``
    Row counts (events, retrieved chunks, feedback, rewards, flagged feedback),
    sliding-window statistics and the current weights; a newest snapshot no
    learner can be rebuilt from is named on stderr (and in ``snapshot_error``).
``rlfb store export FILE --jsonl OUT``
    One JSON line per (event, retrieved chunk) with the event's fields, the
    chunk's scores and its feedback (see ``FeedbackStore.export_rows``);
    ``OUT`` may be ``-`` for standard output.
``rlfb store drop-snapshot FILE VERSION``
    Delete one policy snapshot, a damaged one that a ``CorruptStateError``
    named (see ``FeedbackStore.drop_snapshot``); the feedback rows stay.

:func:`register` adds the ``store`` command to the main ``rlfb`` parser; each
leaf parser sets ``func`` (``args.func(args) -> int`` exit status). :func:`main`
runs the command on its own: ``main(["store", "stats", "fb.db", "--json"])``.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

from rlfb.errors import RlfbError

__all__ = ["register", "main", "cmd_stats", "cmd_export", "cmd_drop_snapshot"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``store stats``, ``store export`` and ``store drop-snapshot`` to argparse ``subparsers``; return the
    ``store`` parser."""
    store = subparsers.add_parser(
        "store",
        help="inspect and export a feedback store",
        description="Inspect and export an rlfb feedback store (SQLite).",
    )
    sub = store.add_subparsers(dest="store_command", metavar="COMMAND")
    sub.required = True

    stats = sub.add_parser("stats", help="row counts, windowed statistics and current weights")
    stats.add_argument("file", metavar="FILE", help="feedback store database")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument(
        "--window-days", type=float, default=None, metavar="N", help="sliding window in days (default: 90)"
    )
    stats.set_defaults(func=cmd_stats)

    export = sub.add_parser("export", help="write events joined with their chunks and feedback as JSONL")
    export.add_argument("file", metavar="FILE", help="feedback store database")
    export.add_argument("--jsonl", required=True, metavar="OUT",
                        help="output file ('-' or /dev/stdout for standard output)")
    export.set_defaults(func=cmd_export)

    drop = sub.add_parser("drop-snapshot", help="delete one policy snapshot (a damaged one an error named)")
    drop.add_argument("file", metavar="FILE", help="feedback store database")
    drop.add_argument("version", metavar="VERSION", help="the snapshot's version")
    drop.set_defaults(func=cmd_drop_snapshot)
    return store


def _open(path: str, *, reading: bool = True) -> Any:
    """The store at ``path``; where the command only reads it (``reading``), one that cannot be written is read
    from a copy (:func:`rlfb.commands.store_for_reading`)."""
    from rlfb.commands import store_file, store_for_reading
    from rlfb.store import FeedbackStore

    if not Path(path).is_file():
        raise FileNotFoundError(f"no feedback store at {path}")  # as `rlfb weights` words it
    path = store_file(path)
    return store_for_reading(path) if reading else FeedbackStore(path)


def _fail(message: str | BaseException) -> int:
    from rlfb.cli import describe_error

    text = describe_error(message) if isinstance(message, BaseException) else message
    print(f"rlfb: error: {text}", file=sys.stderr)  # the one error line every rlfb command prints
    return 2


def cmd_stats(args: argparse.Namespace) -> int:
    """``store stats``."""
    from rlfb.weight_config import damaged_state, sound_kinds

    days = args.window_days
    # checked here to name the days given; 1e308 days is an infinite number of seconds
    if days is not None and not (math.isfinite(days) and days > 0):
        return _fail(f"--window-days must be a positive number of days, got {days:g}")
    if days is not None and not math.isfinite(days * 86400.0):
        return _fail(f"--window-days {days:g} is too large: its seconds overflow")
    try:
        with _open(args.file) as store:
            window = None if args.window_days is None else args.window_days * 86400.0
            stats = store.stats(window)
            damage = damaged_state(store)
            # a damaged state is grouped as a kind of its own: "the newest snapshot of 2 kinds" named it so
            kinds = sound_kinds(store) if stats["snapshot_kinds"] > 1 else None
    except (FileNotFoundError, sqlite3.DatabaseError, RlfbError) as exc:
        return _fail(exc)
    # the counts are sound whatever the snapshot holds; its damage is said, not shown as sound weights
    if damage is not None:
        stats["snapshot_error"] = str(damage)  # the learner state's damage too, not only the weights'
    if kinds is not None:
        stats["snapshot_kinds"] = len(kinds)
    if stats["snapshot_error"] is not None:
        print(f"rlfb: warning: {stats['snapshot_error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(stats, indent=2, ensure_ascii=True))
        return 0
    win = stats["window"]
    days = win["seconds"] / 86400.0
    print(f"store            {stats['path']}")
    for name in ("events", "chunks", "feedback", "rewards", "flagged"):
        print(f"{name:<16} {stats[name]:>10,}   (last {days:g} days: {win[name]:,})")
    if stats.get("unlearned"):  # feedback an ensemble of its decision's kind learns when it next refreshes
        print(f"{'not learned yet':<16} {stats['unlearned']:>10,}")
    if stats.get("held"):  # learned by a running ensemble, not yet in a snapshot: learned again if it stops first
        print(f"{'held unwritten':<16} {stats['held']:>10,}")
    mean = stats["mean_reward"]
    shown = "-" if mean is None else f"{mean:+.3f}"
    print(f"mean reward      {shown:>10}   over {win['rewarded_events']:,} rewarded events")
    weights = stats["weights"]
    if weights is None and stats["policy_version"]:
        print(f"weights          v{stats['policy_version']} damaged (named on stderr)")
    elif weights is None:
        print("weights          (no policy snapshot)")
    else:
        print(f"weights          v{stats['policy_version']} {stats['policy'] or ''}".rstrip())
        for name, w in weights.items():
            print(f"  {name:<14} {w!r}" if isinstance(w, dict) else f"  {name:<14} {w:.4f}")
        if stats["snapshot_kinds"] > 1:
            print(f"  (the newest snapshot of {stats['snapshot_kinds']} kinds of ensemble on this file: "
                  "`rlfb weights show --retrievers A,B` shows another's)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``store export``."""
    from rlfb.commands import (
        STDOUT,
        check_output_name,
        output_target,
        parent_made,
        prepare_output_file,
        reader_gone,
        refuse_overwriting_store,
    )

    # /dev/stdout is stdout, as "-" is: written as a file, a redirected stdout was replaced by a rename
    to_stdout = output_target(args.jsonl) == STDOUT
    try:
        check_output_name("--jsonl", args.jsonl)  # '' said "Is a directory: ."
        if not to_stdout:  # before the store is opened: exporting onto it would destroy it
            refuse_overwriting_store(args.jsonl, args.file)
            prepare_output_file(args.jsonl)  # its folder can be made (made once the store opened); not a folder
        with _open(args.file) as store:
            if to_stdout:
                n = store.export_jsonl(sys.stdout.buffer)
                sys.stdout.buffer.flush()
            else:
                with parent_made(args.jsonl) as out:  # a failed export leaves no new empty folders
                    n = store.export_jsonl(out)
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error, as for any Unix filter
        reader_gone()
        return 0
    except (FileNotFoundError, sqlite3.DatabaseError, RlfbError, OSError) as exc:
        return _fail(exc)
    print(f"wrote {n} rows to {args.jsonl}", file=sys.stderr)
    return 0


def cmd_drop_snapshot(args: argparse.Namespace) -> int:
    """``store drop-snapshot``."""
    from rlfb.commands import snapshot_version

    version = snapshot_version(args.version)
    if version is None:
        return _fail(f"VERSION must be a snapshot's version, a whole number, got {args.version!r}")
    try:
        with _open(args.file, reading=False) as store:
            dropped = store.drop_snapshot(version)
            left = store.state_version()
    except (FileNotFoundError, sqlite3.DatabaseError, RlfbError) as exc:
        return _fail(exc)
    if not dropped:
        return _fail(f"{args.file} holds no policy snapshot {version}")
    print(f"dropped policy snapshot {version} of {args.file}; the newest is now {left or 'none'}. Restart the "
          "processes that share the store: the next snapshot written may take the dropped one's version",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``rlfb store ...`` on its own (for tests and ``python -m rlfb.commands.store``)."""
    parser = argparse.ArgumentParser(prog="rlfb")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
