"""How far a learned figure moves when the dense embeddings change very slightly.

The same code and seeds gave scifact thompson 0.7520 held-out nDCG@10 on one machine and 0.7471 on
another, while every fixed system's figure agreed to the last digit. This script tests a likely cause:
each machine encodes the embedding cache afresh, and another processor or BLAS build sums the model's
float32 arithmetic in another order. It runs ``rlfb simulate`` once as it is, then once per *salt* with
every dense embedding (documents and queries) moved by ``--perturb`` times a standard normal vector drawn
from a hash of the salt and the text, and normalised again. At the default 3e-7 a component moves by about
80 float32 units in the last place of a typical component (0.05 in a unit vector of 384 dimensions), the
vector by about 6e-6 of its length: small beside anything a retrieval figure could be expected to depend
on, larger than one rounding, and not measured against what two machines actually give.

If the learned figures move by more than their fixed baselines do, a run's figure is one draw from a
spread that the seeds' interval does not show; the spread over salts is that draw's noise. SPLADE's
encodings are left as they are.

    RLFB_DATASETS=$(realpath ../shared/datasets) HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/float_sensitivity.py --dataset scifact --policy thompson --salts 8 --jobs 2

Any other option is handed to ``rlfb simulate`` (``--learner-option transfer_weight=0``, ``--no-memory``).
Nothing here is used by rlfb; each run is a separate process (``--salt`` runs one), so that nothing
cached in memory is shared between them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlfb, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared argument types

from _bench_args import collection_folder, plural, positive_int  # noqa: E402

METRICS = ("heldout_ndcg@10", "seen_ndcg@10", "online_ndcg@10")
BASELINES = ("rrf", "equal", "tuned_fixed", "oracle_fixed")


def perturbed(vector: Any, text: str, salt: str, scale: float) -> np.ndarray:
    """``vector`` moved by ``scale`` times a normal vector seeded by ``salt`` and ``text``, unit length again.

    >>> v = np.array([0.6, 0.8], dtype=np.float32)
    >>> w = perturbed(v, "a text", "s1", 1e-3)
    >>> bool(np.allclose(w, v, atol=1e-2)), bool(np.array_equal(w, perturbed(v, "a text", "s1", 1e-3)))
    (True, True)
    >>> round(float(np.linalg.norm(w)), 6)
    1.0
    """
    # salt and text run together: "s1" + "0..." and "s10" + "..." would share a seed, hence at most 9 salts
    seed = int.from_bytes(hashlib.sha256((salt + text).encode()).digest()[:4], "little")
    noise = np.random.default_rng(seed).standard_normal(np.shape(vector)).astype(np.float32)
    moved = np.asarray(vector, dtype=np.float32) + np.float32(scale) * noise
    return (moved / np.linalg.norm(moved)).astype(np.float32)


def perturb_dense(salt: str, scale: float) -> None:
    """Make every ``DenseRetriever`` encoding, of documents and queries, come out :func:`perturbed` (in this
    process, from now on); SPLADE's, which share the same cached encoding (``ModelEncoding``), stay as they are."""
    from rlfb.retrievers.dense import DenseRetriever

    for name in ("_cached_documents", "_cached_queries"):  # what DenseRetriever encodes through, cache hits too
        encode = getattr(DenseRetriever, name)

        def cached(self: Any, texts: Any, *args: Any, _encode: Any = encode, **kwargs: Any) -> list[np.ndarray]:
            return [perturbed(v, t, salt, scale) for t, v in zip(texts, _encode(self, texts, *args, **kwargs),
                                                                 strict=True)]

        setattr(DenseRetriever, name, cached)


def _run_one(salt: str, scale: float, simulate_args: list[str]) -> int:
    """One ``rlfb simulate`` in this process, every dense encoding perturbed (none for an empty salt)."""
    from rlfb.cli import main

    if salt:
        perturb_dense(salt, scale)
    return main(["simulate", *simulate_args])


class ChildFailed(Exception):
    """A run's process exited with an error (which it printed)."""


