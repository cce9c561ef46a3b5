"""`rlfb weights` defects a user-journey audit of 2026-12-06 found: an old export imported over a store that had
learned since rolled it back unsaid, a damaged newest snapshot was listed by `weights export` as a second kind
of ensemble, and a `--weights-only` export imported again wrote a new version for round-off alone."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from _cli_output import one_error_line

from rlfb import FeedbackEnsemble
from rlfb.cli import main
from rlfb.learner import Learner
from rlfb.store import FeedbackStore

TEXTS = ["solar wind drives the aurora", "the moon pulls the tides", "magma feeds volcanoes", "ice carves valleys"]
QUERIES = ["aurora", "tides", "volcanoes", "valleys"]


def learn(db: Path, n: int) -> None:
    """``n`` feedbacks more, learned by a thompson ensemble over ``db`` and written when it closes."""
    ens = FeedbackEnsemble.from_texts(TEXTS, retrievers=("bm25",), store=str(db), policy="thompson")
    for i in range(n):
        r = ens.retrieve(QUERIES[i % len(QUERIES)], k=2)
        ens.feedback(r.event_id, "click", chunk_id=r.hits[0].chunk_id)
    ens.close()


def newest(db: Path) -> dict[str, Any]:
    with FeedbackStore(db) as store:
        snapshot = store.load_policy_state()
    assert snapshot is not None
    return snapshot


# -- 1. an old export does not roll the store back unsaid -------------------------------------------------------
def test_importing_an_export_that_learned_less_than_the_store_is_refused(tmp_path: Path, capsys) -> None:
    db = tmp_path / "fb.db"
    learn(db, 3)
    old = tmp_path / "old.json"
    assert main(["weights", "export", str(db), str(old)]) == 0
    assert json.loads(old.read_text())["state"]["n_learned"] == 3
    old_weights = tmp_path / "old_weights.json"
    assert main(["weights", "export", str(db), str(old_weights), "--weights-only"]) == 0
    learn(db, 5)
    before = newest(db)
    assert before["state"]["n_learned"] == 8
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(old)]) == 2
    message = one_error_line(capsys)
    assert f"version {before['version']}" in message and "learned from 8" in message and "from 3" in message
    assert "--rollback" in message
    after = newest(db)
    assert after["version"] == before["version"] and after["state"]["n_learned"] == 8  # nothing written
    # weights alone are the user setting weights, not a rollback: applied to the newest state
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"bm25": 1.0}))
    for weights_only in (old_weights, bare):
        assert main(["weights", "import", str(db), str(weights_only)]) == 0
        capsys.readouterr()
    assert newest(db)["state"]["n_learned"] == 8
    # a state that learned as much is no rollback (the same export again: already held), nor one that learned more
    current = tmp_path / "current.json"
    assert main(["weights", "export", str(db), str(current)]) == 0
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(current)]) == 0
    assert capsys.readouterr().out.startswith("already version")
    learned = json.loads(current.read_text())
    learned["state"]["n_learned"] = 9
    more = tmp_path / "more.json"
    more.write_text(json.dumps(learned))
    assert main(["weights", "import", str(db), str(more)]) == 0
    assert capsys.readouterr().out.startswith("imported as version")
    assert newest(db)["state"]["n_learned"] == 9
    # on purpose, it rolls back
    assert main(["weights", "import", str(db), str(old), "--rollback"]) == 0
    assert capsys.readouterr().out.startswith("imported as version")
    rolled = newest(db)
    assert rolled["version"] > before["version"] and rolled["state"]["n_learned"] == 3


def test_the_rollback_option_is_in_the_import_help(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["weights", "import", "--help"])
    assert "--rollback" in capsys.readouterr().out


# -- 2. a damaged newest snapshot is named, not listed as a second kind ----------------------------------------
def damaged_newest(tmp_path: Path) -> tuple[Path, int]:
    db = tmp_path / "fb.db"
    learn(db, 2)
    learn(db, 2)
    version = newest(db)["version"]
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE policy_snapshots SET state = ? WHERE version = ?", ('{"format":1,"junk":true}', version))
    conn.close()
    return db, version


@pytest.mark.parametrize("options", [[], ["--policy", "thompson"], ["--retrievers", "bm25"]])
def test_export_names_a_damaged_newest_snapshot(tmp_path: Path, capsys, options: list[str]) -> None:
    db, version = damaged_newest(tmp_path)
    out = tmp_path / "out.json"
    assert main(["weights", "export", str(db), str(out), *options]) == 2
    message = one_error_line(capsys)
    assert f"policy snapshot {version} in" in message and "is damaged" in message
    assert f"drop-snapshot {db} {version}" in message and "kinds of ensemble" not in message
    assert not out.exists()
    # as weights show names it
    assert main(["weights", "show", str(db)]) == 2
    assert f"policy snapshot {version} in" in one_error_line(capsys)
    # and once it is dropped, the snapshot before it exports
    assert main(["store", "drop-snapshot", str(db), str(version)]) == 0
    capsys.readouterr()
    assert main(["weights", "export", str(db), str(out), *options]) == 0
    assert json.loads(out.read_text())["version"] < version


def test_a_weights_only_export_of_a_damaged_newest_snapshot_writes_its_weights_and_names_the_damage(
        tmp_path: Path, capsys) -> None:
    # its weights are sound (export_weights' docstring: "its weights alone ... export with with_state=False");
    # until 2026-12-06 that held only where the damaged snapshot was the store's one: beside an older one the
    # store grouped it as another kind of its own, and the export was refused
    db, version = damaged_newest(tmp_path)
    out = tmp_path / "out.json"
    assert main(["weights", "export", str(db), str(out), "--weights-only"]) == 0
    exported = json.loads(out.read_text())
    assert exported["version"] == version and "state" not in exported
    err = capsys.readouterr().err
    assert f"policy snapshot {version} in" in err and "is damaged" in err and "weights alone" in err


def test_store_stats_does_not_count_a_damaged_snapshot_as_a_kind(tmp_path: Path, capsys) -> None:
    db, version = damaged_newest(tmp_path)
    assert main(["store", "stats", str(db)]) == 0
    said = capsys.readouterr()
    assert f"v{version} thompson" in said.out and "kinds of ensemble" not in said.out
    assert said.err.startswith(f"rlfb: warning: policy snapshot {version} in") and "drop-snapshot" in said.err
    assert main(["store", "stats", str(db), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["snapshot_kinds"] == 1 and f"policy snapshot {version} in" in stats["snapshot_error"]


# -- 3. a weights-only export imported again is the newest snapshot's already ----------------------------------
def test_a_weights_only_export_imported_again_writes_nothing(tmp_path: Path, capsys) -> None:
    db = tmp_path / "fb.db"
    learner = Learner(("bm25", "dense", "splade"), policy="thompson")
    learner.set_weights({"bm25": 0.2, "dense": 0.5, "splade": 0.3})
    with FeedbackStore(db) as store:
        version = store.save_policy_state(learner.state_dict(), learner.weights(), policy=learner.policy_name,
                                          timestamp=time.time())
    out = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(out), "--weights-only"]) == 0
    capsys.readouterr()
    for _ in range(2):
        assert main(["weights", "import", str(db), str(out)]) == 0
        said = capsys.readouterr()
        assert said.out.startswith(f"already version {version}:"), said.out
        assert "holds these already" in said.err
    assert newest(db)["version"] == version
    # weights that differ beyond round-off are still written
    out.write_text(json.dumps({"bm25": 0.25, "dense": 0.45, "splade": 0.3}))
    assert main(["weights", "import", str(db), str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"imported as version {version + 1}:")
