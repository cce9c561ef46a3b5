"""Test collections in BEIR format, and where to find them.

A BEIR folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``), either of them gzipped as Hugging Face's BeIR
downloads ship them (``corpus.jsonl.gz``), and ``qrels/<split>.tsv`` (a header, then
``query-id, corpus-id, score``), which may be gzipped too (``qrels/test.tsv.gz``). The one setting
``RLFB_DATASETS`` names the folder that holds such collections by name.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfb.errors import CorruptStateError, EmptyCorpusError, ValidationError
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
    # split -> how many relevant judgments :func:`load_beir` left out of ``qrels`` because they name a
    # document that is not in the corpus (such a document can never be ranked: it only lowered every metric)
    unknown_judgments: Mapping[str, int] = field(default_factory=dict)
    # ids of queries that are documents of the corpus too, under the same id and with the same text (ArguAna, whose
    # questions are arguments of the corpus, and Quora): such a query finds itself first, which is not the task, so
    # runs leave its own document out of its ranking, as BEIR does (``ignore_identical_ids``). A query id that
    # names a document of other text (cranfield's query "1" and document "1") is no such query.
    query_documents: frozenset[str] = frozenset()
    # split -> a few of the document ids counted in ``unknown_judgments``, for the error of
    # :meth:`check_known_documents`: a count alone hid an id such as "184 " (a stray space) that no reader could see
    unknown_examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # every split the folder has a qrels file for, read or not (load_beir's ``splits``): what an unknown split's
    # error lists
    splits_found: tuple[str, ...] = ()

    def split(self, name: str = "test") -> Mapping[str, Mapping[str, int]]:
        """Judgments of one split; :class:`ValidationError` lists the splits that exist."""
        try:
            return self.qrels[name]
        except KeyError:
            if name in self.splits_found:  # there, and left unread by load_beir(splits=...)
                raise ValidationError(f"{self.name}: qrels/{name}.tsv was not loaded; load it with "
                                      f"load_beir(..., splits=[..., {name!r}])") from None
            raise ValidationError(f"{self.name} has no split {name!r}; it has "
                                  f"{sorted(self.splits_found or self.qrels)}") from None

    def check_known_documents(self, name: str = "test") -> None:
        """Raise :class:`ValidationError` when every relevant judgment of split ``name`` names a document
        that is not in the corpus (the qrels belong to another corpus: every metric would be 0)."""
        unknown = self.unknown_judgments.get(name, 0)
        if unknown and not any(g > 0 for r in self.split(name).values() for g in r.values()):
            raise ValidationError(f"{self.name}: none of the {unknown} relevant judgments of qrels/{name}.tsv "
                                  f"names a document of corpus.jsonl{self._unknown_examples_said(name)}")

    def _unknown_examples_said(self, name: str) -> str:
        """``" (such as '184 ', ...)"`` for :meth:`check_known_documents`, saying which of the examples would
        name a document once stripped of spaces (on either side: the corpus's id may be the one with them)."""
        examples = self.unknown_examples.get(name, ())
        if not examples:
            return ""
        stripped = {c.id.strip(): c.id for c in self.corpus}
        near = [f"{doc!r} is the document {stripped[doc.strip()]!r} of corpus.jsonl but for spaces"
                for doc in examples if doc.strip() in stripped]
        fix = f"; {'; '.join(near)}: ids must match exactly, so strip the spaces" if near else ""
        return f" (such as {' and '.join(map(repr, examples))}{fix})"

    def unknown_documents_note(self, name: str = "test") -> str | None:
        """The ``rlfb: left out ...`` line for the relevant judgments of split ``name`` that named unknown
        documents, or ``None`` when there were none."""
        n = self.unknown_judgments.get(name, 0)
        return f"rlfb: left out {n} relevant judgments of qrels/{name}.tsv naming documents not in corpus.jsonl" \
            if n else None

    def dropped_queries(self, name: str = "test") -> dict[str, int]:
        """How many judged queries of split ``name`` a run leaves out, by reason: ``no_text``, whose id is not
        in queries.jsonl, and ``no_relevant``, with a text but no document of the corpus judged relevant
        (grade above 0): whatever is ranked, such a query scores 0."""
        judged = self.split(name)
        no_text = sum(q not in self.queries for q in judged)
        no_relevant = sum(q in self.queries and not any(g > 0 for g in r.values()) for q, r in judged.items())
        return {"no_text": no_text, "no_relevant": no_relevant}

    def digest(self, splits: Iterable[str] | None = None) -> str:
        """A sha256 of what a run reads of the collection: each chunk's id and text, in corpus order (which
        breaks ties), each query's text and the judgments of each split of ``splits`` the dataset holds (every
        split where ``None``); a simulation records it over the splits it reads, so that two runs' figures are
        known to come from the same data, whichever other splits were loaded (:func:`load_beir`'s ``splits``).

        >>> a = BeirDataset("x", [Chunk("d1", "text")], {"q1": "question"}, {"test": {"q1": {"d1": 1}}})
        >>> b = BeirDataset("y", [Chunk("d1", "text")], {"q1": "question"}, {"test": {"q1": {"d1": 2}}})
        >>> a.digest() == BeirDataset("z", a.corpus, a.queries, a.qrels).digest(), a.digest() == b.digest()
        (True, False)
        """
        h = hashlib.sha256()
        for chunk in self.corpus:
            h.update(json.dumps([chunk.id, chunk.text]).encode())
        h.update(json.dumps(sorted(self.queries.items())).encode())
        wanted = None if splits is None else set(splits)
        h.update(json.dumps({s: {q: dict(r) for q, r in j.items()} for s, j in self.qrels.items()
                             if wanted is None or s in wanted}, sort_keys=True).encode())
        return h.hexdigest()

    def left_out_notes(self, name: str = "test") -> list[str]:
        """The ``rlfb: left out ...`` lines of split ``name`` that ``rlfb evaluate`` and ``rlfb simulate``
        print: relevant judgments naming unknown documents, then :meth:`dropped_queries`, then the judged
        queries whose own document is left out of their rankings (:meth:`own_documents`)."""
        dropped = self.dropped_queries(name)
        notes = [note] if (note := self.unknown_documents_note(name)) else []
        for n, why in ((dropped["no_text"], "no text in queries.jsonl"),
                       (dropped["no_relevant"], "no document of corpus.jsonl judged relevant")):
            if n:
                notes.append(f"rlfb: left out {n} judged queries of qrels/{name}.tsv with {why}")
        if n := len(self.own_documents(self.asked_queries(name))):
            notes.append(f"rlfb: left out of their own rankings the document each of {n} judged queries of "
                         f"qrels/{name}.tsv is (the same id and text in corpus.jsonl), as BEIR does")
        return notes

    def asked_queries(self, name: str = "test") -> list[str]:
        """The judged queries of split ``name`` a run asks: those with a text and a document judged relevant
        (the others are :meth:`dropped_queries`)."""
        return [q for q, r in self.split(name).items() if q in self.queries and any(g > 0 for g in r.values())]

    def own_documents(self, qids: Iterable[str]) -> dict[str, frozenset[str]]:
        """For each of ``qids`` that is a document of the corpus too (:attr:`query_documents`), the ids left out of
        its ranking: ``{query id: {its own id}}``; the others are not keys.

        >>> d = BeirDataset("x", [Chunk("1", "an argument"), Chunk("2", "another")], {"1": "An  argument"},
        ...                 {"test": {"1": {"2": 1}}}, query_documents=frozenset({"1"}))
        >>> d.own_documents(["1", "9"])
        {'1': frozenset({'1'})}
        """
        return {q: frozenset({q}) for q in qids if q in self.query_documents}

    def split_queries(self, name: str = "test") -> dict[str, str]:
        """Query texts of the judged queries of one split, in a stable order."""
        qrels = self.split(name)
        return {q: self.queries[q] for q in sorted(qrels, key=_natural) if q in self.queries}


def _natural(key: str) -> tuple[int, str]:
    # isdigit() alone takes "²", which int() refuses
    return (0, f"{int(key):012d}") if key.isascii() and key.isdigit() else (1, key)


# in a source checkout, the collections' folder beside it (where the tests and benchmarks look without the
# setting); an installed package finds nothing there
_CHECKOUT_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def datasets_dir() -> Path | None:
    """The folder named by ``RLFB_DATASETS``; without the setting, a source checkout's sibling
    ``../shared/datasets`` when it exists; else ``None``."""
    value = os.environ.get(DATASETS_ENV)
    if value:
        return Path(value)
    return _CHECKOUT_DATASETS if _CHECKOUT_DATASETS.is_dir() else None


def dataset_path(name: str) -> Path:
    """Path of collection ``name`` under :func:`datasets_dir` (it may not exist)."""
    base = datasets_dir()
    if base is None:
        raise ValidationError(f"set {DATASETS_ENV} to the folder that holds the BEIR collections")
    return base / name


def find_dataset(arg: str | Path) -> Path:
    """The collection folder ``arg`` names, as the CLI takes ``--dataset``: ``arg`` itself where it is a
    folder; else, for a bare name such as ``"cranfield"``, that folder under :func:`datasets_dir` where
    it is there; else ``arg`` as given, whose loading then says that there is no such folder.

    >>> str(find_dataset("no-such-collection-here"))
    'no-such-collection-here'
    """
    if isinstance(arg, str) and not arg.strip():  # Path("") is ".", a folder the caller never named
        raise ValidationError("no dataset folder given: the path is empty")
    path = Path(arg)
    if path.is_dir() or path.is_absolute() or len(path.parts) != 1:
        return path
    base = datasets_dir()
    return base / path if base is not None and (base / path).is_dir() else path


def _data_file(root: Path, name: str) -> Path | None:
    """``root / name``, else its gzipped ``name.gz`` (as Hugging Face's BeIR downloads ship corpus and queries),
    else ``None``; the plain file wins where both are there, as it is the one a user unpacked or edited."""
    for file in (root / name, root / f"{name}.gz"):
        if file.is_file():
            return file
    return None


def qrels_files(root: Path) -> dict[str, Path]:
    """The qrels file of each split in ``root/qrels``, by split name: ``test.tsv``, else ``test.tsv.gz``, the
    plain file winning where both are there (:func:`_data_file`, as for the corpus). Until 2026-12-06 a
    gzipped qrels file was not read, so a folder of them had "no qrels/*.tsv"."""
    folder = root / "qrels"
    splits = {file.name[: -len(suffix)] for suffix in (".tsv", ".tsv.gz") for file in folder.glob(f"*{suffix}")}
    found = {split: _data_file(folder, f"{split}.tsv") for split in sorted(splits)}
    return {split: file for split, file in found.items() if file is not None}  # None: a folder named "x.tsv"


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered text lines of ``path`` (gunzipped where it ends in ``.gz``); undecodable bytes raise
    :class:`CorruptStateError` naming the line, and so does a damaged gzip file."""
    gzipped = path.suffix == ".gz"
    lineno = 0
    try:
        with (gzip.open if gzipped else open)(path, "rb") as fh:
            # decode line by line (not the whole stream) so that an error can name its line
            for lineno, raw in enumerate(fh, start=1):
                try:  # a byte-order mark (files saved by some Windows editors) is not part of the first line
                    yield lineno, raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise CorruptStateError(f"{path}:{lineno}: not UTF-8: {exc}") from exc
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # truncated, or not gzip at all: cut short, silently
        raise CorruptStateError(f"{path}:{lineno + 1}: not a readable gzip file ({exc}): download it again, or "
                                f"give it unpacked as {path.with_suffix('')}") from exc
    except OSError as exc:
        raise CorruptStateError(f"cannot read {path}: {exc}") from exc


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Numbered JSON objects of a JSON-lines file (blank lines skipped)."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise CorruptStateError(f"{path}:{lineno}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise CorruptStateError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        yield lineno, row


def _row_id(row: dict[str, Any], where: str) -> str:
    if "_id" not in row:  # "_id must be a string, got None" hid a line keyed "id"
        keys = ", ".join(repr(k) for k in list(row)[:10]) + (", ..." if len(row) > 10 else "")
        hint = ": rename 'id' to '_id'" if "id" in row else ""
        raise CorruptStateError(f"{where}: no '_id' key, which names a BEIR line (it has {keys or 'none'}){hint}")
    value = row.get("_id")
    # BEIR ids are strings; some collections write them as JSON numbers
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorruptStateError(f"{where}: _id must be a string, got {value!r}")
    return str(value)


def _row_text(row: dict[str, Any], key: str, where: str, *, required: bool) -> str:
    value = row.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        # NaN or Infinity, which json.loads takes and pandas writes for a missing value, was indexed as "nan"
        if required:
            raise CorruptStateError(f"{where}: {key} is {value!r}, which stands for a missing value; give it as text")
        return ""
    if value is None and not required:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # a title such as 1984, written as a JSON number
    if not isinstance(value, str):
        raise CorruptStateError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _read_corpus(file: Path) -> tuple[list[Chunk], dict[str, str]]:
    """The corpus as chunks (title and text), with each document's ``text`` field alone by id."""
    corpus: list[Chunk] = []
    texts: dict[str, str] = {}
    first_line: dict[str, tuple[int, tuple[str, str, dict[str, Any]]]] = {}
    fields: list[str] = []
    for lineno, row in _read_jsonl(file):
        fields = fields or sorted(row)
        where = f"{file}:{lineno}"
        cid = _row_id(row, where)
        title = _row_text(row, "title", where, required=False).strip()
        text = _row_text(row, "text", where, required=False)
        metadata = row.get("metadata")
        metadata = {} if metadata is None else metadata  # [], 0 or "" are refused as [1] is, not taken as {}
        if not isinstance(metadata, dict):
            raise CorruptStateError(f"{where}: metadata must be a JSON object, got {type(metadata).__name__}")
        # a document repeated as it was is harmless, as a repeated query or judgment is; one id for two is not
        if cid in first_line:
            first, content = first_line[cid]
            if content == (title, text, metadata):
                continue
            raise CorruptStateError(f"{where}: duplicate _id {cid!r} (first on line {first}, with another title, "
                                    "text or metadata)")
        first_line[cid] = lineno, (title, text, metadata)
        # the title indexed wins over a "title" in metadata, so the metadata says what was indexed
        corpus.append(Chunk(cid, f"{title} {text}".strip(), {**metadata, "title": title}))
        texts[cid] = text
    if not corpus:  # it was read as a corpus all of whose documents the judgments name wrongly
        raise EmptyCorpusError(f"{file} holds no documents")
    if not any(c.text for c in corpus):
        # a corpus in another shape (Pyserini's "contents") was indexed as empty texts and scored nDCG 0.005
        raise ValidationError(
            f"{file}: none of its {len(corpus)} documents has text in 'title' or 'text', the fields a BEIR corpus "
            f"names (its first document has {', '.join(fields)})"
        )
    return corpus, texts


def _same_text(a: str, b: str) -> bool:
    """Whether two texts are the same but for case and spacing (ArguAna's questions have a double space where
    their document has one)."""
    return " ".join(a.casefold().split()) == " ".join(b.casefold().split())


def _query_documents(corpus: list[Chunk], texts: Mapping[str, str], queries: Mapping[str, str]) -> frozenset[str]:
    """The ids of ``queries`` that name a document of ``corpus`` whose text, with its title or without, is the
    query's own (:attr:`BeirDataset.query_documents`)."""
    full = {c.id: c.text for c in corpus}
    return frozenset(
        q for q, text in queries.items()
        if q in texts and text.strip() and (_same_text(text, texts[q]) or _same_text(text, full[q]))
    )


def _read_queries(file: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, row in _read_jsonl(file):
        where = f"{file}:{lineno}"
        qid = _row_id(row, where)
        text = _row_text(row, "text", where, required=True)
        # a query repeated word for word is harmless; the same id for two questions is not
        if qid in first_line and queries[qid] != text:
            raise CorruptStateError(f"{where}: _id {qid!r} names another question on line {first_line[qid]}")
        first_line.setdefault(qid, lineno)
        queries[qid] = text
    return queries


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _qrels_columns(row: list[str], line: str, where: str) -> list[str]:
    """The three cells of a qrels row; a row of another layout raises :class:`CorruptStateError` saying which."""
    while len(row) > 3 and not row[-1].strip():  # a trailing tab adds an empty cell, not a column
        row = row[:-1]
    if len(row) > 3 or (len(row) < 3 and len(line.split()) == 4):
        # TREC and MS MARCO qrels read "qid 0 docid grade": taken as BEIR's three columns, document "0" was
        # judged with the document's id as its grade
        raise CorruptStateError(
            f"{where}: {max(len(row), len(line.split()))} columns ({line.strip()!r}): this looks like TREC qrels "
            "(query-id, iteration, corpus-id, score), while BEIR's have 3 tab-separated columns, query-id, "
            "corpus-id and score: drop the second column (cut -f1,3,4, or awk -v OFS='\\t' '{print $1,$3,$4}' "
            "where spaces separate them)")
    if len(row) < 3:
        raise CorruptStateError(f"{where}: expected query-id, corpus-id and score, got {row!r}")
    return row


def _read_qrels(tsv: Path) -> dict[str, dict[str, int]]:
    split: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    first_row = True
    for lineno, line in _lines(tsv):
        try:  # one reader per line, so that an error can name its line
            row = next(csv.reader([line], delimiter="\t"), [])
        except csv.Error as exc:
            raise CorruptStateError(f"{tsv}:{lineno}: {exc}") from exc
        if not row:
            continue
        first, first_row = first_row, False
        if row[0] == "query-id":
            continue
        row = _qrels_columns(row, line, f"{tsv}:{lineno}")
        if first and not _is_number(row[2]):  # a header of other words ("qid, docid, relevance"): BEIR's loader
            continue  # skips line 1 whatever it says; a word for a score further down is still refused
        try:
            value = float(row[2])
            grade = int(value)
        except (ValueError, OverflowError):
            raise CorruptStateError(f"{tsv}:{lineno}: score must be a number, got {row[2]!r}") from None
        if grade != value:  # int() would make 0.5 irrelevant and 1.7 a 1, silently; BEIR's loader refuses it
            raise CorruptStateError(f"{tsv}:{lineno}: score must be a whole relevance grade, got {row[2]!r}")
        # a judgment repeated word for word is harmless; two grades for one pair are not (the last one won)
        judged = split.setdefault(row[0], {})
        if row[1] in judged and judged[row[1]] != grade:
            raise CorruptStateError(f"{tsv}:{lineno}: query {row[0]!r}, document {row[1]!r} graded {grade} here "
                                    f"and {judged[row[1]]} on line {first_line[row[0], row[1]]}")
        first_line.setdefault((row[0], row[1]), lineno)
        judged[row[1]] = grade
    return split


def _no_such_folder(root: Path) -> str:
    """The error for a dataset folder that does not exist; where it looks like ``$RLFB_DATASETS/NAME`` expanded
    with the setting unset (``/NAME``, or an absolute path whose parent is missing too), a hint saying so."""
    message = f"no such folder: {root}"
    if (root.is_absolute() and not os.environ.get(DATASETS_ENV)
            and (root.parent == Path(root.anchor) or not root.parent.exists())):
        message += f" ({DATASETS_ENV} is not set; was the path written as ${DATASETS_ENV}/...?)"
    elif not root.is_absolute() and len(root.parts) == 1:  # a bare name: say where else it was looked for
        base = datasets_dir()
        message += (f" (nor {base / root})" if base is not None
                    else f" ({DATASETS_ENV} is not set: a bare name is looked for under it)")
    return message


def load_beir(path: str | Path, *, name: str | None = None, splits: Iterable[str] | None = None) -> BeirDataset:
    """Load a BEIR folder: every ``qrels/*.tsv`` becomes a split, or those of ``splits`` alone (what a run reads:
    a damaged ``qrels/dev.tsv`` stopped every run of ``test`` until 2026-12-06, while a split named there that
    has no file is still :meth:`BeirDataset.split`'s error, listing the folder's splits).

    Chunk text is ``title + " " + text``, as BEIR evaluates it; the title is
    kept in the metadata too, and a title or text that is null, NaN or Infinity is empty. ``corpus.jsonl`` and
    ``queries.jsonl`` may be gzipped (``corpus.jsonl.gz``), and so may each qrels file (``qrels/test.tsv.gz``); the
    plain file wins where both are there. A folder that
    does not exist, or lacks ``corpus.jsonl`` or ``queries.jsonl``, raises :class:`ValidationError` saying which.
    A malformed file raises :class:`CorruptStateError` naming the file and line (a qrels row of 4 columns,
    TREC's layout, among them), and so does a qrels pair (query, document) given two
    different grades (naming the earlier line too), or an ``_id`` given to two documents of other content; a
    judgment, query or document repeated as it was is kept once. The first line of a qrels file is a header
    where its score is not a number, whatever its words.
    Judgments naming a document that is not in the corpus are left out of ``qrels`` and the relevant
    ones counted per split in ``unknown_judgments``: ``rlfb evaluate`` and ``rlfb simulate`` report the
    count, and :meth:`BeirDataset.check_known_documents` refuses a split none of whose relevant
    judgments names a document of the corpus. A query that is a document of the corpus too (the same id and
    text, as in ArguAna and Quora) is listed in ``query_documents``: the runs leave that document out of its
    ranking.
    """
    if isinstance(path, str) and not path.strip():  # Path("") is ".", a folder the caller never named
        raise ValidationError("no dataset folder given: the path is empty")
    root = Path(path)
    if not root.exists():  # "is not a BEIR folder: corpus.jsonl is missing" read as if the folder were there
        raise ValidationError(_no_such_folder(root))
    if root.is_file():  # corpus.jsonl itself, say: "is not a BEIR folder: corpus.jsonl is missing" misled
        raise ValidationError(f"{root} is a file; give the BEIR folder that holds corpus.jsonl, such as {root.parent}")
    files = {}
    for required in ("corpus.jsonl", "queries.jsonl"):
        if (file := _data_file(root, required)) is None:
            raise ValidationError(f"{root} is not a BEIR folder: {required} is missing")
        files[required] = file
    corpus, texts = _read_corpus(files["corpus.jsonl"])
    queries = _read_queries(files["queries.jsonl"])
    tsvs = qrels_files(root)
    if not tsvs:
        raise ValidationError(f"{root} has no qrels/*.tsv (nor qrels/*.tsv.gz)")
    wanted = None if splits is None else {_split_name(s) for s in ([splits] if isinstance(splits, str) else splits)}
    qrels = {split: _read_qrels(tsv) for split, tsv in tsvs.items() if wanted is None or split in wanted}
    ids = {chunk.id for chunk in corpus}
    unknown: dict[str, int] = {}
    examples: dict[str, tuple[str, ...]] = {}
    for split, judged in qrels.items():
        missing: dict[str, None] = {}  # the unknown documents judged relevant, in file order
        for q, docs in judged.items():
            missing.update((d, None) for d, g in docs.items() if g > 0 and d not in ids)
            unknown[split] = unknown.get(split, 0) + sum(g > 0 for d, g in docs.items() if d not in ids)
            judged[q] = {d: g for d, g in docs.items() if d in ids}
        if missing:
            examples[split] = _unknown_examples(missing, ids)
    # the folder's own name: "." or ".." named the collection "" or ".."
    return BeirDataset(name or root.resolve().name, corpus, queries, qrels,
                       {s: n for s, n in unknown.items() if n}, _query_documents(corpus, texts, queries), examples,
                       tuple(tsvs))


def _split_name(split: Any) -> str:
    if not isinstance(split, str) or not split:
        raise ValidationError(f"a split is the name of a qrels file (such as 'test'), got {split!r}")
    return split


def _unknown_examples(missing: Iterable[str], ids: set[str], n: int = 2) -> tuple[str, ...]:
    """``n`` of the ``missing`` document ids, those that name a document of ``ids`` but for spaces first (the
    likeliest cause, and one no reader sees unless it is named).

    >>> _unknown_examples(["D7", "184 ", "D9"], {"184", "29"})
    ('184 ', 'D7')
    """
    stripped = {i.strip() for i in ids}
    return tuple(sorted(missing, key=lambda d: d.strip() not in stripped)[:n])
