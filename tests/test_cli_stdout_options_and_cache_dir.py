"""CLI defects a new-user audit of the README (2026-12-06) found: ``--json /dev/stdout``, which the README lists as
a target, mixed the report and the JSON on a pipe and lost the report in a redirected file; ``weights show`` of a
store with no weights printed ``policy None, version 0``; ``simulate``'s errors named the config's fields, not the
options typed; and ``weights import`` could not import a ``--weights-only`` export of one kind of ensemble onto a
store another kind had written to last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest
from _cli_output import one_error_line
from test_cli_boundaries import TINY, write_beir
from test_cli_foreign_files_and_encoding import save_kinds  # one snapshot of each kind, the last the newest

from rlfb.cli import main
from rlfb.store import FeedbackStore

ROOT = Path(__file__).resolve().parents[1]


def newest(db: Path) -> dict[str, Any]:
    with FeedbackStore(db) as store:
        state = store.load_policy_state()
    assert state is not None
    return state


def snapshot_count(db: Path) -> int:
    with FeedbackStore(db) as store:
        return len(store.policy_history())


# -- 1. --json /dev/stdout is --json - ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
@pytest.mark.parametrize("command", ["simulate", "evaluate"])
def test_json_to_dev_stdout_is_the_json_alone_with_the_report_on_stderr(tmp_path: Path, capsys, command: str,
                                                                        name: str) -> None:
    # the report, the JSON and "wrote /dev/stdout" (after the JSON's last brace, no newline) went to stdout mixed
    data = write_beir(tmp_path / "beir")
    extra = TINY if command == "simulate" else ["--retrievers", "bm25"]
    assert main([command, "--dataset", str(data), "--json", name, *extra]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("}\n")
    out = json.loads(captured.out)  # the JSON alone
    assert ("final" in out) if command == "simulate" else ("fused" in out)
    assert "ndcg" in captured.err.lower() and "wrote" not in captured.out + captured.err


def test_a_json_path_that_is_where_stdout_goes_is_stdout(tmp_path: Path, capsys,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # `rlfb evaluate --json r.json > r.json`: the JSON was renamed over the file stdout wrote the report to, the
    # report lost; written to stdout, the file holds the JSON alone, and the report goes to stderr
    data = write_beir(tmp_path / "beir")
    out = tmp_path / "r.json"
    with open(out, "w", encoding="utf-8") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["evaluate", "--dataset", str(data), "--retrievers", "bm25", "--json", str(out)]) == 0
        monkeypatch.undo()
    assert "fused" in json.loads(out.read_text(encoding="utf-8"))
    assert "ndcg@10" in capsys.readouterr().err


def test_dev_null_is_no_stdout_though_stdout_goes_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--json /dev/null > /dev/null` throws the JSON away: the report stays where it was
    from rlfb.commands import STDOUT, names_stdout, output_target

    with open(os.devnull, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert not names_stdout(os.devnull)
        assert names_stdout("/dev/stdout") and output_target("/dev/fd/1") == STDOUT
        monkeypatch.undo()
    assert output_target("out.json") == "out.json" and output_target(None) is None


def run_cli(cwd: Path, *args: str, stdout: int | IO[Any] = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """``python -m rlfb.cli ARGS`` in ``cwd``, its stdout a pipe (or the file given)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "RLFB_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "rlfb.cli", *args], cwd=cwd, stdout=stdout,
                          stderr=subprocess.PIPE, encoding="utf-8", env=env, check=False)


