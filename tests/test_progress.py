"""Progress bars: no "IProgress not found" warning in a notebook without ipywidgets."""

from __future__ import annotations

import sys
import warnings

import pytest

from rlfb import _progress


def test_a_bar_is_tqdms_text_bar_without_ipywidgets_and_warns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # tqdm.auto chose the notebook bar in Jupyter and warned "IProgress not found" at every bar, disabled ones
    # too, where ipywidgets is not installed
    from tqdm import std

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # an import of it raises ImportError
    _progress._bar_class.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bar = _progress.progress(range(3), disable=True)
            assert list(bar) == [0, 1, 2]
        assert type(bar) is std.tqdm  # not tqdm.auto's (a notebook's, or asyncio's outside one)
    finally:
        _progress._bar_class.cache_clear()
