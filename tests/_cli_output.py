"""What a refused command leaves on the terminal, read the same way by the CLI tests."""

from __future__ import annotations

import pytest


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """Captured stderr, checked to be one ``rlfb: error: ...`` line, with nothing on stdout."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlfb: error: "), captured.err
    assert captured.out == ""
    return lines[0]