def test_dev_stdout_piped_and_appended_to_as_the_shell_gives_it(tmp_path: Path) -> None:
    data = write_beir(tmp_path / "beir")
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"))
    # `rlfb evaluate ... --json /dev/stdout | jq`: the JSON alone on the pipe
    done = run_cli(tmp_path, "evaluate", "--dataset", str(data), "--retrievers", "bm25", "--json", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert "fused" in json.loads(done.stdout) and "ndcg@10" in done.stderr
    # `rlfb weights export fb.db /dev/stdout | jq`: ends in a newline, and says nothing of a file written
    done = run_cli(tmp_path, "weights", "export", str(db), "/dev/stdout", "--weights-only")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.endswith("}\n") and json.loads(done.stdout)["version"] == 1
    # `>> log`: the JSON goes after what the file held; renamed over it, the file lost it
    log = tmp_path / "log.txt"
    log.write_text("earlier\n", encoding="utf-8")
    with open(log, "a", encoding="utf-8") as appended:
        done = run_cli(tmp_path, "weights", "export", str(db), "/dev/stdout", "--weights-only", stdout=appended)
    assert done.returncode == 0, done.stderr
    head, _, rest = log.read_text(encoding="utf-8").partition("\n")
    assert head == "earlier" and json.loads(rest)["version"] == 1
    with open(log, "a", encoding="utf-8") as appended:
        done = run_cli(tmp_path, "store", "export", str(db), "--jsonl", "/dev/stdout", stdout=appended)
    assert done.returncode == 0, done.stderr
    assert log.read_text(encoding="utf-8").startswith("earlier\n{")


# -- 2. weights show of a store with no weights yet -------------------------------------------------------------
def test_weights_show_of_a_store_with_no_weights_says_so(tmp_path: Path, capsys) -> None:
    # "policy None, version 0" and {"weights": {}}: read as a snapshot of no retrievers
    db = tmp_path / "fb.db"
    FeedbackStore(db).close()
    assert main(["weights", "show", str(db)]) == 0
    assert capsys.readouterr().out == "the store holds no weights yet\n"
    assert main(["weights", "show", str(db), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {"weights": None, "policy": None, "version": 0, "updated_at": None, "kinds": []}
    # in the words of `weights export`, which has nothing to write (exit 2); `store stats` reports it (exit 0)
    assert main(["weights", "export", str(db), "-"]) == 2
    assert "the store holds no weights yet" in one_error_line(capsys)
    assert main(["store", "stats", str(db)]) == 0
    assert "(no policy snapshot)" in capsys.readouterr().out


# -- 3. simulate's errors name the options typed ----------------------------------------------------------------
@pytest.mark.parametrize(("given", "message", "field"), [
    (["--explicit-rate", "1.5"], "--explicit-rate must be a probability in [0, 1], got 1.5", "explicit_rate"),
    (["--interactions", "0"], "--interactions must be a positive int, got 0", None),
    (["--answer-k", "11"], "--answer-k must be an int in [1, 10] (the ranking's cut-off), got 11", "answer_k"),
    (["--checkpoints", "0"], "--checkpoints must be a positive int, got 0", None),
    (["--late-rate", "2"], "--late-rate must be a probability", "late_rate"),
    (["--reformulation-rate=-1"], "--reformulation-rate must be a probability", "reformulation_rate"),
    (["--noise", "2"], "--noise must be a probability", None),
    (["--mean-delay=-1"], "--mean-delay must be a finite non-negative number of seconds", "mean_delay"),
    (["--spacing", "0"], "--spacing must be a finite positive number of seconds", None),
    (["--split", ""], "--split must name a qrels file, got ''", None),
    (["--late-delay", "1e10"], "(--late-delay 1e+10s, --mean-delay 120s)", "late_delay"),
    (["--spacing", "1e9"], "--interactions x --spacing (20 x 1e+09s)", "mean_delay"),
    (["--retrievers", ","], "--retrievers names no retriever", None),
    (["--learner-option", "memory_weight=-1"], "--learner-option memory_weight must be in [0, 10], got -1", None),
    (["--learner-option", "memory_weight=0"], "turned off by --no-memory, not by --learner-option memory_weight; "
                                              "got memory_weight=0", "memory=True"),
    (["--policy-option", "seed=1"], "--policy-option cannot set the seed: each run's seed comes from --seeds",
     "policy_options"),
    # thompson's option of a setting's name is the policy's, not --noise
    (["--policy-option", "noise=-1"], "--policy-option noise must be", None),
])
def test_simulate_errors_name_the_option_typed(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch,
                                               given: list[str], message: str, field: str | None) -> None:
    import rlfb.simulation.runner as runner

    def no_indexing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dataset was indexed before the settings were checked")

    monkeypatch.setattr(runner, "prepare", no_indexing)
    args = [*TINY, *given] if given[0] != "--retrievers" else [*TINY[2:], *given]
    assert main(["simulate", "--dataset", str(write_beir(tmp_path / "ds")), *args]) == 2
    line = one_error_line(capsys)
    assert message in line
    assert field is None or field not in line


def test_demo_errors_name_the_option_and_python_callers_keep_the_fields(capsys) -> None:
    pytest.importorskip("matplotlib")  # demo refuses to run without it, before its settings are checked
    from rlfb.errors import ValidationError
    from rlfb.simulation.config import SimulationConfig

    assert main(["demo", "--interactions", "0", "--quiet"]) == 2
    assert one_error_line(capsys) == "rlfb: error: --interactions must be a positive int, got 0"
    with pytest.raises(ValidationError, match=r"^explicit_rate must be a probability"):
        SimulationConfig(explicit_rate=1.5)  # the config's own message, for a Python caller, is as it was


# -- 4. weights import on a store several kinds of ensemble share -----------------------------------------------
def test_a_weights_only_export_of_one_kind_imports_again_when_another_wrote_last(tmp_path: Path, capsys) -> None:
    # "weights name ['bm25', 'dense'] but the state is for ['bm25']": the store's newest was the other app's
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25",), "gradient"))
    exported = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(exported), "--weights-only", "--retrievers", "bm25,dense"]) == 0
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(exported)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("already version 1")  # the one kind of its retrievers holds it already
    assert "is another kind's: the weights go onto the newest snapshot of their retrievers, version 1" in captured.err
    # other weights for those retrievers go onto that kind's state, as a new snapshot of it
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"dense": 0.7, "bm25": 0.3}), encoding="utf-8")
    assert main(["weights", "import", str(db), str(bare)]) == 0
    assert capsys.readouterr().out.startswith("imported as version 3")
    saved = newest(db)
    assert saved["policy"] == "thompson" and saved["weights"] == pytest.approx({"bm25": 0.3, "dense": 0.7})
    assert saved["state"]["retrievers"] == ["bm25", "dense"]


