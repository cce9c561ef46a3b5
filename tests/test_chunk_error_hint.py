"""Found by a new user's read of the README (2026-12-06): an error that says where ``Chunk`` comes from."""

from __future__ import annotations

import pytest

from rlfb import FeedbackEnsemble, ValidationError


def test_rerank_given_strings_says_which_chunk_it_takes() -> None:
    # "rerank: got str, not a Chunk" did not say where Chunk comes from, nor how one is made
    ens = FeedbackEnsemble.from_texts(["tides follow the moon", "lava flows"], retrievers=("bm25",))
    with pytest.raises(ValidationError, match=r"got str, not a Chunk \(rlfb\.Chunk\(id, text, metadata\)\)"):
        ens.rerank("tides", ["tides follow the moon"])  # type: ignore[list-item]
