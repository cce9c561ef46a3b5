"""The speed benchmarks the README quotes still run to the end at their smallest sizes and print their ratio
against the peer they are measured with (``float_sensitivity.py`` broke unnoticed once the dense retriever's
encoding moved: no test ran it). Figures are not checked here: timings belong to the benchmarks. A bad argument
is a one-line usage error (exit status 2), not a traceback from deep in the run or figures of nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

RUNS = {
    "bench_feedback.py": (["--single", "200", "--batched", "400", "--batch", "100", "--rounds", "1"],
                           "rlfb single feedback runs at"),
    "bench_corpus_update.py": (["--chunks", "300", "--updates", "1"], "ratio"),
    "bench_feedback_learning.py": (["--feedback", "10", "--throttled-feedback", "2", "--chunks", "100",
                                    "--repeats", "1"], "slower than recording"),
    "bench_retrieval.py": (["--chunks", "300", "--queries", "3", "--lc-queries", "2", "--no-splade"],
                          "faster than the first"),
    "bench_policies.py": (["--reps", "20", "--interactions", "300", "--seeds", "1"], "peer: LangChain"),
    "soak_feedback.py": (["--retrievals", "60", "--checkpoints", "30", "60", "--chunks", "100", "--questions",
                          "200"],
                         "feedbacks in 60 retrievals"),
}
# its once-a-second runs (2 feedbacks) span a fraction of a second however slow the machine: one snapshot each,
# which it said nothing of
WARNS = {"bench_feedback_learning.py": "under a second, so each wrote one snapshot at most"}


def _run(script: str, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "RLFB_CACHE_DIR": str(cwd / "cache"), **env,
               "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, check=False)


def _tiny_beir(root: Path) -> Path:
    """A BEIR folder of three documents and one judged test question."""
    (root / "qrels").mkdir(parents=True)
    docs = ["solar panels on a roof", "wind turbines at sea", "a recipe for bread"]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                                               for i, t in enumerate(docs)), encoding="utf-8")
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "solar roof"}) + "\n", encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n", encoding="utf-8")
    return root


MIN = "must be at least 1, got"
BAD_ARGS = [  # each was a traceback (or, for bench_feedback's rounds, figures of 0/s) before it was checked
    ("bench_corpus_update.py", ["--updates", "0"], f"argument --updates: {MIN} 0"),
    ("bench_feedback_learning.py", ["--feedback", "0", "--throttled-feedback", "0"], f"argument --feedback: {MIN} 0"),
    ("bench_feedback_learning.py", ["--throttled-feedback", "0"], f"argument --throttled-feedback: {MIN} 0"),
    ("bench_policies.py", ["--seeds", "0"], f"argument --seeds: {MIN} 0"),
    ("bench_policies.py", ["--reps", "0"], f"argument --reps: {MIN} 0"),
    ("bench_policies.py", ["--interactions", "0"], f"argument --interactions: {MIN} 0"),
    ("bench_retrieval.py", ["--queries", "0"], f"argument --queries: {MIN} 0"),
    ("bench_retrieval.py", ["--chunks", "5"], "argument --chunks: must be at least 11, got 5"),
    ("bench_retrieval.py", ["--queries", "1"], "--queries must be at least 2 unless --no-splade"),
    ("bench_feedback.py", ["--single", "2", "--batched", "2", "--rounds", "5"], "--single 2 is fewer than --rounds 5"),
    ("bench_feedback.py", ["--single", "5", "--batched", "2", "--rounds", "3"], "--batched 2 is fewer than --rounds 3"),
    ("bench_feedback.py", ["--rounds", "0"], f"argument --rounds: {MIN} 0"),
    ("bench_feedback.py", ["--batch", "0"], f"argument --batch: {MIN} 0"),
    ("soak_feedback.py", ["--retrievals", "0"], f"argument --retrievals: {MIN} 0"),
    ("weights_information_bound.py", ["--seeds", "0"], f"argument --seeds: {MIN} 0"),
    ("weights_information_bound.py", ["--interactions", "0"], f"argument --interactions: {MIN} 0"),
    ("weights_information_bound.py", ["--dataset", "no-such-collection"], "no collection at no-such-collection"),
    ("check_scifact_retrievers.py", ["--retrievers", "bm25,foo"], "unknown retriever 'foo'; valid names: bm25"),
    ("exploration_cost.py", ["--dataset", "no-such-collection"], "no such folder: no-such-collection"),
    ("exploration_cost.py", ["--max-queries", "0"], f"argument --max-queries: {MIN} 0"),  # it ran every question
    ("exploration_cost.py", ["--max-queries", "-2"], f"argument --max-queries: {MIN} -2"),  # it dropped the last 2
    ("float_sensitivity.py", ["--dataset", "no-such-collection"], "no collection at no-such-collection"),
    ("float_sensitivity.py", ["--seeds", "0"], f"argument --seeds: {MIN} 0"),
]


@pytest.mark.parametrize(("script", "args", "message"), BAD_ARGS,
                         ids=[f"{s}{''.join(a)}" for s, a, _ in BAD_ARGS])
def test_a_bad_argument_is_a_one_line_usage_error(script: str, args: list[str], message: str,
                                                  tmp_path: Path) -> None:
    done = _run(script, args, tmp_path, TMPDIR=str(tmp_path))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"{script}: error: ") and message in last and "Traceback" not in done.stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []  # nothing started: no child run, no folder


def test_an_unknown_retriever_is_a_usage_error_before_the_collection_is_read(tmp_path: Path) -> None:
    # exploration_cost.py asks rlfb (a ValidationError) before any work: a missing collection is not read first
    done = _run("exploration_cost.py", ["--dataset", str(tmp_path / "no-such"), "--retrievers", "foo"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == "exploration_cost.py: error: unknown retriever 'foo'; valid names: " \
                                           "bm25, dense, splade"


def test_float_sensitivity_says_a_failed_run_in_one_line_and_removes_its_folder(tmp_path: Path) -> None:
    # a run that fails (here: an option `rlfb simulate` does not take, handed on to it) was a CalledProcessError
    # traceback, and it left its empty rlfb-float-* folder behind
    folder = _tiny_beir(tmp_path / "tiny")
    temp = tmp_path / "temp"
    temp.mkdir()
    done = _run("float_sensitivity.py", ["--dataset", str(folder), "--salts", "1", "--seeds", "1",
                                         "--interactions", "5", "--no-such-option"], tmp_path, TMPDIR=str(temp))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "unrecognized arguments: --no-such-option" in done.stderr  # the run's own error, then the script's
    assert done.stderr.splitlines()[-1].startswith("float_sensitivity.py: error: the run ")
    assert done.stderr.splitlines()[-1].endswith(" failed (exit status 2)")
    assert list(temp.iterdir()) == []


def test_the_soak_test_reports_a_checkpoint_before_the_first_snapshot(tmp_path: Path) -> None:
    # a checkpoint before the first feedback found no snapshot to measure: a TypeError unpacking None
    done = _run("soak_feedback.py", ["--retrievals", "20", "--checkpoints", "1", "--chunks", "200",
                                     "--questions", "100", "--seed", "0"], tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    first, last = [line for line in done.stdout.splitlines() if line.startswith("after ")]
    assert first.startswith("after      1 retrievals: no snapshot yet; store file ") and "no feedback" in first
    assert last.startswith("after     20 retrievals: state ")
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"])


def test_bench_feedback_ingests_every_item_when_the_rounds_do_not_divide_them(tmp_path: Path) -> None:
    # 7 single and 13 batched items in 3 rounds: 2 and 4 per round, the remainder (1 and 1) dropped unsaid
    done = _run("bench_feedback.py", ["--single", "7", "--batched", "13", "--rounds", "3", "--batch", "4",
                                      "--json"], tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    res = json.loads(done.stdout)
    assert res["rows"]["feedback"] == 7 + 13 and res["rows"]["events"] == 7 + 13 + 7
    for key in ("feedback_single_per_s", "feedback_batched_per_s", "naive_insert_single_per_s",
                "plain_insert_single_per_s"):
        assert min(res[key].values()) > 0, (key, res[key])
    assert res["single_vs_naive_insert"] > 0 and res["single_vs_plain_insert"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"])


@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_benchmark_runs_at_its_smallest_size(script: str, tmp_path: Path) -> None:
    args, expected = RUNS[script]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RLFB_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in done.stderr
    assert WARNS.get(script, "") in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"])  # nothing written beside it


@pytest.mark.datasets
def test_the_scifact_retriever_check_gives_the_readmes_bm25_figure(scifact_path: Path, tmp_path: Path) -> None:
    """``check_scifact_retrievers.py`` (BM25 alone: the dense and SPLADE encodings of 5,183 documents take
    minutes) runs and prints the BM25 figure of the README's retrievers table."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "check_scifact_retrievers.py"), "--data",
                           str(scifact_path), "--retrievers", "bm25"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith("bm25 ")]
    readme = (BENCHMARKS.parent / "README.md").read_text(encoding="utf-8")
    assert row[-1] == "ok" and f"| BM25 (bm25s, lucene, lowercase `\\w+`) | {row[1]} |" in readme
    assert list(tmp_path.iterdir()) == []


