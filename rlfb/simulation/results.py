"""A run's seeds summarised (mean and Student-t 95 % interval), read back as a table or as paired differences,
and drawn as learning curves against the baselines' lines."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlfb.simulation.config import SimulationConfig, metric_keys
from rlfb.simulation.provenance import environment

__all__ = ["summarize", "iter_table", "paired_differences", "plot_curves", "run_label"]


def _interval(values: Sequence[float], *, clip: bool = True) -> dict[str, Any]:
    """Mean and Student-t 95 % interval over seeds (NaN values left out), clipped to [0, 1], the range
    of every figure it summarises (with few seeds the t interval alone can pass 1); ``clip=False`` for
    differences of figures, which may be negative.

    >>> _interval([0.5])["ci95"]  # one seed gives no interval, not a zero-width one
    [None, None]
    >>> [round(v, 3) for v in _interval([0.4, 0.5, 0.6])["ci95"]]
    [0.252, 0.748]
    >>> [round(v, 3) for v in _interval([0.9, 1.0])["ci95"]]
    [0.315, 1.0]
    """
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0}
    mean = float(arr.mean())
    if arr.size < 2:
        return {"mean": mean, "ci95": [None, None], "n": int(arr.size)}
    from scipy import stats

    half = float(stats.t.ppf(0.975, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    lo, hi = mean - half, mean + half
    return {"mean": mean, "ci95": [max(0.0, lo), min(1.0, hi)] if clip else [lo, hi], "n": int(arr.size)}


def _users_scales(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``max_grade`` as the summary's config gives it: the one scale where every seed's users read the same,
    else each seed's, in order (without a stream split each seed streams its own half, which may judge
    another top grade); nothing where the runs' settings do not give it."""
    scales = [r["settings"]["max_grade"] for r in runs if "max_grade" in r.get("settings", {})]
    if len(scales) != len(runs):
        return {}
    return {"max_grade": scales[0] if len(set(scales)) == 1 else scales}


def summarize(runs: Sequence[Mapping[str, Any]], config: SimulationConfig, extra: Mapping[str, Any]) -> dict:
    """Mean and 95% interval over seeds, in the JSON shape scripts read.

    ``runs`` keeps each seed's own figures, scalars: ``final`` and ``baselines`` (name -> its held-out,
    seen and online figures, and a tuned system's weights and fusion), so that learned minus a baseline
    pairs by seed."""
    keys = metric_keys(config.k)
    final = {k: _interval([r["final"][k] for r in runs]) for k in keys}
    baselines: dict[str, dict[str, Any]] = {}
    for name in runs[0]["baselines"]:
        entry: dict[str, Any] = {k: _interval([r["baselines"][name][k] for r in runs]) for k in keys}
        if "weights" in runs[0]["baselines"][name]:
            entry["weights"] = [r["baselines"][name]["weights"] for r in runs]
            entry["fusion"] = [r["baselines"][name]["fusion"] for r in runs]
        baselines[name] = entry
    overlap = {
        group: {"queries": _interval([r["heldout_overlap"][group]["queries"] for r in runs])["mean"],
                **{name: _interval([r["heldout_overlap"][group][name] for r in runs])
                   for name in runs[0]["heldout_overlap"][group] if name != "queries"}}
        for group in runs[0]["heldout_overlap"]
    }
    by_asks = {
        group: {"queries": _interval([r["seen_by_asks"][group]["queries"] for r in runs])["mean"],
                **{name: _interval([r["seen_by_asks"][group][name] for r in runs])
                   for name in runs[0]["seen_by_asks"][group] if name != "queries"},
                # paired by seed: the memory's lift over RRF on the same questions
                "learned_minus_rrf": _interval([r["seen_by_asks"][group]["learned"] - r["seen_by_asks"][group]["rrf"]
                                                for r in runs], clip=False)}
        for group in (runs[0].get("seen_by_asks") or {})
    }
    curve = []
    for i, point in enumerate(runs[0]["curve"]):
        row: dict[str, Any] = {"interactions": point["interactions"]}
        for k in keys:
            row[k] = _interval([r["curve"][i][k] for r in runs])
        if "baselines" in point:  # RRF's and equal weights' seen and online figures on this point's questions
            row["baselines"] = {name: {k: _interval([r["curve"][i]["baselines"][name][k] for r in runs])
                                       for k in figures} for name, figures in point["baselines"].items()}
        curve.append(row)
    return {
        "final": final,
        "baselines": baselines,
        "curve": curve,
        # held-out nDCG@k on the held-out queries that share a relevant document with the stream, and the rest
        "heldout_overlap": overlap,
        # the final seen figure by how often its questions were asked (1, 2, 3, 4-5, 6+ and 3+ times), learned,
        # RRF and equal weights on the same questions
        "seen_by_asks": by_asks,
        # every setting; "learner" as the learner ran (defaults filled in), "learner_overrides" as given
        "config": {**config.to_dict(), "learner": runs[0]["learner_config"], "learner_overrides": dict(config.learner),
                   **runs[0]["settings"], **_users_scales(runs), "environment": environment()},
        "weights": [r["weights"] for r in runs],
        "runs": [{k: v for k, v in r.items()
                  if k not in ("curve", "learner_config", "settings", "heldout_overlap", "seen_by_asks")}
                 for r in runs],
        **dict(extra),
    }


