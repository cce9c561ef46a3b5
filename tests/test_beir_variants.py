"""benchmarks/beir_variants.py builds loadable collections with the shapes it names, and the simulator
prepares each of them (the shapes other BEIR collections have: graded 0-2 scales, a dev split only, no train
split, odd ids, long questions, three splits)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from rlfb.datasets import load_beir
from rlfb.simulation.runner import SimulationConfig, prepare

REPO = Path(__file__).resolve().parents[1]


def _variants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("beir_variants", REPO / "benchmarks" / "beir_variants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, cranfield_path: Path, cisi_path: Path,
          scifact_path: Path) -> dict[str, Path]:
    src = cranfield_path.parent  # the variants read all three
    out = tmp_path_factory.mktemp("variants")
    paths = _variants().build(src, out)
    again = _variants().build(src, tmp_path_factory.mktemp("again"))
    for a, b in zip(paths, again, strict=True):  # deterministic
        assert [p.read_bytes() for p in sorted(a.rglob("*.*"))] == [p.read_bytes() for p in sorted(b.rglob("*.*"))]
    return {p.name: p for p in paths}


def test_each_variant_has_the_shape_it_names(built: dict[str, Path]) -> None:
    covid = load_beir(built["cranfield_covid_like"])
    grades = {g for r in covid.split("test").values() for g in r.values()}
    assert grades == {0, 1, 2} and len(covid.split("test")) == 50
    dev = load_beir(built["cisi_dev_split"])
    assert set(dev.qrels) == {"dev"}
    assert sum(not any(g > 0 for g in r.values()) for r in dev.split("dev").values()) == 6
    assert set(load_beir(built["scifact_test_only"]).qrels) == {"test"}
    odd = load_beir(built["cranfield_odd_ids"])
    assert any("/" in c.id or " " in c.id for c in odd.corpus) and odd.unknown_documents_note() is None
    splits = load_beir(built["cranfield_nfcorpus_splits"])
    assert set(splits.qrels) == {"train", "dev", "test"}
    assert len(set(splits.split("train")) & set(splits.split("test"))) == 5


@pytest.mark.parametrize("name,split", [("cranfield_covid_like", "test"), ("cisi_dev_split", "dev"),
                                        ("cranfield_odd_ids", "test"), ("cranfield_nfcorpus_splits", "test")])
def test_the_simulator_prepares_each_variant(built: dict[str, Path], name: str, split: str) -> None:
    data = load_beir(built[name])
    prep = prepare(data, SimulationConfig(retrievers=("bm25",), split=split))
    asked = {q for q in prep.qrels if q in data.queries}  # a judged id without a question is left out
    assert len(asked) >= 25 and asked <= set(prep.contexts)
