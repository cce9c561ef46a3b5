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
