"""What an adapter package says when the framework it adapts is not installed."""

from __future__ import annotations

from typing import NoReturn


def missing_framework(exc: ModuleNotFoundError, *, module: str, package: str, framework: str,
                      extra: str) -> NoReturn:
    """Raise ``exc`` again, or, where the module missing is ``module`` (the framework's), a
    ``ModuleNotFoundError`` that names the extra to install: a bare "No module named 'langchain_core'" said
    nothing of rlfb's extras.

    >>> try:
    ...     missing_framework(ModuleNotFoundError("No module named 'x'", name="x"), module="x", package="x_rlfb",
    ...                       framework="X", extra="x")
    ... except ModuleNotFoundError as exc:
    ...     print(exc)
    x_rlfb needs X, which is not installed, or not in a version it supports (No module named 'x'): pip install "rlfb[x]"
    """
    if (exc.name or "").split(".")[0] != module:
        raise exc
    raise ModuleNotFoundError(f"{package} needs {framework}, which is not installed, or not in a version it supports "
                              f'({exc}): pip install "rlfb[{extra}]"', name=exc.name) from exc
