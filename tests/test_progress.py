"""Progress bars: no "IProgress not found" warning in a notebook without ipywidgets, and no notebook
modules imported for a bar that is off or shown outside a notebook."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from rlfb import _progress


def test_a_bar_is_tqdms_text_bar_without_ipywidgets_and_warns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # tqdm.auto chose the notebook bar in Jupyter and warned "IProgress not found" at every bar, disabled ones
    # too, where ipywidgets is not installed
    from tqdm import std

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # as in a Jupyter kernel
    _progress._notebook_bar_class.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for disable in (True, False):
                bar = _progress.progress(range(3), disable=disable, file=sys.stderr)
                assert list(bar) == [0, 1, 2]
                assert type(bar) is std.tqdm  # not tqdm.auto's (a notebook's, or asyncio's outside one)
    finally:
        _progress._notebook_bar_class.cache_clear()


def test_a_notebook_with_ipywidgets_gets_the_widget_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ipywidgets")
    from tqdm import auto

    monkeypatch.setitem(sys.modules, "ipykernel", sys)
    _progress._notebook_bar_class.cache_clear()
    try:
        assert _progress._notebook_bar_class() is auto.tqdm
    finally:
        _progress._notebook_bar_class.cache_clear()


@pytest.mark.parametrize("disable", [True, False])
def test_a_bar_outside_a_notebook_imports_no_notebook_module(disable: bool) -> None:
    # a bar that is off, made at each cache miss of the library's encodings, imported ipywidgets and IPython
    # (0.2 to 0.4 s) into a process that showed no bar; a fresh interpreter, as sys.modules here holds them
    code = ("import sys; from rlfb._progress import progress; "
            f"list(progress(range(2), disable={disable}, file=sys.stderr)); "
            "print(sorted(m for m in ('ipywidgets', 'IPython', 'ipykernel') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loads_in_several_threads_leave_hugging_faces_bars_as_they_were() -> None:
    # each load turned the process-wide switch off and back on: one thread's end turned the bars on under
    # another's load, and a load begun while the switch was off left it off for good
    hf_logging = pytest.importorskip("transformers.utils.logging")
    from rlfb.retrievers.models import no_loading_bars

    hf_logging.enable_progress_bar()
    first, second = no_loading_bars(hf_logging), no_loading_bars(hf_logging)
    first.__enter__()
    second.__enter__()  # a second thread's load, begun while the first runs
    first.__exit__(None, None, None)
    assert not hf_logging.is_progress_bar_enabled()  # the second load is still running
    second.__exit__(None, None, None)
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a user who turned them off keeps them off
    with no_loading_bars(hf_logging):
        pass
    assert not hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
