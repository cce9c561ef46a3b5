"""Gzipped qrels files (``qrels/test.tsv.gz``, as some BEIR downloads ship them) are read as the plain ones are;
until 2026-12-06 a folder of them was refused as having "no qrels/*.tsv"."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from test_beir_collection_shapes import QRELS, gzip_in_place, write_beir

from rlfb.datasets import load_beir, qrels_files
from rlfb.errors import CorruptStateError


def test_a_gzipped_qrels_file_loads_as_the_plain_one_does(tmp_path: Path) -> None:
    plain = load_beir(write_beir(tmp_path / "plain"), name="x")
    root = write_beir(tmp_path / "gz")
    gzip_in_place(root / "qrels" / "test.tsv")
    gzipped = load_beir(root, name="x")
    assert gzipped.split("test") == {"1": {"184": 1}, "2": {"0": 1}}
    assert gzipped == plain and gzipped.digest() == plain.digest() and gzipped.splits_found == ("test",)


def test_plain_and_gzipped_splits_mix_and_the_plain_file_wins(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "beir")
    (root / "qrels" / "dev.tsv.gz").write_bytes(gzip.compress("\n".join([QRELS[0], "2\t29\t1"]).encode()))
    (root / "qrels" / "test.tsv.gz").write_bytes(gzip.compress("\n".join([QRELS[0], "1\t29\t1"]).encode()))
    data = load_beir(root)
    assert data.splits_found == ("dev", "test")
    assert data.split("dev") == {"2": {"29": 1}}
    assert data.split("test") == {"1": {"184": 1}, "2": {"0": 1}}  # test.tsv, not its gzipped copy
    assert qrels_files(root) == {"dev": root / "qrels" / "dev.tsv.gz", "test": root / "qrels" / "test.tsv"}


def test_a_gzipped_qrels_split_is_loaded_alone_when_asked(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "beir")
    gzip_in_place(root / "qrels" / "test.tsv")
    (root / "qrels" / "dev.tsv.gz").write_bytes(b"damaged, not gzip\n")
    assert load_beir(root, splits=["test"]).split("test") == {"1": {"184": 1}, "2": {"0": 1}}
    with pytest.raises(CorruptStateError, match="dev.tsv.gz:.*not a readable gzip file"):
        load_beir(root)


def test_evaluate_reads_a_gzipped_qrels_file_and_refuses_to_write_over_it(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rlfb.cli import main

    root = write_beir(tmp_path / "beir")
    qrels = gzip_in_place(root / "qrels" / "test.tsv")
    before = qrels.read_bytes()
    assert main(["evaluate", "--dataset", str(root), "--retrievers", "bm25", "--json", str(qrels)]) != 0
    assert "a file of the collection being read" in capsys.readouterr().err and qrels.read_bytes() == before
    out = tmp_path / "run.json"
    assert main(["evaluate", "--dataset", str(root), "--retrievers", "bm25", "--json", str(out)]) == 0
    assert out.read_text()