def test_a_weights_only_export_goes_back_onto_its_policy_where_another_of_its_retrievers_wrote_last(
    tmp_path: Path, capsys
) -> None:
    # found by a review (2026-12-06): of the newest snapshot's retrievers, the weights went onto its policy
    # (thompson), with a note alone, though the file named the one kind of fixed those retrievers have
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "fixed"), (("bm25", "dense"), "thompson"))
    exported = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(exported), "--weights-only", "--policy", "fixed"]) == 0
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(exported)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("already version 1")  # the fixed kind holds them already: nothing written
    assert "is another policy's: the weights go onto the newest snapshot of the file's policy 'fixed'" in captured.err
    assert snapshot_count(db) == 2
    # picked on purpose: onto thompson, and no note suggests --policy fixed
    assert main(["weights", "import", str(db), str(exported), "--policy", "thompson"]) == 0
    captured = capsys.readouterr()
    assert newest(db)["policy"] == "thompson" and "--policy fixed imports them" not in captured.err


def test_weights_of_several_kinds_retrievers_are_refused_naming_the_kinds_and_the_option(tmp_path: Path,
                                                                                        capsys) -> None:
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25", "dense"), "gradient"),
                    (("bm25",), "fixed"))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"bm25": 0.3, "dense": 0.7}), encoding="utf-8")
    assert main(["weights", "import", str(db), str(bare)]) == 2
    line = one_error_line(capsys)
    assert "but the store's newest snapshot (version 3: policy fixed, bm25) is for ['bm25']" in line
    assert line.endswith("the store holds 2 kinds of ensemble of these retrievers (version 2: policy gradient, "
                         "bm25+dense; version 1: policy thompson, bm25+dense): name one with --policy or its "
                         "--version")
    assert snapshot_count(db) == 3  # nothing written
    # a --weights-only export names its kind's policy: that tells the two apart
    exported = tmp_path / "w.json"
    assert main(["weights", "export", str(db), str(exported), "--weights-only", "--retrievers", "bm25,dense",
                 "--policy", "thompson"]) == 0
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(exported)]) == 0
    assert capsys.readouterr().out.startswith("already version 1")
    # --policy picks the kind, as `weights export --policy` does
    assert main(["weights", "import", str(db), str(bare), "--policy", "gradient"]) == 0
    assert capsys.readouterr().out.startswith("imported as version 4")
    assert newest(db)["policy"] == "gradient" and newest(db)["weights"] == pytest.approx({"bm25": 0.3, "dense": 0.7})
    # the newest snapshot is of the export's retrievers now, but of another policy: the export goes back onto
    # the one kind of its own policy (which holds it already), with a note
    assert main(["weights", "import", str(db), str(exported)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("already version 1")
    assert "is another policy's: the weights go onto the newest snapshot of the file's policy 'thompson'" \
        in captured.err
    assert main(["weights", "import", str(db), str(exported), "--policy", "thompson"]) == 0
    assert capsys.readouterr().out.startswith("already version 1")
    # put on the other policy on purpose, they go there, and the note says the file's policy is not used
    assert main(["weights", "import", str(db), str(exported), "--policy", "gradient"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("imported as version 5") and "the file's policy 'thompson' is not used" \
        in captured.err


def test_the_options_of_weights_import_pick_agree_and_refuse(tmp_path: Path, capsys) -> None:
    db = save_kinds(tmp_path / "fb.db", (("bm25", "dense"), "thompson"), (("bm25",), "gradient"))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"bm25": 0.4, "dense": 0.6}), encoding="utf-8")
    # weights of no kind on the store: the newest snapshot named, and the kinds there are
    splade = tmp_path / "splade.json"
    splade.write_text(json.dumps({"bm25": 0.5, "splade": 0.5}), encoding="utf-8")
    assert main(["weights", "import", str(db), str(splade)]) == 2
    line = one_error_line(capsys)
    assert "but the store's newest snapshot (version 2: policy gradient, bm25) is for ['bm25'], and none of the 2 " \
           "kinds of ensemble on the store is of these retrievers" in line and "the state is for" not in line
    # a kind whose retrievers are not the weights'
    assert main(["weights", "import", str(db), str(bare), "--policy", "gradient"]) == 2
    assert "but the store's newest snapshot (version 2: policy gradient, bm25) is for ['bm25']" \
        in one_error_line(capsys)
    assert main(["weights", "import", str(db), str(bare), "--retrievers", "bm25"]) == 2
    assert "weights name ['bm25', 'dense'], not the retrievers named (bm25)" in one_error_line(capsys)
    assert snapshot_count(db) == 2
    assert main(["weights", "import", str(db), str(bare), "--retrievers", "dense,bm25"]) == 0
    assert capsys.readouterr().out.startswith("imported as version 3")
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"bm25": 1.0}), encoding="utf-8")
    assert main(["weights", "import", str(db), str(one), "--policy", "gradient"]) == 0
    assert capsys.readouterr().out.startswith("already version 2")
    # an older snapshot than its kind's newest would roll that kind back
    assert main(["weights", "import", str(db), str(bare), "--version", "1"]) == 2
    assert "is not the newest of its kind" in one_error_line(capsys)
    assert main(["weights", "import", str(db), str(one), "--version", "2"]) == 0
    captured = capsys.readouterr()  # onto a kind other than the newest's, the notes name it so
    assert captured.out.startswith("already version 2")
    assert "the store's newest snapshot of the kind named (version 2) holds these already" in captured.err
    # a file's state is imported as it is: the options must agree with it
    full = tmp_path / "full.json"
    assert main(["weights", "export", str(db), str(full), "--policy", "thompson"]) == 0
    capsys.readouterr()
    assert main(["weights", "import", str(db), str(full), "--policy", "gradient"]) == 2
    assert "its state is of policy 'thompson', not 'gradient' as named" in one_error_line(capsys)
    assert main(["weights", "import", str(db), str(full), "--policy", "thompson"]) == 0
    assert capsys.readouterr().out.startswith("already version 3")


