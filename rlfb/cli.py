"""The ``rlfb`` console script.

Each sub-command lives in its own module under :mod:`rlfb.commands` and adds
itself to the parser through a ``register(subparsers)`` function.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser"]

# module names under rlfb.commands, in the order `rlfb --help` lists them
COMMANDS = ("demo", "evaluate", "simulate", "store", "weights", "cache")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlfb", description="Reinforcement learning from feedback for retrieval: fusion weights that learn."
    )
    parser.add_argument("--version", action=_VersionAction, help="print rlfb's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rlfb.commands.{name}")
        except ModuleNotFoundError as exc:  # a command whose module is not part of this build
            if exc.name != f"rlfb.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def version() -> str:
    """The installed distribution's version; a source tree on ``sys.path`` without one says ``rlfb.__version__``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("rlfb")
    except PackageNotFoundError:
        from rlfb import __version__

        return __version__


class _VersionAction(argparse.Action):
    """``--version``: prints ``rlfb <version>`` on stdout and exits 0; the version is looked up only then."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit(0)


def describe_error(exc: BaseException) -> str:
    """One line for ``exc``: an OS error as its reason and file (both files of a rename), anything else as its
    message.

    >>> describe_error(OSError(18, "Invalid cross-device link", ".rlfb-1.tmp", None, "out.json"))
    'Invalid cross-device link: .rlfb-1.tmp -> out.json'
    >>> describe_error(ValueError("two\\n  lines"))
    'two lines'
    """
    if isinstance(exc, OSError) and exc.strerror:
        names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
        return f"{exc.strerror}: {' -> '.join(names)}" if names else exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


#: :func:`main`'s status after Ctrl-C, as a shell reports a program SIGINT ended.
INTERRUPTED = 130


def console() -> None:
    """The ``rlfb`` script (and ``python -m rlfb``): :func:`main`, exiting with its status. After Ctrl-C it ends
    by SIGINT itself, once it has said so in one line, as any program Ctrl-C stops: a shell loop or script that
    runs it stops too (with a status of 130 it took the interrupt for handled, and went on to the next)."""
    import os
    import signal

    ended_by = signal.SIGINT
    if os.name == "posix":
        def terminate(signum: int, frame: object) -> None:
            # SIGTERM (`timeout`, a service manager) ends it as Ctrl-C does: outputs written whole or not at all
            # (it killed an export outright, its temporary file left beside the target), then by SIGTERM itself
            nonlocal ended_by
            ended_by = signal.SIGTERM
            raise KeyboardInterrupt

        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # left ignored by the parent: stays so
            signal.signal(signal.SIGTERM, terminate)
    for stream in (sys.stdout, sys.stderr):
        _escape_unencodable(stream)
    code = main()
    if code == INTERRUPTED and os.name == "posix":
        for stream in (sys.stdout, sys.stderr):  # a process a signal ends writes out no buffer of its own
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader gone, a closed stream: nothing left to keep
                pass
        signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)
    sys.exit(code)


def _escape_unencodable(stream: Any) -> None:
    """Have ``stream`` write what its encoding cannot hold as ``\\xe9``-style escapes, where it would raise.

    A non-ASCII path printed to an ASCII terminal (``PYTHONIOENCODING=ascii``, an old ``LANG=C``) ended the
    command in a ``UnicodeEncodeError`` traceback, after its work or part way through its report. Only a
    stream that is ``strict`` changes: a UTF-8 terminal writes what it wrote before, and a stream set to other
    error handling (``surrogateescape`` for file names' raw bytes, say) keeps it. The script's streams only:
    :func:`main` called from Python leaves its caller's streams alone.
    """
    reconfigure = getattr(stream, "reconfigure", None)  # None (`>&-`), or a stream that is no TextIOWrapper
    if reconfigure is None or getattr(stream, "errors", None) != "strict":
        return
    try:
        reconfigure(errors="backslashreplace")
    except (OSError, ValueError):  # a closed stream: nothing will be written to it anyway
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 for bad input, with the reason on stderr).

    Bad input (an rlfb error), an unreadable or unwritable path (``OSError``) and a file that is
    not an SQLite database end with one ``rlfb: error: ...`` line, never a traceback. A reader
    that closes the output pipe early (``| head``) is not an error; Ctrl-C ends with ``rlfb: interrupted``
    and status 130.
    """
    import os
    import sqlite3
    import warnings

    from rlfb.errors import RlfbError

    parser = build_parser()
    args = parser.parse_args(argv)
    stdout = sys.stdout
    if stdout is None:  # started with stdout closed (`>&-`): what a command prints goes nowhere, as print's would
        stdout = open(os.devnull, "w", encoding="utf-8")  # lives as long as the process
    sys.stdout = _ReaderMayGo(stdout)  # a report cut short by `| head` must not cut the files' writing short
    shown = warnings.showwarning
    warnings.showwarning = _warning_line
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `rlfb ... --json | head`: the reader has what it wanted
        from rlfb.commands import reader_gone

        reader_gone()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the outputs are written whole or not at all, so one line says it all
        print("rlfb: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (RlfbError, OSError, sqlite3.DatabaseError) as exc:
        print(f"rlfb: error: {describe_error(exc)}", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
        warnings.showwarning = shown


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A warning as one ``rlfb: warning: ...`` line (a damaged embedding cache, say), not Python's two lines
    with the source line of the library that warned."""
    print(f"rlfb: warning: {' '.join(str(message).split())}", file=sys.stderr if file is None else file)


class _ReaderMayGo:
    """stdout that goes on quietly once the reader of its pipe is gone (``rlfb simulate ... | head -1``).

    A command prints its report and then writes its files; a ``BrokenPipeError`` from a print used to end
    the command there, exit status 0, with the JSON or the plot never written.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return int(self._stream.write(text))
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        from rlfb.commands import reader_gone

        self._gone = True
        reader_gone()

    def __getattr__(self, name: str) -> Any:  # buffer, fileno, isatty, encoding: the stream's own
        return getattr(self._stream, name)


if __name__ == "__main__":  # pragma: no cover
    console()  # as the rlfb script and python -m rlfb end: an interrupt said in one line, then by its signal
