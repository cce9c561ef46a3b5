"""Turn `rlfb simulate --json` outputs into the README's results table.

    python benchmarks/results_table.py RESULTS_DIR

reads every `rlfb simulate --json` output in RESULTS_DIR, named DATASET_POLICY.json as the README's commands
name them: POLICY is the run's policy (thompson, gradient, batch, ...), with ``_nomem`` for a run with
``--no-memory``; a file named otherwise is of the collection its JSON names. A run given ``--policy-option``
or ``--learner-option`` values is a system of its own, labelled with them. The README's collections come first
(scifact, cranfield, cisi), then ``beir_variants.py``'s variants in the order it builds them, then the others by
name; within one, thompson, gradient, batch and thompson_nomem
first, then the others by name. The baselines come from the first file of each collection, so files of one
collection whose seeds, user, stream or candidates differ are refused (exit status 1). A second table
splits the thompson runs' held-out figure between the held-out queries that share a relevant document with a
stream query and those that share none. A folder without a simulate output is an error (exit status 1).

    python benchmarks/results_table.py --variants RESULTS_DIR

prints instead the README's table of "Other shapes of collection": one row per thompson run (a variant),
its stream and held-out question counts, held-out nDCG@10 of the learned weights and of RRF, equal and tuned
fixed weights (four decimals), and the learned seen and online figures with RRF's beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one


def fmt(entry: dict) -> str:
    return "–" if entry is None or entry.get("mean") is None else f"{entry['mean']:.3f}"


# the README's order; other collections and policies follow by name
# the variants in the order benchmarks/beir_variants.py builds them, as the README's "Other shapes" table lists them
VARIANTS = ("cranfield_covid_like", "cisi_dev_split", "scifact_test_only", "cranfield_odd_ids", "cisi_long_queries",
            "cranfield_nfcorpus_splits")
COLLECTIONS = ("scifact", "cranfield", "cisi", *VARIANTS)
POLICIES = ("thompson", "gradient", "batch", "thompson_nomem")
BASELINES = ("bm25", "dense", "splade", "equal", "rrf", "tuned_fixed", "oracle_fixed", "per_query_oracle")


def policy_key(result: dict) -> str:
    """``thompson``, or ``thompson_nomem`` for a run without feedback memory, with the options, fusion and
    perturbation it ran with after it: the name ``rlfb simulate``'s own table gives the run
    (:func:`rlfb.simulation.results.run_label`)."""
    from rlfb.simulation.results import run_label

    return run_label(result["config"])


def find_results(root: Path) -> dict[str, dict[str, dict]]:
    """collection -> policy key -> the simulate output, each in the tables' order."""
    found: dict[tuple[str, str], tuple[Path, dict]] = {}
    for path in sorted(root.glob("*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            print(f"results_table: skipped {path}: {exc}", file=sys.stderr)
            continue
        if not (isinstance(result, dict) and {"final", "baselines", "config"} <= set(result)):
            continue  # another command's JSON (rlfb evaluate's, say)
        if not (isinstance(result["config"], dict) and isinstance(result["config"].get("policy"), str)):
            print(f"results_table: skipped {path}: its config names no policy", file=sys.stderr)
            continue
        key = policy_key(result)
        # the file's name says the collection (a folder named otherwise still reads as the README's), else the JSON
        ds = (path.stem[: -len(key) - 1] if path.stem.endswith(f"_{key}") and len(path.stem) > len(key) + 1
              else result.get("dataset") or Path(result["config"].get("dataset_path", path.stem)).name)
        ran_on = result.get("dataset")
        if isinstance(ran_on, str) and ran_on != ds:  # a run saved under another collection's name, say
            print(f"results_table: {path.name} is read as {ds}, but its run was on {ran_on!r}", file=sys.stderr)
        if (ds, key) in found:
            print(f"results_table: skipped {path}: {found[ds, key][0].name} is also {ds} {key}", file=sys.stderr)
            continue
        found[ds, key] = (path, result)

    def order(name: str, first: tuple[str, ...]) -> tuple[int, str]:
        return (first.index(name), "") if name in first else (len(first), name)

    tables: dict[str, dict[str, dict]] = {}
    for ds, key in sorted(found, key=lambda dk: (order(dk[0], COLLECTIONS), order(dk[1], POLICIES))):
        tables.setdefault(ds, {})[key] = found[ds, key][1]
    return tables


#: the settings that make one collection's runs one experiment: the table prints its first file's baselines
#: beside every file's learned figures, so they must have the same seeds (on cranfield and cisi each seed draws
#: its own held-out half), user, stream and candidates, and fusion (the grid of the tuned and oracle weights holds
#: the learner's own fusion)
SAME_EXPERIMENT = ("seeds", "split", "stream_split", "user", "click_model", "interactions", "explicit_rate", "noise",
                   "reformulation_rate", "mean_delay", "late_rate", "late_delay", "k", "answer_k", "candidate_k",
                   "retrievers", "models", "max_heldout", "max_seen", "max_grade", "spacing", "grid_step", "rrf_c",
                   "reward", "attribution_window", "fusion", "dataset_sha256")


def mismatched(results: dict[str, dict]) -> list[str]:
    """The :data:`SAME_EXPERIMENT` settings in which one collection's runs differ (a setting an older output
    lacks is not compared)."""
    configs = [r["config"] for r in results.values()]
    return [k for k in SAME_EXPERIMENT
            if len({json.dumps(c[k], sort_keys=True) for c in configs if k in c}) > 1]


def environments(tables: dict[str, dict[str, dict]]) -> dict[str, list[str]]:
    """The runs of each environment their JSON records (``config.environment`` less its threads; outputs made
    before it was recorded are left out), by a short description of it."""
    out: dict[str, list[str]] = {}
    for ds, results in tables.items():
        for policy, r in results.items():
            env = r["config"].get("environment")
            if env is None:
                continue
            key = json.dumps({k: v for k, v in env.items() if k != "threads"}, sort_keys=True)
            out.setdefault(key, []).append(f"{ds} {policy}")
    return out


def fmt4(entry: dict) -> str:
    return "–" if entry is None or entry.get("mean") is None else f"{entry['mean']:.4f}"


def seed_counts(runs: list[dict], key: str) -> str:
    """The seeds' counts of ``key`` (``stream_queries``, ``heldout_queries``): one number where every seed has it,
    else the lowest and highest (each seed halves the questions its own way where a split is missing).

    >>> seed_counts([{"stream_queries": 12}, {"stream_queries": 12}], "stream_queries")
    '12'
    >>> seed_counts([{"heldout_queries": 12}, {"heldout_queries": 14}, {}], "heldout_queries")
    '12–14'
    """
    counts = sorted({run[key] for run in runs if key in run})
    if not counts:
        return "–"
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


def variants_table(tables: dict[str, dict[str, dict]]) -> None:
    """The "Other shapes of collection" table: each collection's thompson run against its baselines."""
    print("| variant | stream / held-out questions | held-out: learned | RRF | equal | tuned fixed | seen (RRF) "
          "| online (RRF) |")
    print("|---|---|---|---|---|---|---|---|")
    for ds, results in tables.items():
        r = results.get("thompson")
        if r is None:
            continue
        split = r["config"].get("split", "test")
        label = ds + (f" (`--split {split}`)" if split != "test" else "")
        runs = r.get("runs") or [{}]
        f, b = r["final"], r["baselines"]
        print(f"| {label} | {seed_counts(runs, 'stream_queries')} / {seed_counts(runs, 'heldout_queries')} "
              f"| {fmt4(f['heldout_ndcg@10'])} | {fmt4(b['rrf']['heldout_ndcg@10'])} "
              f"| {fmt4(b['equal']['heldout_ndcg@10'])} | {fmt4(b['tuned_fixed']['heldout_ndcg@10'])} "
              f"| {fmt(f['seen_ndcg@10'])} ({fmt(b['rrf']['seen_ndcg@10'])}) "
              f"| {fmt(f['online_ndcg@10'])} ({fmt(b['rrf'].get('online_ndcg@10'))}) |")


def main(folder: str, *, variants: bool = False) -> None:
    root = Path(folder)
    tables = find_results(root)
    if not tables:  # an empty table would read as a result
        sys.exit(f"results_table: no rlfb simulate --json output in {root}")
    if variants:
        variants_table(tables)
        return
    for ds, results in tables.items():
        differ = mismatched(results)
        if differ:  # one run's baselines beside another's learned figures would compare other questions
            sys.exit(f"results_table: the {ds} runs ({', '.join(results)}) differ in {', '.join(differ)}: the "
                     "table sets each beside the first one's baselines, so run them with the same settings")
    places = environments(tables)
    if len(places) > 1:  # the same code and seeds gave scifact thompson 0.7520 on one machine and 0.7471 on another
        print("results_table: note: these runs were made in " + str(len(places)) + " environments (processor, "
              "packages or code): " + "; ".join(f"{', '.join(runs)}: {env}" for env, runs in places.items()),
              file=sys.stderr)
    print("| collection | system | held-out | seen | online |")
    print("|---|---|---|---|---|")
    for ds, results in tables.items():
        for policy, r in results.items():
            f = r["final"]
            name, _, options = policy.partition(" ")
            label = name[: -len("_nomem")] + ", memory off" if name.endswith("_nomem") else name
            label += f" ({options})" if options else ""
            print(f"| {ds} | **{label}** | {fmt(f['heldout_ndcg@10'])} | {fmt(f['seen_ndcg@10'])} "
                  f"| {fmt(f['online_ndcg@10'])} |")
        first = next(iter(results.values()))
        for name in (n for n in BASELINES if n in first["baselines"]):  # a run without splade has no splade row
            b = first["baselines"][name]
            print(f"| {ds} | {name} | {fmt(b['heldout_ndcg@10'])} | {fmt(b['seen_ndcg@10'])} "
                  f"| {fmt(b.get('online_ndcg@10'))} |")
    print()
    print("| collection | held-out queries | count (mean) | thompson | equal | rrf | tuned fixed |")
    print("|---|---|---|---|---|---|---|")
    skipped: list[str] = []
    for ds, results in tables.items():
        if "thompson" not in results:
            continue
        overlap = results["thompson"].get("heldout_overlap") or {}  # absent from older outputs
        for group, label in (("shares_an_answer", "sharing a relevant document with the stream"),
                             ("shares_none", "sharing none")):
            g = overlap.get(group)
            if g is None:
                continue
            seeds = len(results["thompson"]["config"].get("seeds") or ()) or g["learned"]["n"]
            if g["learned"]["n"] < seeds:  # cisi's "sharing none": one query of one seed read as a row of zeros
                skipped.append(f"{ds}, {label}: such queries in {g['learned']['n']} of {seeds} seeds "
                               f"({g['queries']:.1f} a seed on average), not a row")
                continue
            print(f"| {ds} | {label} | {g['queries']:.1f} | {fmt(g['learned'])} | {fmt(g['equal'])} "
                  f"| {fmt(g['rrf'])} | {fmt(g['tuned_fixed'])} |")
    for line in skipped:
        print(f"\n{line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("folder", nargs="?", default="out/results",
                        help="folder of DATASET_POLICY.json files written by rlfb simulate --json")
    parser.add_argument("--variants", action="store_true",
                        help="print the table of the README's \"Other shapes of collection\" instead")
    args = parser.parse_args()
    if not Path(args.folder).is_dir():
        parser.error(f"no such folder: {args.folder}")
    try:
        main(args.folder, variants=args.variants)
    except BrokenPipeError:  # read with `| head`: the reader has what it wanted; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
