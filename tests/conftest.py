"""Shared fixtures: where the real test collections are, and the rule for when they are missing.

The collections are read through one setting, ``RLFB_DATASETS``; without it,
the sibling ``../shared/datasets`` of the checkout is used when present. On a
user's machine they are absent and those tests skip with the reason. Under CI
(``CI=true``) a missing collection is a failure, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfb.datasets import datasets_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
if "RLFB_DATASETS" not in os.environ and (_found := datasets_dir()) is not None:
    os.environ["RLFB_DATASETS"] = str(_found)  # the checkout's sibling, for the notebooks nbmake runs too


def require_dataset(name: str) -> Path:
    """Path of collection ``name``; skips (or fails under CI) when it is not there."""
    base = os.environ.get("RLFB_DATASETS")
    path = Path(base) / name if base else None
    if path is not None and (path / "corpus.jsonl").is_file():
        return path
    reason = (
        f"test collection {name!r} not found: set RLFB_DATASETS to the folder holding the BEIR collections"
        + (f" (looked in {path})" if path else "")
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; under CI a missing collection is a failure")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def cranfield_path() -> Path:
    return require_dataset("cranfield")


@pytest.fixture(scope="session")
def scifact_path() -> Path:
    return require_dataset("scifact")


@pytest.fixture(scope="session")
def cisi_path() -> Path:
    return require_dataset("cisi")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Embedding caches go to a temporary folder unless the caller chose one, and so does matplotlib's
    configuration, which it otherwise writes under ``$HOME/.config`` the first time a test draws a plot."""
    if "RLFB_CACHE_DIR" not in os.environ:
        os.environ["RLFB_CACHE_DIR"] = str(tmp_path_factory.mktemp("rlfb-cache"))
    if "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = str(tmp_path_factory.mktemp("matplotlib"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Keep ``--doctest-modules`` off the conftest files: they hold no doctests, and importing the
    LangChain and LlamaIndex folders' two ``conftest.py`` as modules of one name clashes when both
    folders are named on one command line (``pytest tests/langchain tests/llamaindex``). pytest loads
    them as conftests all the same."""
    return True if collection_path.name == "conftest.py" else None