@pytest.mark.datasets
def test_the_exploration_cost_benchmark_prints_both_fusions_and_their_ratio(scifact_path: Path,
                                                                            tmp_path: Path) -> None:
    """``exploration_cost.py`` on SciFact's first 20 test questions, BM25 alone (its index takes seconds)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "exploration_cost.py"), "--dataset", str(scifact_path),
                           "--retrievers", "bm25", "--max-queries", "20"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
            if line.startswith(("minmax ", "rrf "))}
    assert set(rows) == {"minmax", "rrf"} and rows["minmax"][0] == rows["rrf"][0]  # BM25 alone: one greedy ranking
    assert "under RRF as a ratio of its cost under min-max" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_every_script_puts_this_checkouts_rlfb_first_on_the_path(tmp_path: Path) -> None:
    # three scripts put only benchmarks/ on sys.path: run from another checkout with a shared virtualenv, they
    # measured the rlfb installed there, and a figure said to be this code's was another's
    scripts = sorted(str(p) for p in BENCHMARKS.glob("*.py")
                     if not p.name.startswith("_") and "from rlfb" in p.read_text(encoding="utf-8"))
    assert len(scripts) >= 10  # every script that imports rlfb (beir_variants reads and writes files alone)
    code = (
        "import json, runpy, sys\n"
        "start = list(sys.path)\n"
        "first = {}\n"
        "for script in sys.argv[1:]:\n"
        "    sys.path[:] = start\n"
        "    runpy.run_path(script, run_name='not_main')  # the module's own lines, not its main()\n"
        "    paths = [p for p in sys.path if p]\n"
        "    site = min([i for i, p in enumerate(paths) if 'site-packages' in p], default=len(paths))\n"
        "    first[script] = [p for p in paths[:site]]\n"
        "print(json.dumps(first))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, *scripts], cwd=tmp_path, env={**env, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ahead_of_site_packages = json.loads(done.stdout.splitlines()[-1])
    root = str(BENCHMARKS.parent)
    assert {Path(s).name for s, paths in ahead_of_site_packages.items() if root not in paths} == set()
