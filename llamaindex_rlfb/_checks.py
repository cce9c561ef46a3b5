"""Argument checks of the LlamaIndex adapter, run before pydantic so a bad option raises rlfb's error.

Pydantic's lax mode would read ``top_n=2.0`` as 2, ``explore="no"`` as ``False``
and ``top_n=True`` as 1, and wraps a validator's ``ValueError`` in its own
error. The rules are the core's, shared with the LangChain adapter.
"""

from __future__ import annotations

from rlfb.runs import finite_score, session_text
from rlfb.types import validate_flag, validate_k

__all__ = ["positive_count", "flag", "session_text", "finite_or_none"]

positive_count = validate_k  # a positive int (numpy integers too), never a bool or a float
flag = validate_flag  # a real bool: "no" or 0 is a mistake, not False
finite_or_none = finite_score  # a node's score, or None where it cannot be kept (NaN, an int beyond float range)
