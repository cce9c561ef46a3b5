"""``benchmarks/results_table.py``: the README's results table from ``rlfb simulate --json`` outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlfb.demo_corpus import generate_demo_corpus
from rlfb.simulation.runner import SimulationConfig, simulate

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "results_table.py"


def table(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(folder)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def output() -> dict:
    """A real simulate output (its dataset is "rlfb-demo"), BM25 alone: its baselines have no dense or splade."""
    config = SimulationConfig(policy="fixed", interactions=20, seeds=(0,), checkpoints=1, retrievers=("bm25",))
    return json.loads(json.dumps(simulate(generate_demo_corpus(n_devices=10, seed=2), config)))


def write(path: Path, result: dict, *, policy: str, memory: bool = True, dataset: str | None = None) -> None:
    config = {**result["config"], "policy": policy, "memory": memory}
    path.write_text(json.dumps({**result, "config": config, "dataset": dataset or result["dataset"]}))


def test_every_collection_in_the_folder_is_tabled(tmp_path: Path, output: dict) -> None:
    # the collections were the README's three, by name: any other's results printed empty tables, exit status 0
    write(tmp_path / "trec-covid_gradient.json", output, policy="gradient")
    write(tmp_path / "cisi_thompson_nomem.json", output, policy="thompson", memory=False)
    write(tmp_path / "cisi_thompson.json", output, policy="thompson")
    write(tmp_path / "run7.json", output, policy="thompson")  # named otherwise: the JSON's dataset
    (tmp_path / "metrics.json").write_text(json.dumps({"bm25": {"ndcg@10": 0.5}}))  # rlfb evaluate's: not one
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ")[:2] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    learned = [r for r in rows if r[1].startswith("**")]
    # the README's collections first, in its order, then the others by name
    assert learned == [["| cisi", "**thompson**"], ["| cisi", "**thompson, memory off**"],
                       ["| rlfb-demo", "**thompson**"], ["| trec-covid", "**gradient**"]]
    mean = output["baselines"]["rrf"]["heldout_ndcg@10"]["mean"]
    assert f"| trec-covid | rrf | {mean:.3f} |" in done.stdout
    assert ["| rlfb-demo", "sharing none"] in rows  # the thompson run's split of the held-out figure
    assert "| trec-covid | dense |" not in done.stdout  # a baseline the runs did not have


def test_a_folder_without_simulate_output_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps({"bm25": {"ndcg@10": 0.5}}))
    done = table(tmp_path)
    assert done.returncode != 0 and done.stdout == ""
    assert f"no rlfb simulate --json output in {tmp_path}" in done.stderr


def test_a_run_with_policy_options_is_a_system_of_its_own(tmp_path: Path, output: dict) -> None:
    # a run given --policy-option was tabled as plain thompson, or skipped as a second cisi thompson
    write(tmp_path / "cisi_thompson.json", output, policy="thompson", dataset="cisi")
    tuned = {**output, "config": {**output["config"], "policy_options": {"cf_min_questions": 10}}}
    write(tmp_path / "cisi_thompson_cf10.json", tuned, policy="thompson", dataset="cisi")
    rf = {**output, "config": {**output["config"], "learner_overrides": {"relevance_feedback_weight": 0.1}}}
    write(tmp_path / "cisi_thompson_rf.json", rf, policy="thompson", dataset="cisi")
    # epsilon is thompson's option and a learner setting both: two runs, two rows
    for name, where in (("pe", "policy_options"), ("le", "learner_overrides")):
        run = {**output, "config": {**output["config"], where: {"epsilon": 0.2}}}
        write(tmp_path / f"cisi_thompson_{name}.json", run, policy="thompson", dataset="cisi")
    (tmp_path / "broken.json").write_text(json.dumps({"final": {}, "baselines": {}, "config": []}))
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| cisi | **thompson** |" in done.stdout
    assert "| cisi | **thompson (cf_min_questions=10)** |" in done.stdout
    assert "| cisi | **thompson (learner.relevance_feedback_weight=0.1)** |" in done.stdout
    assert "| cisi | **thompson (epsilon=0.2)** |" in done.stdout
    assert "| cisi | **thompson (learner.epsilon=0.2)** |" in done.stdout
    assert "skipped" in done.stderr and "broken.json: its config names no policy" in done.stderr


def test_the_variants_table_has_the_readmes_columns(tmp_path: Path, output: dict) -> None:
    # the README said `results_table.py` printed its "Other shapes of collection" table; it printed the main one
    write(tmp_path / "cisi_dev_split_thompson.json", {**output, "config": {**output["config"], "split": "dev"}},
          policy="thompson")
    write(tmp_path / "cisi_dev_split_gradient.json", output, policy="gradient")  # not a row of its own
    done = subprocess.run([sys.executable, str(SCRIPT), "--variants", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| cisi")]
    run, base = output["runs"][0], output["baselines"]
    assert rows == [
        f"| cisi_dev_split (`--split dev`) | {run['stream_queries']} / {run['heldout_queries']} "
        f"| {output['final']['heldout_ndcg@10']['mean']:.4f} | {base['rrf']['heldout_ndcg@10']['mean']:.4f} "
        f"| {base['equal']['heldout_ndcg@10']['mean']:.4f} | {base['tuned_fixed']['heldout_ndcg@10']['mean']:.4f} "
        f"| {output['final']['seen_ndcg@10']['mean']:.3f} ({base['rrf']['seen_ndcg@10']['mean']:.3f}) "
        f"| {output['final']['online_ndcg@10']['mean']:.3f} ({base['rrf']['online_ndcg@10']['mean']:.3f}) |"
    ]


def test_the_variants_table_gives_every_seeds_question_counts(tmp_path: Path, output: dict) -> None:
    # it gave seed 0's counts alone, where a collection without a split is halved by each seed its own way
    runs = [{**output["runs"][0], "seed": s, "stream_queries": n, "heldout_queries": 30 - n}
            for s, n in enumerate((14, 16, 15))]
    write(tmp_path / "cisi_thompson.json", {**output, "runs": runs}, policy="thompson")
    done = subprocess.run([sys.executable, str(SCRIPT), "--variants", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "| cisi | 14–16 / 14–16 |" in done.stdout


def test_the_variants_are_tabled_in_the_order_they_are_built(tmp_path: Path, output: dict) -> None:
    # they came out by name, where the README (and beir_variants.py) lists them in the order they are built
    import importlib.util

    spec = importlib.util.spec_from_file_location("beir_variants", SCRIPT.parent / "beir_variants.py")
    assert spec is not None and spec.loader is not None
    variants = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variants)
    names = list(variants.VARIANTS)
    for name in names:
        write(tmp_path / f"{name}_thompson.json", output, policy="thompson")
    done = subprocess.run([sys.executable, str(SCRIPT), "--variants", str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert [line.split(" | ")[0][2:].split(" (")[0] for line in done.stdout.splitlines()[2:]] == names


def test_the_held_out_split_table_has_the_readmes_header(tmp_path: Path, output: dict) -> None:
    write(tmp_path / "cisi_thompson.json", output, policy="thompson")
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| collection | held-out queries | count (mean) | thompson | equal | rrf | tuned fixed |" in done.stdout
    readme = (SCRIPT.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "| collection | held-out queries | count (mean) | thompson | equal | rrf | tuned fixed |" in readme


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path, output: dict) -> None:
    # `results_table.py DIR | head -2` ended in a BrokenPipeError traceback
    for name in ("scifact", "cranfield", "cisi"):
        write(tmp_path / f"{name}_thompson.json", output, policy="thompson", dataset=name)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader is gone before the rest is written
    err = proc.stderr.read()
    proc.wait()
    assert "Traceback" not in err, err


def test_runs_of_one_collection_with_other_settings_are_refused(tmp_path: Path, output: dict) -> None:
    # a gradient run of other seeds and another user was printed above the thompson run's baselines: on
    # cranfield and cisi each seed draws its own held-out half, so the rows compared other questions
    write(tmp_path / "cranfield_thompson.json", output, policy="thompson")
    other = {**output, "config": {**output["config"], "seeds": [0, 1, 2, 3], "user": "informational"}}
    write(tmp_path / "cranfield_gradient.json", other, policy="gradient")
    done = table(tmp_path)
    assert done.returncode == 1 and "cranfield runs" in done.stderr and "seeds, user" in done.stderr
    assert "| cranfield |" not in done.stdout
    write(tmp_path / "cranfield_gradient.json", output, policy="gradient")  # the same settings: tabled
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "**gradient**" in done.stdout and "**thompson**" in done.stdout
    # the tuned and oracle weights search the learner's fusion: a z-score run beside min-max baselines was
    # tabled as plain gradient, compared with a tuned figure its own run did not have
    zscore = {**output, "config": {**output["config"], "fusion": "zscore"}}
    write(tmp_path / "cranfield_gradient.json", zscore, policy="gradient", dataset="cranfield")
    done = table(tmp_path)
    assert done.returncode == 1 and "cranfield runs" in done.stderr and "fusion" in done.stderr
    (tmp_path / "cranfield_thompson.json").unlink()
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert '| cranfield | **gradient (fusion="zscore")** |' in done.stdout
    # a run of benchmarks/float_sensitivity.py is labelled, not tabled as the code's own figure
    moved = {**output, "config": {**output["config"], "perturbation": {"scale": 3e-7, "salt": "s1"}}}
    (tmp_path / "cranfield_gradient.json").unlink()
    write(tmp_path / "cranfield_thompson.json", moved, policy="thompson", dataset="cranfield")
    done = table(tmp_path)
    assert '| cranfield | **thompson (perturbation={"scale": 3e-07, "salt": "s1"})** |' in done.stdout


def test_a_held_out_split_some_seeds_lack_is_named_not_tabled(tmp_path: Path, output: dict) -> None:
    # cisi's "sharing none": one query of one seed of five printed as a row of zeros the README says is not there
    result = json.loads(json.dumps(output))
    result["config"]["seeds"] = [0, 1, 2, 3, 4]
    none = result["heldout_overlap"]["shares_none"]
    none["queries"] = 0.2
    for name, figure in none.items():
        if name != "queries":
            figure.update({"mean": 0.0, "ci95": [None, None], "n": 1})
    for figure in result["heldout_overlap"]["shares_an_answer"].values():
        if isinstance(figure, dict):
            figure["n"] = 5
    write(tmp_path / "cisi_thompson.json", result, policy="thompson")
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| cisi | sharing none |" not in done.stdout and "| cisi | sharing a relevant" in done.stdout
    assert "cisi, sharing none: such queries in 1 of 5 seeds (0.2 a seed on average), not a row" in done.stdout


def test_runs_made_in_two_environments_are_noted(tmp_path: Path, output: dict) -> None:
    # the same code and seeds gave scifact thompson 0.7520 held-out on one machine and 0.7471 on another; a table
    # of runs from both said nothing of it
    write(tmp_path / "a.json", output, policy="thompson")
    other = json.loads(json.dumps(output))
    other["config"]["environment"]["processor"] = "another processor"
    write(tmp_path / "b.json", other, policy="gradient")
    done = table(tmp_path)
    assert done.returncode == 0 and "made in 2 environments" in done.stderr
    assert "another processor" in done.stderr and "| thompson" in done.stdout.replace("**", "")
    write(tmp_path / "b.json", output, policy="gradient")
    assert "environments" not in table(tmp_path).stderr


def test_a_run_saved_under_another_collections_name_is_noted(tmp_path: Path, output: dict) -> None:
    # an audit (2026-12-07) saved a cranfield run as scifact_thompson.json: its figures were tabled as scifact's,
    # without a word
    write(tmp_path / "scifact_thompson.json", output, policy="thompson", dataset="cranfield")
    done = table(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scifact_thompson.json is read as scifact, but its run was on 'cranfield'" in done.stderr
    write(tmp_path / "scifact_thompson.json", output, policy="thompson", dataset="scifact")
    assert "its run was on" not in table(tmp_path).stderr
