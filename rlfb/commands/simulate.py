"""``rlfb simulate``: simulated users on a BEIR folder; learning curves against fixed-weight baselines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rlfb.commands import HelpFormatter, show_progress
from rlfb.defaults import LEARNING_POLICY
from rlfb.errors import RlfbError, ValidationError

# each seed is a full run; beyond this a typo (--seeds 1000000000) is far likelier than intent
MAX_SEEDS = 1000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="learn from simulated users and compare with fixed-weight baselines",
                       formatter_class=HelpFormatter)
    p.add_argument("--dataset", required=True,
                   help="a BEIR folder, a collection's name under $RLFB_DATASETS, or 'demo' for the generated "
                        "collection")
    p.add_argument("--split", default="test",
                   help="the qrels file of the held-out questions: qrels/SPLIT.tsv (the stream asks those of "
                        "qrels/train.tsv where there is one, else half of SPLIT's)")
    p.add_argument("--policy", default=LEARNING_POLICY, help="fixed, batch, thompson, epsilon or gradient")
    p.add_argument("--user", default="navigational", help="perfect, navigational or informational")
    p.add_argument("--interactions", type=int, default=2000, help="simulated questions per seed")
    p.add_argument("--explicit-rate", type=float, default=0.1,
                   help="probability that a user gives a thumb up or down on the answer")
    p.add_argument("--noise", type=float, default=0.0, help="probability that an explicit thumb is flipped")
    p.add_argument("--reformulation-rate", type=float, default=0.5,
                   help="probability that a user restates the question when nothing relevant is in the "
                        "answer's top --answer-k chunks")
    p.add_argument("--mean-delay", type=float, default=120.0,
                   help="mean seconds before a feedback signal arrives (exponential)")
    p.add_argument("--late-rate", type=float, default=0.02,
                   help="probability that a signal arrives --late-delay seconds late instead")
    p.add_argument("--late-delay", type=float, default=2 * 86400.0,
                   help="seconds of a late signal's delay (beyond the 24 h attribution window by default)")
    p.add_argument("--spacing", type=float, default=60.0, help="simulated seconds between two questions")
    p.add_argument("--answer-k", type=int, default=3,
                   help="the top chunks the answer is written from, which a thumb and a reformulation judge")
    p.add_argument("--seeds", type=int, default=5, help=f"number of seeds (0..N-1), at most {MAX_SEEDS}")
    p.add_argument("--checkpoints", type=int, default=10, help="points of the learning curve")
    p.add_argument("--retrievers", default="bm25,dense,splade", help="comma-separated: bm25,dense,splade")
    p.add_argument("--fusion", default="minmax", choices=["minmax", "rrf", "zscore"],
                   help="score normalisation of the learned fusion")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="turn feedback memory off")
    p.add_argument("--policy-option", dest="policy_options", action="append", default=[], metavar="NAME=VALUE",
                   help="a hyperparameter of the policy, e.g. cf_min_questions=10 (the value read as JSON, else "
                        "as text); repeat for more")
    p.add_argument("--learner-option", dest="learner_options", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting of the learner (rlfb.learner.LearnerConfig), e.g. relevance_feedback_weight=0.1 "
                        "(the value read as JSON, else as text); repeat for more")
    p.add_argument("--max-heldout", type=int, default=None,
                   help="evaluate at most this many held-out queries (default: all)")
    p.add_argument("--json", dest="json_out", default=None,
                   help="write the results as JSON to this file; - (or /dev/stdout) writes them to stdout (the "
                        "report to stderr)")
    p.add_argument("--plot", default=None,
                   help="write the learning curves to this image file; its extension picks the format "
                        "(png, svg, pdf, ...); without one, .png is appended")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


#: fewer held-out questions than this in a seed, and the run says so: its held-out figures rest on a handful
FEW_HELDOUT = 10


def load_dataset(name: str, splits: Sequence[str] | None = None):  # noqa: ANN201 - BeirDataset
    """The collection ``name`` (``demo``: the generated one), with the qrels of ``splits`` alone where given: a
    damaged qrels file of a split the run does not read stopped it (a README audit, 2026-12-06)."""
    from rlfb.datasets import find_dataset, load_beir
    from rlfb.demo_corpus import generate_demo_corpus

    return generate_demo_corpus() if name == "demo" else load_beir(find_dataset(name), splits=splits)


def print_table(result: dict) -> None:
    from rlfb.simulation.results import iter_table, paired_differences

    print(f"\n{result['dataset']}: nDCG@{result['config']['k']}, mean over {len(result['config']['seeds'])} seed(s)")
    print("(seen: the stream queries asked before; online: what the users were shown, as they asked)")
    print(f"{'system':<24}{'held-out':>10}{'seen':>10}{'online':>10}")
    for name, *figures in iter_table(result):
        print(f"{name:<24}" + "".join("{:>10}".format("-" if v is None else f"{v:.4f}") for v in figures))
    # the means alone hide how sure they are: with 3 seeds the learned figure's interval and a baseline's overlap
    # where every seed's learned figure is above it, which the paired differences show
    lo, hi = result["final"][f"heldout_ndcg@{result['config']['k']}"]["ci95"]
    if lo is not None:
        print(f"held-out, learned: 95 % interval over seeds [{lo:.4f}, {hi:.4f}]; learned minus each baseline, "
              "paired by seed:")
        for name, d in paired_differences(result).items():
            if name in ("equal", "rrf", "tuned_fixed", "oracle_fixed") and d["ci95"][0] is not None:
                print(f"  {name:<22}{d['mean']:+10.4f}   95 % interval [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]")
    # the seen figure averages questions asked once with questions asked many times: the lift by asks
    by_asks = result.get("seen_by_asks") or {}  # absent from outputs of before 2026-12-05's later session
    groups = [(g, v) for g, v in by_asks.items() if v["learned_minus_rrf"]["mean"] is not None]
    if groups:
        seeds = len(result.get("runs") or ()) or None

        def lift(g: str, v: Mapping[str, Any]) -> str:
            # a group that some seeds have no question in is a mean over the others: it said so nowhere
            d, n = v["learned_minus_rrf"], v["learned_minus_rrf"].get("n")
            fewer = f", {n} of {seeds} seeds" if seeds and n is not None and n < seeds else ""
            return f"{g}: {d['mean']:+.3f} ({v['queries']:.1f}{fewer})"

        print("seen, learned minus RRF on the same questions, by times asked (questions a seed): "
              + ", ".join(lift(g, v) for g, v in groups))


def plot_path(path: str) -> str:
    """The file ``--plot path`` writes: checked against matplotlib's formats now, not after the simulation.

    Without an extension matplotlib itself would append ``.png``; doing it here lets the CLI name
    the real file.
    """
    from rlfb.commands import require_matplotlib

    require_matplotlib("--plot")
    from matplotlib.backend_bases import FigureCanvasBase

    p = Path(path)
    # an image goes to a file: "-" wrote a file named "-.png", and /dev/stdout became /dev/stdout.png
    if path == "-" or p.absolute().parent == Path("/dev") or (p.exists() and not p.is_file() and not p.is_dir()):
        raise ValidationError(f"--plot {path}: give an image file's name (a plot is not written to stdout, a pipe "
                              "or a device)")
    if not p.suffix:  # "out" or "out.": as matplotlib does, name.rstrip(".") + ".png"
        return str(p.with_name(p.name.rstrip(".") + ".png"))
    supported = FigureCanvasBase.get_supported_filetypes()
    if p.suffix[1:].lower() not in supported:
        raise ValidationError(f"--plot {path}: cannot write {p.suffix} images; use one of "
                              + ", ".join(f".{ext}" for ext in sorted(supported)))
    if p.suffix[1:].lower() == "pgf":  # listed, but matplotlib writes it through a LaTeX install
        import shutil

        from matplotlib import rcParams

        if shutil.which(rcParams["pgf.texsystem"]) is None:
            raise ValidationError(f"--plot {path}: .pgf images need {rcParams['pgf.texsystem']}, which is not "
                                  "installed; use .pdf, .svg or .png")
    return path


def check_outputs(args: argparse.Namespace) -> None:
    """Fail on a bad output path or option now, not after the simulation; ``args.plot`` becomes the real name."""
    from rlfb.commands import (
        STDOUT,
        check_int,
        check_not_folder,
        check_output_name,
        output_target,
        prepare_output_file,
        same_file,
    )
    from rlfb.datasets import find_dataset
    from rlfb.files import refuse_overwriting_dataset

    check_output_name("--json", args.json_out)
    # /dev/stdout is stdout, as "-" is: opened as a file, it took the report and the "wrote" line too
    args.json_out = output_target(args.json_out)
    check_not_folder("--json", args.json_out)
    check_output_name("--plot", args.plot)
    check_int("--seeds", args.seeds, 1, MAX_SEEDS)
    check_int("--max-heldout", args.max_heldout, 1)  # a Python slice bound: -1 meant "all but one"
    if args.plot:
        # the name as given: a folder, or a name ending in a slash, is refused as --json's is; plot_path
        # would append .png to it and write beside the folder
        prepare_output_file(args.plot)
        args.plot = plot_path(args.plot)
    if args.json_out and args.json_out != STDOUT and args.plot and same_file(args.json_out, args.plot):
        raise ValidationError(f"--json and --plot name the same file {args.plot}: the plot would overwrite the JSON")
    dataset = None if args.dataset == "demo" else find_dataset(args.dataset)
    for option, out in (("--json", args.json_out), ("--plot", args.plot)):
        if out and out != STDOUT:
            prepare_output_file(out)
            if dataset is not None:
                refuse_overwriting_dataset(out, dataset, option)


# the options that set a SimulationConfig field, by the field's name: its errors name the field, as a Python caller
# passes it (explicit_rate), where a user of the CLI typed the option (--explicit-rate)
CONFIG_OPTIONS = {
    "policy": "--policy", "user": "--user", "interactions": "--interactions", "explicit_rate": "--explicit-rate",
    "noise": "--noise", "reformulation_rate": "--reformulation-rate", "seeds": "--seeds",
    "checkpoints": "--checkpoints", "retrievers": "--retrievers", "fusion": "--fusion", "memory": "--no-memory",
    "split": "--split", "max_heldout": "--max-heldout", "spacing": "--spacing", "mean_delay": "--mean-delay",
    "late_rate": "--late-rate", "late_delay": "--late-delay", "answer_k": "--answer-k",
    "learner": "--learner-option", "policy_options": "--policy-option",
}


def simulation_config(**settings: Any) -> Any:  # SimulationConfig, imported when a command runs
    """``SimulationConfig(**settings)`` for ``rlfb simulate`` and ``rlfb demo``: a :class:`ValidationError` names
    the options given (``--explicit-rate must be a probability``), not the fields they set (``explicit_rate``),
    which the config's own messages name for Python callers.

    Built in steps, the settings first, then the learner's and the policy's options, so that each error is read
    for what it names: a policy option of a field's name (thompson's ``noise``) is not ``--noise``.
    """
    from dataclasses import replace

    from rlfb.simulation.runner import SimulationConfig

    learner, options = settings.pop("learner", {}), settings.pop("policy_options", {})
    config = _flags_named(lambda: SimulationConfig(**settings), _settings_named)
    if learner:
        config = _flags_named(lambda: replace(config, learner=learner),
                              lambda text: _options_named(text, "--learner-option", learner))
    if options:
        config = _flags_named(lambda: replace(config, policy_options=options),
                              lambda text: _options_named(text, "--policy-option", options))
    return config


def _flags_named(build: Any, name: Any) -> Any:
    """``build()``, its :class:`ValidationError` raised again (of the same type) with its text as ``name`` words it."""
    try:
        return build()
    except ValidationError as exc:
        raise type(exc)(name(str(exc))) from exc


def _settings_named(text: str) -> str:
    """A message of the config's checks of its own settings with the options for the fields it names: a field
    its message starts with (``split must name a qrels file``), and those named inside (``late_delay 172800s``;
    only names with an underscore, which no word of a message is, and the span's ``interactions x spacing``)."""
    import re

    if text == "give at least one retriever":  # as `rlfb evaluate` says it
        return "--retrievers names no retriever"
    head = re.match(r"(\w+) (?=must |cannot )", text)
    if head and head.group(1) in CONFIG_OPTIONS:
        text = CONFIG_OPTIONS[head.group(1)] + text[len(head.group(1)):]
    text = text.replace("interactions x spacing (", "--interactions x --spacing (")
    text = re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: CONFIG_OPTIONS.get(m.group(0), m.group(0)), text)
    # answer_k's bound is the ranking's cut-off k, which `simulate` sets no option for
    return re.sub(r"\[1, k=(\d+)\]", r"[1, \1] (the ranking's cut-off)", text)