def run_label(config: Mapping[str, Any]) -> str:
    """The name of a run's learned system, from its JSON's ``config``: the policy, ``_nomem`` after it for a run
    without feedback memory, then the ``--policy-option`` and ``--learner-option`` values it was given, a fusion
    other than min-max (the tuned and oracle weights search the learner's fusion) and the perturbation of a
    ``benchmarks/float_sensitivity.py`` run: a row of a run of other settings does not read as the default's.

    >>> run_label({"policy": "thompson"})
    'thompson'
    >>> run_label({"policy": "thompson", "memory": False, "fusion": "zscore",
    ...            "learner_overrides": {"relevance_feedback_weight": 0.1}})
    'thompson_nomem fusion="zscore" learner.relevance_feedback_weight=0.1'
    """
    key = config["policy"] + ("" if config.get("memory", True) else "_nomem")
    # the learner's settings named apart: thompson's epsilon is a policy option and a learner setting both
    options = {**(config.get("policy_options") or {}),
               **{f"learner.{k}": v for k, v in (config.get("learner_overrides") or {}).items()}}
    if config.get("fusion", "minmax") != "minmax":
        options["fusion"] = config["fusion"]
    if config.get("perturbation"):  # a run of benchmarks/float_sensitivity.py: not the code's own figure
        options["perturbation"] = config["perturbation"]
    return key + "".join(f" {name}={json.dumps(value)}" for name, value in sorted(options.items()))


def iter_table(result: Mapping[str, Any]) -> Iterator[tuple[str, float | None, float | None, float | None]]:
    """Rows of (name, held-out, seen, online) means: the learned system first, named by :func:`run_label`
    (``learned (thompson_nomem)``; the policy alone named a run of any settings), then the baselines."""
    keys = metric_keys(result["config"]["k"])
    rows = [(f"learned ({run_label(result['config'])})", result["final"]), *result["baselines"].items()]
    for name, figures in rows:
        yield (name, *(figures[k]["mean"] if k in figures else None for k in keys))


