"""The README's Python examples run as written (each in a fresh working folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3  # quick start, LangChain, LlamaIndex


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_readme_example_runs(number: int, tmp_path) -> None:
    # a process of its own, in a fresh folder: the examples write fb.db and attach global handlers
    script = tmp_path / f"example_{number}.py"
    script.write_text(BLOCKS[number], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_adapter_test_folders_collect_together() -> None:
    """``pytest tests/langchain tests/llamaindex`` (the Development section) collects: their two
    conftest.py share a module name, which ``--doctest-modules`` once imported twice and refused."""
    root = README.parent
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/langchain", "tests/llamaindex"],
        cwd=root, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "tests/langchain/" in done.stdout and "tests/llamaindex/" in done.stdout