def _options_named(text: str, flag: str, given: dict[str, Any]) -> str:
    """A message of the check of ``flag``'s options (``given``) with the option in front where it starts with the
    name of one (``--learner-option memory_weight must be in [0, 10]``), and the fields it names as options."""
    import re

    head = re.match(r"(\w+)\b", text)
    if head and head.group(1) in given:
        return f"{flag} {text}"
    text = re.sub(r"^policy_options cannot set the seed: each run's seed comes from seeds$",
                  "--policy-option cannot set the seed: each run's seed comes from --seeds", text)
    # memory_weight at 0, or beside --no-memory: the config's fields (memory=False) are the flags given
    return re.sub(r" \(memory=False\), not by memory_weight; got memory=(True|False) and memory_weight=",
                  lambda m: f", not by --learner-option memory_weight; got "
                            f"{'--no-memory and ' if m.group(1) == 'False' else ''}memory_weight=", text)


def policy_options(given: list[str], flag: str = "--policy-option") -> dict[str, Any]:
    """``--policy-option NAME=VALUE`` pairs (or ``flag``'s) as a dict; each value read as JSON (``10``, ``0.5``,
    ``true``, ``null``), else taken as text.

    >>> policy_options(["cf_min_questions=10", "exploration=epsilon"])
    {'cf_min_questions': 10, 'exploration': 'epsilon'}
    """
    out: dict[str, Any] = {}
    for item in given:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ValidationError(f"{flag} takes NAME=VALUE, got {item!r}")
        if name.strip() in out:
            raise ValidationError(f"{flag} {name.strip()} is given twice")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        out[name.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    from rlfb.commands import STDOUT, report_beside

    check_outputs(args)
    with report_beside(args.json_out) as stdout:  # with --json -, the report goes to stderr
        return _run(args, stdout, to_stdout=args.json_out == STDOUT)


def _run(args: argparse.Namespace, stdout: TextIO, *, to_stdout: bool) -> int:
    from rlfb.commands import make_parent, write_output
    from rlfb.simulation.runner import plot_curves, simulate

    config = simulation_config(
        policy=args.policy, user=args.user, interactions=args.interactions, explicit_rate=args.explicit_rate,
        noise=args.noise, seeds=tuple(range(args.seeds)), checkpoints=args.checkpoints,
        retrievers=tuple(n.strip() for n in args.retrievers.split(",") if n.strip()), fusion=args.fusion,
        memory=args.memory, max_heldout=args.max_heldout, answer_k=args.answer_k,
        reformulation_rate=args.reformulation_rate, mean_delay=args.mean_delay, late_rate=args.late_rate,
        late_delay=args.late_delay, spacing=args.spacing, split=args.split,
        policy_options=policy_options(args.policy_options),
        learner=policy_options(args.learner_options, "--learner-option"),
    )
    data = load_dataset(args.dataset, (config.split, config.stream_split))
    if config.split in data.qrels:  # a missing split is named by the runner
        data.check_known_documents(config.split)  # the error alone, without the note below
    # the splits the run reads (config's stream split only where the runner streams from it)
    used = (config.split, config.stream_split) if config.stream_split in data.qrels else (config.split,)
    for split in dict.fromkeys(s for s in used if s in data.qrels):
        for note in data.left_out_notes(split):  # what the runner leaves out; its JSON config counts the queries
            print(note, file=sys.stderr)
    result = simulate(data, config, show_progress=show_progress(args.quiet))
    from rlfb.datasets import find_dataset

    # the folder the data came from: a bare name (--dataset cranfield) is found under $RLFB_DATASETS, not here
    result["dataset_path"] = "demo" if args.dataset == "demo" else str(Path(find_dataset(args.dataset)).resolve())
    result["config"]["dataset_path"] = result["dataset_path"]
    print_table(result)
    few = min((run["heldout_queries"] for run in result.get("runs", ())), default=None)
    if few is not None and few < FEW_HELDOUT:
        # 2 judged questions held out 1 on every seed: an interval of width 0 read as certainty
        print(f"rlfb: only {few} held-out question{'s' if few != 1 else ''} in a seed: the held-out figures and "
              "their intervals rest on those alone", file=sys.stderr)
    t = result["timing"]
    print(f"\nindexing {t['index_seconds']:.1f}s, contexts {t['context_seconds']:.1f}s, "
          f"simulation {t['simulation_seconds']:.1f}s ({', '.join(f'{s:.1f}' for s in t['seconds_per_seed'])} s/seed)")
    if args.json_out:
        write_output(args.json_out, json.dumps(result, indent=2), stdout=stdout)
        if not to_stdout:
            print(f"wrote {args.json_out}")
    if args.plot:
        try:
            plot_curves(result, str(make_parent(args.plot)))
        except (RuntimeError, ValueError) as exc:  # matplotlib's own refusal, after the JSON is safe
            raise RlfbError(f"--plot {args.plot}: {exc}") from exc
        print(f"wrote {args.plot}")
    return 0
