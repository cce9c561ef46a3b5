"""The small corpus of the LangChain adapter tests: the one the ensemble tests use (``tests/_corpus.py``)."""

from __future__ import annotations

from _corpus import IDS, TEXTS

__all__ = ["IDS", "TEXTS"]
