"""Test collections in BEIR format, and where to find them.

A BEIR folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv`` (a header, then
``query-id, corpus-id, score``). The one setting ``RLFB_DATASETS`` names the
folder that holds such collections by name.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlfb.errors import CorruptStateError, ValidationError
from rlfb.types import Chunk

__all__ = ["BeirDataset", "load_beir", "datasets_dir", "dataset_path", "DATASETS_ENV"]

DATASETS_ENV = "RLFB_DATASETS"


@dataclass(frozen=True)
class BeirDataset:
    """A loaded collection: the corpus as chunks, query texts, and graded judgments per split."""

    name: str
    corpus: list[Chunk]
    queries: Mapping[str, str]
    qrels: Mapping[str, Mapping[str, Mapping[str, int]]]  # split -> query id -> doc id -> grade

    def split(self, name: str = "test") -> Mapping[str, Mapping[str, int]]:
        """Judgments of one split; :class:`ValidationError` lists the splits that exist."""
        try:
            return self.qrels[name]
        except KeyError:
            raise ValidationError(f"{self.name} has no split {name!r}; it has {sorted(self.qrels)}") from None

    def split_queries(self, name: str = "test") -> dict[str, str]:
        """Query texts of the judged queries of one split, in a stable order."""
        qrels = self.split(name)
        return {q: self.queries[q] for q in sorted(qrels, key=_natural) if q in self.queries}


def _natural(key: str) -> tuple[int, str]:
    return (0, f"{int(key):012d}") if key.isdigit() else (1, key)


def datasets_dir() -> Path | None:
    """The folder named by ``RLFB_DATASETS``, or ``None`` when the setting is absent."""
    value = os.environ.get(DATASETS_ENV)
    return Path(value) if value else None


def dataset_path(name: str) -> Path:
    """Path of collection ``name`` under ``RLFB_DATASETS`` (it may not exist)."""
    base = datasets_dir()
    if base is None:
        raise ValidationError(f"set {DATASETS_ENV} to the folder that holds the BEIR collections")
    return base / name


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise CorruptStateError(f"{path}:{lineno}: not JSON: {exc}") from exc
    return rows


def load_beir(path: str | Path, *, name: str | None = None) -> BeirDataset:
    """Load a BEIR folder: every ``qrels/*.tsv`` becomes a split.

    Chunk text is ``title + " " + text``, as BEIR evaluates it; the title is
    kept in the metadata too.
    """
    root = Path(path)
    if not (root / "corpus.jsonl").is_file():
        raise ValidationError(f"{root} is not a BEIR folder: corpus.jsonl is missing")
    corpus = []
    for row in _read_jsonl(root / "corpus.jsonl"):
        title = (row.get("title") or "").strip()
        text = row.get("text") or ""
        corpus.append(
            Chunk(str(row["_id"]), f"{title} {text}".strip(), {"title": title, **(row.get("metadata") or {})})
        )
    queries = {str(r["_id"]): r["text"] for r in _read_jsonl(root / "queries.jsonl")}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for tsv in sorted((root / "qrels").glob("*.tsv")):
        split: dict[str, dict[str, int]] = {}
        with open(tsv, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh, delimiter="\t")
            for row in reader:
                if not row or row[0] == "query-id":
                    continue
                split.setdefault(row[0], {})[row[1]] = int(float(row[2]))
        qrels[tsv.stem] = split
    if not qrels:
        raise ValidationError(f"{root} has no qrels/*.tsv")
    return BeirDataset(name or root.name, corpus, queries, qrels)