def test_into_a_store_with_no_snapshot_policy_names_the_new_states_policy(tmp_path: Path, capsys) -> None:
    from rlfb.weight_config import import_weights

    db = tmp_path / "fb.db"
    FeedbackStore(db).close()
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"bm25": 0.4, "dense": 0.6}), encoding="utf-8")
    assert main(["weights", "import", str(db), str(bare), "--policy", "thompson"]) == 0
    assert newest(db)["policy"] == "thompson"
    with FeedbackStore(db) as store:  # the same, from Python
        out = import_weights(store, bare, retrievers=["dense", "bm25"], policy="thompson")
    assert out["written"] is False and out["policy"] == "thompson"


@pytest.mark.parametrize(("rlfb_dir", "xdg", "expected"), [
    (None, None, "HOME/.cache/rlfb"),
    (None, "/xdg/cache", "/xdg/cache/rlfb"),
    (None, "relative/cache", "HOME/.cache/rlfb"),  # the XDG specification: a relative path is ignored
    ("/mine", "/xdg/cache", "/mine"),
])
def test_the_default_cache_folder_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         rlfb_dir: str | None, xdg: str | None, expected: str) -> None:
    # XDG_CACHE_HOME was not read: rlfb wrote under ~/.cache where Hugging Face's and matplotlib's caches did not
    from rlfb.retrievers.cache_file import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in (("RLFB_CACHE_DIR", rlfb_dir), ("XDG_CACHE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert default_cache_dir() == Path(expected.replace("HOME", str(tmp_path)))
