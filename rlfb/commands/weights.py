"""``rlfb weights show|export|import``: the weight configuration centre on a feedback store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("weights", help="show, export or import the fusion weights kept in a feedback store")
    wsub = p.add_subparsers(dest="weights_command", metavar="ACTION")
    wsub.required = True
    show = wsub.add_parser("show", help="print the current weights")
    show.add_argument("store", help="the feedback store (SQLite file)")
    show.add_argument("--json", action="store_true", help="print JSON")
    _kind_options(show)
    show.set_defaults(func=run_show)
    exp = wsub.add_parser("export", help="write the current weights and learner state to a JSON file")
    exp.add_argument("store", help="the feedback store (SQLite file)")
    exp.add_argument("file", help="the JSON file to write (not the store itself); - (or /dev/stdout) writes to "
                                  "stdout")
    exp.add_argument("--weights-only", action="store_true", help="leave the learner state out")
    _kind_options(exp)
    exp.set_defaults(func=run_export)
    imp = wsub.add_parser("import", help="validate a JSON weights file and make it the current weights")
    imp.add_argument("store", help="the feedback store (SQLite file)")
    imp.add_argument("file", help="a JSON file written by 'rlfb weights export'")
    imp.add_argument("--rollback", action="store_true",
                     help="import a learner state that learned from fewer feedbacks than the store's newest "
                          "snapshot of its kind (refused otherwise): roll the store back to it on purpose")
    # a store shared by apps of other retrievers or another policy: its newest snapshot may be another app's,
    # whose state cannot take these weights (a --weights-only export of one kind did not import again)
    imp.add_argument("--retrievers", type=_names, metavar="A,B",
                     help="put weights alone onto the newest snapshot of the ensemble with these retrievers "
                          "(comma-separated, any order), where the store holds snapshots of several kinds "
                          "(default: the newest snapshot, or the one kind of the weights' retrievers)")
    imp.add_argument("--policy", help="put weights alone onto the newest snapshot of the ensemble with this "
                                      "policy (into a store with no snapshot: the new state's policy)")
    imp.add_argument("--version", type=_version,
                     help="put weights alone onto this snapshot, the newest of its kind (`weights show` lists them)")
    imp.set_defaults(func=run_import)


def _kind_options(parser: argparse.ArgumentParser) -> None:
    # apps with other retrievers or another policy can share one store: the newest snapshot is one of theirs
    parser.add_argument("--retrievers", type=_names, metavar="A,B",
                        help="the snapshot of the ensemble with these retrievers (comma-separated, any order), "
                             "where the store holds snapshots of several kinds")
    parser.add_argument("--policy", help="the snapshot of the ensemble with this policy")
    parser.add_argument("--version", type=_version, help="the snapshot of this version (`weights show` lists them)")


def _version(value: str) -> int:
    from rlfb.commands import snapshot_version

    version = snapshot_version(value)
    if version is None or version < 1:
        raise argparse.ArgumentTypeError(f"a snapshot version is a whole number, 1 or more, got {value!r}")
    return version


def _names(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give the retrievers' names, comma-separated")
    return names


def _kind(args: argparse.Namespace) -> dict[str, Any]:
    return {"retrievers": args.retrievers, "policy": args.policy, "version": args.version}


@contextmanager
def _open(path: str, *, reading: bool = True) -> Iterator[Any]:
    """The feedback store at ``path`` (one that cannot be written is read from a copy where the command only
    reads, ``reading``); a file that is not one raises :class:`CorruptStateError` naming it."""
    import sqlite3

    from rlfb.commands import store_file, store_for_reading
    from rlfb.errors import CorruptStateError, RlfbError, ValidationError
    from rlfb.store import FeedbackStore

    if not Path(path).is_file():
        raise ValidationError(f"no feedback store at {path}")
    path = store_file(path)
    try:
        with store_for_reading(path) if reading else FeedbackStore(path) as store:
            yield store
    except RlfbError:  # already named: a busy store (StoreBusyError) is not a damaged one
        raise
    except sqlite3.DatabaseError as exc:  # sqlite's message ("file is not a database") does not say which file
        raise CorruptStateError(f"{path} is not a readable feedback store: {exc}") from exc


def run_show(args: argparse.Namespace) -> int:
    from rlfb.weight_config import NO_WEIGHTS_YET, current_weights, describe_kind

    with _open(args.store) as store:
        info = current_weights(store, **_kind(args))
    if not info["version"]:
        # a store no ensemble has written a snapshot to: said as `weights export` says it, and with no weights in
        # the JSON (an empty mapping, "policy None, version 0", read as a snapshot of no retrievers); a report,
        # as `store stats` reports it, so exit 0
        info = {**info, "weights": None}
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(NO_WEIGHTS_YET)
        return 0
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"policy {info['policy']}, version {info['version']}")
        for name, w in info["weights"].items():
            print(f"  {name:<12}{w:.4f}" if isinstance(w, float) else f"  {name:<12}{w}")
        others = [k for k in info["kinds"] if k["version"] != info["version"]]
        if others and len(others) == len(info["kinds"]):  # --version named one that is no kind's newest
            print("an older snapshot; the newest of each kind of ensemble on the store:")
            for k in info["kinds"]:
                print(f"  {describe_kind(k)}")
        elif others:  # another app's weights on the same file: which of them this was is worth saying
            print(f"the store holds snapshots of {len(info['kinds'])} kinds of ensemble; the newest of the others "
                  "(--retrievers and --policy, or --version, pick one):")
            for k in others:
                print(f"  {describe_kind(k)}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from rlfb.commands import (
        STDOUT,
        check_output_name,
        output_target,
        prepare_output_file,
        refuse_overwriting_store,
        write_output,
    )

    check_output_name("the output", args.file)  # '' said "Is a directory: ."

    # "-" as `store export --jsonl -` (a file named "-" was written), and /dev/stdout as "-": written as a file, a
    # redirected stdout was replaced by a rename
    if output_target(args.file) == STDOUT:
        with _open(args.store) as store:
            out = _export(store, args)
        print(json.dumps(out, indent=2))
        return 0
    refuse_overwriting_store(args.file, args.store)  # before opening: writing JSON over the store destroys it
    prepare_output_file(args.file)  # a folder named as the file is refused now; a missing one is made at write
    with _open(args.store) as store:
        out = _export(store, args)
    write_output(args.file, json.dumps(out, indent=2))
    # on stderr, as `store export` says it: `weights export STORE /dev/stdout` wrote it after the JSON
    print(f"wrote version {out['version']} to {args.file}", file=sys.stderr)
    return 0


def _export(store: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What ``weights export`` writes; of weights alone whose snapshot's state is damaged, with a note saying so."""
    from rlfb.weight_config import export_weights, snapshot_damage

    out = export_weights(store, None, with_state=not args.weights_only, **_kind(args))
    damage = snapshot_damage(store, int(out["version"])) if args.weights_only else None
    if damage is not None:
        print(f"rlfb: note: {damage}; its weights alone, which are sound, were exported", file=sys.stderr)
    return out


def run_import(args: argparse.Namespace) -> int:
    from rlfb.weight_config import import_weights, read_weights_file

    weights_file = read_weights_file(args.file)  # a bad file is refused before the store is opened (and migrated)
    with _open(args.store, reading=False) as store:
        out = import_weights(store, weights_file, rollback=args.rollback, **_kind(args))
    for note in out["notes"]:  # on stderr, so that stdout stays the one result line
        print(f"rlfb: note: {note}", file=sys.stderr)
    shown = ", ".join(f"{name} {w:.4f}" for name, w in out["weights"].items())  # as `weights show` prints them
    print(f"{'imported as' if out['written'] else 'already'} version {out['version']}: {shown}")
    return 0
