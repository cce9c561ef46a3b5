"""Blocks: the numbers of a saved learned state as base64 strings, one per column (``rlfb.blocks``)."""

from __future__ import annotations

import pytest

from rlfb.blocks import decode_block, encode_block
from rlfb.errors import CorruptStateError

# Guards from the mutation audits (README, "Development"): each test fails on a bug that an audit planted
# (or found) and no other test caught, named in its docstring or comment.


def test_a_block_with_a_character_outside_base64_is_damage() -> None:
    """Bug guarded: base64 decoded without validation skipped stray characters and read a damaged block."""
    text = encode_block([0.25, 0.5])
    with pytest.raises(CorruptStateError, match="damaged"):
        decode_block({"x": text[:4] + "!" + text[4:]}, "x", 2, owner="the test's")


def test_a_decoded_block_is_a_native_writable_float_array() -> None:
    # a mutation review (2026-12-07): returned as decoded, a block was a read-only view of its base64 buffer
    import numpy as np

    a = decode_block({"x": encode_block([1.0, 2.0])}, "x", 2, owner="o")
    assert a.flags.writeable and a.dtype == np.float64 and a.dtype.isnative
    a += 1
    assert a.tolist() == [2.0, 3.0]
    e = decode_block({"e": encode_block([1.0], dtype="<f4")}, "e", 1, owner="o", dtype="<f4")
    assert e.flags.writeable and e.dtype == np.float32 and e.dtype.isnative
