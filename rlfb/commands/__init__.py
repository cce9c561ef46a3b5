"""Sub-commands of the ``rlfb`` console script, one module each (see :mod:`rlfb.cli`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["prepare_output_dir", "prepare_output_file"]


def prepare_output_dir(folder: str | Path) -> Path:
    """Create ``folder`` now and check it is writable, so a bad ``--out`` fails before a long run, not after it.

    Raises ``OSError`` (``FileExistsError`` when ``folder`` is a regular file), which the CLI reports in one line.
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return path


def prepare_output_file(file: str | Path) -> Path:
    """Prepare the folder of output ``file`` (see :func:`prepare_output_dir`); refuse a folder as the file."""
    path = Path(file)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    prepare_output_dir(path.parent)
    return path