def _figures(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    out = {m: data["final"][m]["mean"] for m in METRICS}
    out.update({b: data["baselines"][b]["heldout_ndcg@10"]["mean"] for b in BASELINES})
    out["moved"] = sum(1 for run in data["runs"] if _moved(run["weights"]))
    return out


def _moved(weights: dict[str, float]) -> bool:
    """Whether a seed's final global weights (``{retriever: weight}``) left equal weights."""
    values = list(weights.values())
    return max(values) - min(values) > 1e-9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other option is handed to each run's `rlfb simulate` (for instance --learner-option "
               "transfer_weight=0, or --no-memory); `rlfb simulate --help` lists them.")
    parser.add_argument("--dataset", default="scifact",
                        help="a folder name under $RLFB_DATASETS, or a path (default: %(default)s)")
    parser.add_argument("--policy", default="thompson", help="the learning policy simulated (default: %(default)s)")
    parser.add_argument("--seeds", type=positive_int, default=5,
                        help="seeds of each run, its figures their mean (default: %(default)s)")
    parser.add_argument("--interactions", type=positive_int, default=2000,
                        help="interactions of each seed (default: %(default)s)")
    parser.add_argument("--salts", type=int, default=8, choices=range(1, 10), metavar="1..9",
                        help="how many perturbed runs (salts s1 to s9; default: %(default)s)")
    parser.add_argument("--perturb", type=float, default=3e-7, help="the perturbation's scale (default: %(default)s)")
    parser.add_argument("--jobs", type=positive_int, default=2,
                        help="runs at once, each one process (default: %(default)s)")
    parser.add_argument("--target", type=float, default=None, help="count the runs whose held-out figure reaches it")
    parser.add_argument("--out", default=None, help="a folder to keep each run's JSON in")
    parser.add_argument("--salt", default=None, help=argparse.SUPPRESS)  # a child process: one run
    args, rest = parser.parse_known_args(argv)
    if args.salt is not None:
        return _run_one(args.salt, args.perturb, [
            "--dataset", args.dataset, "--policy", args.policy, "--seeds", str(args.seeds),
            "--interactions", str(args.interactions), *rest])

    try:  # checked here: each child run said so itself, then the parent died of the first one's exit status
        folder = collection_folder(args.dataset)
    except ValueError as exc:
        parser.error(str(exc))
    made = not args.out  # a temporary folder of this run's: removed if the run fails
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlfb-float-"))
    out.mkdir(parents=True, exist_ok=True)
    salts = ["", *(f"s{i}" for i in range(1, args.salts + 1))]

    def run(salt: str) -> dict[str, float]:
        path = out / f"{salt or 'as-is'}.json"
        cmd = [sys.executable, __file__, "--salt", salt, "--perturb", str(args.perturb),
               "--dataset", str(folder), "--policy", args.policy, "--seeds", str(args.seeds),
               "--interactions", str(args.interactions), "--quiet", "--json", str(path), *rest]
        done = subprocess.run(cmd, check=False, env=os.environ.copy(), stdout=subprocess.DEVNULL)
        if done.returncode != 0:  # its own error is on stderr above
            raise ChildFailed(f"the {'run as is' if not salt else f'run with salt {salt}'} failed "
                              f"(exit status {done.returncode})")
        # labelled, so that results_table.py does not table a perturbed run as the code's own figure
        data = json.loads(path.read_text())
        data["config"]["perturbation"] = {"scale": args.perturb, "salt": salt} if salt else None
        path.write_text(json.dumps(data))
        return _figures(path)

    pool = ThreadPoolExecutor(args.jobs)
    try:
        results = dict(zip(salts, pool.map(run, salts), strict=True))
    except ChildFailed as exc:
        pool.shutdown(wait=True, cancel_futures=True)  # the runs not started are not started
        if made:
            shutil.rmtree(out, ignore_errors=True)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    pool.shutdown()

    print(f"{folder.name}, {args.policy}, {plural(args.seeds, 'seed')}, {args.interactions} interactions; "
          f"dense embeddings perturbed by {args.perturb:g}; each row the mean over seeds")
    head = ["run", "held-out", "seen", "online", *BASELINES, "weights moved"]
    print(" | ".join(head))
    for salt, r in results.items():
        cells = [f"{r[m]:.4f}" for m in (*METRICS, *BASELINES)]
        print(" | ".join([salt or "as is", *cells, f"{r['moved']}/{args.seeds}"]))
    perturbed_runs = [results[s] for s in salts[1:]]
    for m in (*METRICS, *BASELINES):
        values = [r[m] for r in perturbed_runs]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{m} over {plural(len(values), 'salt')}: mean {statistics.fmean(values):.4f}, sd {sd:.4f}, "
              f"range {min(values):.4f} to {max(values):.4f}")
    if args.target is not None:
        hits = sum(r["heldout_ndcg@10"] >= args.target for r in perturbed_runs)
        print(f"held-out at or above {args.target:g}: {hits} of {len(perturbed_runs)} perturbed runs "
              f"({'met' if results[''][METRICS[0]] >= args.target else 'missed'} as is)")
    print(f"runs' JSON in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
