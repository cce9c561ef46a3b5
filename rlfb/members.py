"""Search-only ensemble members: any search engine that returns chunks, with or without scores.

A member is how a user keeps the search engine they have (a vector store over
Chroma, FAISS, Elasticsearch, Qdrant, ...) and still learns the fusion
weights. The ensemble asks it for its best chunks; chunks it did not return
get no score from it (NaN, which normalisation maps to 0). A member that
returns no scores is fused by rank: its k-th result gets ``1 / (c + k)``. So is
one that leaves any result without a finite score, for that query: a rank score
next to raw scores would sit on another scale (a first hit without a score would
be fused as its worst).

>>> from rlfb.types import Chunk
>>> m = SearchMember("kb", lambda q, k: [(Chunk("a", "alpha"), None), (Chunk("b", "beta"), None)])
>>> [(c.id, round(s, 4)) for c, s in m.search(query="x", k=2, c=60)]
[('a', 0.0164), ('b', 0.0161)]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rlfb.errors import ValidationError
from rlfb.types import Chunk, check_chunk, validate_k

__all__ = ["SearchMember", "SearchFn"]

SearchFn = Callable[[str, int], Sequence[tuple[Chunk, "float | None"]]]


class SearchMember:
    """Wrap ``search(query, k) -> [(Chunk, score or None), ...]`` (best first) as an ensemble member."""

    def __init__(self, name: str, search: SearchFn) -> None:
        if not isinstance(name, str) or not name:
            raise ValidationError("a member needs a non-empty name")
        if not callable(search):
            raise ValidationError(f"member {name!r}: search must be callable")
        self.name = name
        self._search = search

    @property
    def function(self) -> SearchFn:
        """The ``search(query, k)`` function this member wraps."""
        return self._search

    def search(self, query: str, k: int, *, c: float = 60.0) -> list[tuple[Chunk, float]]:
        """The member's chunks for ``query``, each with a finite score (rank-based where it gave none)."""
        validate_k(k)
        out: list[tuple[Chunk, float | None]] = []
        seen: set[str] = set()
        found = self._search(query, k)
        if found is None or isinstance(found, (str, bytes)) or not hasattr(found, "__iter__"):
            raise ValidationError(
                f"member {self.name!r} returned {type(found).__name__}: it must return a sequence of "
                "(Chunk, score or None) pairs"
            )
        for item in found:
            try:
                chunk, score = item
                if isinstance(score, (str, bytes)):  # "1.0" read as 1.0 hid a member that returns text
                    raise TypeError("a score must be a number")
                score = None if score is None else float(score)
            except OverflowError:  # an int beyond float range
                raise ValidationError(f"member {self.name!r} returned a score beyond float range for "
                                      f"{getattr(item[0], 'id', item[0])!r}") from None
            except (TypeError, ValueError):
                raise ValidationError(
                    f"member {self.name!r} returned {item!r}: each result must be a (Chunk, score or None) pair"
                ) from None
            check_chunk(chunk, f"member {self.name!r}")
            if chunk.id in seen:  # a member listing one chunk twice keeps its best position
                continue
            seen.add(chunk.id)
            out.append((chunk, score if score is not None and math.isfinite(score) else None))
        if any(score is None for _, score in out):  # by rank, in the member's own order
            return [(chunk, 1.0 / (c + rank)) for rank, (chunk, _) in enumerate(out, start=1)]
        return out  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"SearchMember({self.name!r})"
