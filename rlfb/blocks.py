"""Numbers of a saved learned state as base64 blocks: little-endian, bit-exact, one string per column.

The feedback memory, the chunk confidences, the replay buffer and the click evidence save their numbers this
way rather than as JSON lists (a list or dict per row was most of a snapshot's cost).

>>> text = encode_block([0.1, -0.0, 1e-300])
>>> decode_block({"x": text}, "x", 3, owner="the example's").tolist()
[0.1, -0.0, 1e-300]
>>> decode_block({"x": text}, "x", 2, owner="the example's")
Traceback (most recent call last):
...
rlfb.errors.CorruptStateError: the example's x block has the wrong size: 3 numbers, not 2
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfb.errors import CorruptStateError

__all__ = ["encode_block", "decode_block"]


def encode_block(values: Any, dtype: str = "<f8") -> str:
    """``values`` as base64 text of their ``dtype`` bytes (``"<f8"``, or ``"<f4"`` for embeddings)."""
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def decode_block(state: Mapping[str, Any], key: str, size: int, *, owner: str, dtype: str = "<f8") -> np.ndarray:
    """The block ``state[key]`` as a native, writable array of ``size`` finite numbers, or
    :class:`CorruptStateError` naming ``owner``'s block."""
    raw = state[key]
    if not isinstance(raw, str):
        raise CorruptStateError(f"{owner} {key} block is not base64 text")
    try:
        block = np.frombuffer(base64.b64decode(raw, validate=True), dtype=dtype)
    except ValueError as exc:  # not base64 (binascii.Error), or not a whole number of values
        raise CorruptStateError(f"{owner} {key} block is damaged: {exc}") from exc
    if block.size != size:
        raise CorruptStateError(f"{owner} {key} block has the wrong size: {block.size} numbers, not {size}")
    if not np.all(np.isfinite(block)):
        raise CorruptStateError(f"{owner} {key} block holds a non-finite number")
    return block.astype(np.float64 if dtype == "<f8" else np.float32)
