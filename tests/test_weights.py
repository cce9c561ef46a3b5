"""The weight configuration centre: `rlfb weights show|export|import` and pick-up by other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rlfb import FeedbackEnsemble
from rlfb.cli import main
from rlfb.store import FeedbackStore

TEXTS = ["solar wind drives the aurora", "the moon pulls the tides", "magma feeds volcanoes", "ice carves valleys"]


def _ensemble(path, **kw) -> FeedbackEnsemble:
    return FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(path), **kw)


def _two_retriever_store(tmp_path):
    db = tmp_path / "fb.db"
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), store=str(db), policy="fixed")
    r = ens.retrieve("aurora", k=2)
    ens.feedback(r.event_id, "explicit_positive")
    ens.close()
    return db


def test_show_export_import_round_trip(tmp_path, capsys) -> None:
    db = _two_retriever_store(tmp_path)
    assert main(["weights", "show", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["weights"] == pytest.approx({"bm25": 0.5, "dense": 0.5})
    out = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["state"]["retrievers"] == ["bm25", "dense"]
    data["weights"] = {"bm25": 0.8, "dense": 0.2}
    out.write_text(json.dumps({"weights": data["weights"]}))
    assert main(["weights", "import", str(db), str(out)]) == 0
    with FeedbackStore(db) as store:
        assert store.load_policy_state()["weights"] == pytest.approx({"bm25": 0.8, "dense": 0.2})


@pytest.mark.parametrize(
    "content",
    [
        {"weights": {"bm25": float("nan"), "dense": 1.0}},
        {"weights": {"bm25": -0.5, "dense": 1.5}},
        {"weights": {"bm25": "a lot", "dense": 1.0}},
        {"weights": {"bm25": 0.5, "colbert": 0.5}},
        {"weights": {"bm25": 0.5, "dense": 0.5}, "state": {"format": 99}},
    ],
)
def test_bad_imports_are_rejected_and_nothing_is_written(tmp_path, capsys, content) -> None:
    db = _two_retriever_store(tmp_path)
    with FeedbackStore(db) as store:
        before = store.state_version()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(content, allow_nan=True))
    assert main(["weights", "import", str(db), str(bad)]) == 2
    assert "rlfb: error:" in capsys.readouterr().err
    with FeedbackStore(db) as store:
        assert store.state_version() == before


def test_corrupt_weights_file_is_a_clear_error(tmp_path, capsys) -> None:
    db = _two_retriever_store(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{weights: oops")
    assert main(["weights", "import", str(db), str(bad)]) == 2
    assert "cannot read weights" in capsys.readouterr().err
    assert main(["weights", "show", str(tmp_path / "missing.db")]) == 2


def test_a_second_process_picks_up_new_weights_without_restart(tmp_path) -> None:
    db = tmp_path / "fb.db"
    app = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25", "dense"), store=str(db), refresh_interval=0.2)
    assert app.weights == pytest.approx({"bm25": 0.5, "dense": 0.5})
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"bm25": 0.9, "dense": 0.1}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "rlfb.cli", "weights", "import", str(db), str(new)],
                   check=True, env=env, capture_output=True)
    time.sleep(0.3)  # past the refresh interval
    assert app.weights == pytest.approx({"bm25": 0.9, "dense": 0.1})
    ranked = app.retrieve("aurora", k=2)
    assert ranked.weights == pytest.approx({"bm25": 0.9, "dense": 0.1})


def test_feedback_learned_in_one_process_reaches_another(tmp_path) -> None:
    db = tmp_path / "fb.db"
    writer = _ensemble(db, policy="thompson", refresh_interval=0.0)
    reader = _ensemble(db, policy="thompson", refresh_interval=0.0)
    for _ in range(3):
        r = writer.retrieve("aurora", k=2)
        writer.feedback(r.event_id, "explicit_positive")
    reader.refresh()
    assert reader.learner.state_dict()["n_learned"] == writer.learner.state_dict()["n_learned"] == 3
