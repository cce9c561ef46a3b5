"""``benchmarks/weights_information_bound.py``, which the README quotes for cranfield's miss, still runs: it reads
the simulator's private helpers (``_split``, ``prepare``, ``stream_seed``), which no other test holds it to."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlfb.demo_corpus import generate_demo_corpus

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "weights_information_bound.py"


def _write_demo(root: Path) -> Path:
    data = generate_demo_corpus(n_devices=20, seed=3)
    (root / "qrels").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for c in data.corpus:
            f.write(json.dumps({"_id": c.id, "title": "", "text": c.text}) + "\n")
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in data.queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with open(root / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, rels in data.split("test").items():
            f.writelines(f"{qid}\t{doc}\t{grade}\n" for doc, grade in rels.items())
    return root


def test_the_information_bound_prints_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # set, so that the usage error below is the same wherever the checkout is: with neither the setting nor the
    # checkout's sibling ../shared/datasets it also says to set RLFB_DATASETS (a checkout elsewhere failed)
    monkeypatch.setenv("RLFB_DATASETS", str(tmp_path))
    spec = importlib.util.spec_from_file_location("weights_information_bound", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    folder = _write_demo(tmp_path / "demo")
    assert script.main(["--dataset", str(folder), "--seeds", "2", "--interactions", "60"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("demo: held-out nDCG@10") and "seeds 0-1 | 0-1" in out[0]
    names = ["equal weights", "tuned on full judgments"] + [
        f"{source}, {display} shown" for display in ("equal", "uniform")
        for source in ("true grades of examined chunks", "true grades of every shown chunk", "click rates")]
    assert len(out) == 1 + len(names)
    assert [line.strip().startswith(name) for line, name in zip(out[1:], names, strict=True)] == [True] * len(names)
    tuned = [line for line in out if "tuned on full judgments" in line][0]
    assert "(+0.0000)" in tuned
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse's own (printed bare until 2026-12-07)
        script.main(["--dataset", str(tmp_path / "missing")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: no collection at {tmp_path / 'missing'}\n")
