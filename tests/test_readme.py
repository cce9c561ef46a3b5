"""The README's Python examples run as written (each in a fresh working folder, and again in the same one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from _readme import BLOCKS, README


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3  # quick start, LangChain, LlamaIndex


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_readme_example_runs(number: int, tmp_path) -> None:
    # a process of its own, in a fresh folder: the examples write fb.db and attach global handlers. A user
    # runs a copied example again, in the same folder: its store and saved folders are there the second time
    # (a fixed idempotency key in one example was refused on the second run, 2026-12-07).
    script = tmp_path / f"example_{number}.py"
    script.write_text(BLOCKS[number], encoding="utf-8")
    for run in ("first", "second"):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert done.returncode == 0, f"{run} run:\n{done.stderr[-3000:]}"


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


def test_the_command_line_synopsis_names_each_commands_options_and_defaults() -> None:
    """Every option the README's synopsis gives a command is that command's, and a default it shows is the
    parser's (``--split test``, resolved later, has none there to compare)."""
    import argparse

    from rlfb.cli import build_parser

    block = README.read_text(encoding="utf-8").split("## Command line", 1)[1].split("```bash\n", 1)[1]
    block = block.split("```", 1)[0].replace("\\\n", " ").replace("\n", " ")
    segments = re.findall(r"rlfb ((?:[a-z][a-z-]* )+)(.*?)(?=rlfb |\Z)", block, flags=re.S)
    assert len(segments) == 11  # evaluate, simulate, demo; three of store, three of weights, two of cache

    def sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return actions[0].choices.get(name) if actions else None

    seen = set()
    for words, rest in segments:
        path: list[str] = []
        parser = build_parser()
        for word in words.split():
            inner = sub(parser, word)
            if inner is None:
                break
            parser, path = inner, [*path, word]
        assert path, words
        seen.add(" ".join(path))
        options = {s: a for a in parser._actions for s in a.option_strings}
        for flag, value in re.findall(r"(--[a-z][a-z-]*)(?:[ =]([^\]\s]+))?", rest):
            assert flag in options, f"rlfb {' '.join(path)} has no {flag}"
            default = options[flag].default
            if value and not re.search(r"[A-Z|]", value) and default is not None and not isinstance(default, bool):
                same = float(value) == float(default) if isinstance(default, (int, float)) else value == str(default)
                assert same, f"rlfb {' '.join(path)} {flag}: README says {value}, the parser {default!r}"
    assert {"evaluate", "simulate", "demo", "store stats", "weights import", "cache prune"} <= seen


def test_the_figures_at_a_glance_are_the_results_tables() -> None:
    """The summary at the top quotes the results table (thompson's and RRF's held-out and seen figures, and the
    tuned weights on Cranfield): a table measured again must not leave the summary behind."""
    text = README.read_text(encoding="utf-8")
    glance = " ".join(text.split("**At a glance**", 1)[1].split("## Install", 1)[0].split())
    rows = {(c, s): cells for c, s, *cells in (
        [x.strip().strip("*") for x in line.strip("|").split("|")]
        for line in text.splitlines() if re.match(r"\| (scifact|cranfield|cisi) \| ", line))}

    def figures(system: str, column: int) -> str:
        scifact, cranfield, cisi = (rows[(c, system)][column] for c in ("scifact", "cranfield", "cisi"))
        return f"{scifact}, {cranfield} and {cisi}"

    for column in (0, 1):  # held-out, seen
        assert f"{figures('thompson', column)} " in glance and f"RRF's {figures('rrf', column)}" in glance
    assert f"on Cranfield ({rows[('cranfield', 'tuned_fixed')][0]})" in glance