def paired_differences(result: Mapping[str, Any], metric: str = "heldout") -> dict[str, dict[str, Any]]:
    """The learned policy's final figure minus each baseline's, seed by seed: mean and Student-t 95 % interval of
    the differences (``metric``: ``"heldout"``, ``"seen"`` or ``"online"``). Two intervals over few seeds can
    overlap where every seed's learned figure is above the baseline's; the paired one tells them apart.

    >>> result = {"config": {"k": 10}, "runs": [
    ...     {"final": {"heldout_ndcg@10": 0.80}, "baselines": {"rrf": {"heldout_ndcg@10": 0.70}}},
    ...     {"final": {"heldout_ndcg@10": 0.62}, "baselines": {"rrf": {"heldout_ndcg@10": 0.60}}},
    ...     {"final": {"heldout_ndcg@10": 0.75}, "baselines": {"rrf": {"heldout_ndcg@10": 0.70}}}]}
    >>> d = paired_differences(result)["rrf"]
    >>> round(d["mean"], 3), [round(v, 3) for v in d["ci95"]]
    (0.057, [-0.044, 0.157])
    """
    key = {"heldout": 0, "seen": 1, "online": 2}[metric]
    name = metric_keys(result["config"]["k"])[key]
    runs = result.get("runs") or []
    out: dict[str, dict[str, Any]] = {}
    for baseline in (runs[0]["baselines"] if runs else {}):
        diffs = [run["final"][name] - run["baselines"][baseline][name] for run in runs
                 if run["final"].get(name) is not None and run["baselines"][baseline].get(name) is not None]
        interval = _interval(diffs, clip=False)  # a difference may be negative
        if interval["n"]:
            out[baseline] = interval
    return out


def plot_curves(result: Mapping[str, Any], path: str) -> None:
    """Learning curves (mean and 95% band over seeds) against the baselines' lines, written to ``path`` whole or
    not at all (:func:`rlfb.files.write_atomically`), in the format its suffix names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = result["config"]["k"]
    held_key, seen_key, online_key = metric_keys(k)
    x = [p["interactions"] for p in result["curve"]]
    # each curve against the baselines' figure of the same kind: the online one (what users were shown, exploration
    # included) was drawn on the seen panel, against the baselines' seen lines
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), sharey=False)
    for ax, key, title, label in ((axes[0], held_key, "held-out queries", "learned (greedy)"),
                                  (axes[1], seen_key, "seen (repeated) queries", "learned (greedy)"),
                                  (axes[2], online_key, "online (what users were shown)", "learned (shown)")):
        # a missing value (nothing seen before the first query) is a gap in the curve
        mean = [_num(p[key]["mean"]) for p in result["curve"]]
        lo = [_num(p[key]["ci95"][0]) for p in result["curve"]]
        hi = [_num(p[key]["ci95"][1]) for p in result["curve"]]
        ax.plot(x, mean, "-", lw=2, label=label)
        seeds = len(result["config"].get("seeds") or [])
        # (one seed draws no band: its interval is None)
        ax.fill_between(x, lo, hi, alpha=0.2, label=f"95 % interval over {seeds} seeds" if seeds > 1 else None)
        for name, colour in (("rrf", "tab:red"), ("equal", "tab:orange"), ("tuned_fixed", "tab:green"),
                             ("oracle_fixed", "tab:purple")):
            along = [p.get("baselines", {}).get(name, {}).get(key) for p in result["curve"]]
            if key != held_key and all(a is not None for a in along):
                # on the questions of each point, as the learned curve: seen and online questions change as
                # the stream goes on, and the final figure is the last point's questions' alone
                ax.plot(x, [_num(a["mean"]) for a in along], "--", color=colour, lw=1, label=name)
            elif key in result["baselines"].get(name, {}):
                final = " (final questions)" if key != held_key else ""
                ax.axhline(result["baselines"][name][key]["mean"], ls="--", color=colour, lw=1, label=name + final)
        ax.set_title(f"{result.get('dataset', '')}: {title}")
        ax.set_xlabel("interactions")
        ax.set_ylabel(f"nDCG@{k}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    from rlfb.files import write_atomically

    # whole or not at all, as the JSON: saved in place, a full disk or Ctrl-C left a truncated image
    fmt = Path(path).suffix[1:].lower() or None
    try:
        write_atomically(path, lambda fh: fig.savefig(fh, format=fmt, dpi=110))
    finally:
        plt.close(fig)


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)
