"""The `ladder` command line: parses arguments and calls library functions; nothing else.

Every function that takes parsed arguments lives in this package; a handler's module is imported
when its command runs, so `ladder list` and `ladder fit` never pay for JAX start-up. Bad input
raises :class:`ladder.io.InputError`, printed as one line; the exit status is its own (64+).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from ladder.io import EX_USAGE, InputError
from ladder.trainer.checkpointing import ignore_dropped_writes


def _commands():
    from ladder.cli import commands  # list, plan, run, tokenize, isoflop
    return commands


def _fit():
    from ladder.cli import fit  # fit, compare, predict
    return fit


def _predict():
    from ladder.cli import predict  # preregister, verify, watch
    return predict


def _report():
    from ladder.cli import report  # report
    return report


def _demo():
    from ladder.cli import demo  # demo
    return demo


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help says its default (argparse's ArgumentDefaultsHelpFormatter, except
    where the help already names the default in words, and for flags that default to off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.required:
            return text + " (required)"
        if action.default is False or action.nargs == 0:
            return text + " (default: off)"
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*a, **kw)

    def error(self, message):  # argparse exits 2; usage errors are 64 here (sysexits EX_USAGE)
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EX_USAGE)


def _wandb_options(s, what: str) -> None:
    """--wandb, --wandb-entity, --wandb-project: the same three on run, preregister and watch."""
    s.add_argument("--wandb", action="store_true", help=what)
    s.add_argument("--wandb-entity", metavar="ENTITY",
                   help="W&B entity (default: $WANDB_ENTITY, else your W&B default entity)")
    s.add_argument("--wandb-project", metavar="PROJECT",
                   help="W&B project (default: $WANDB_PROJECT, else 'ladder')")


def _ladder_file_option(s) -> None:
    s.add_argument("--ladder-file", metavar="FILE",
                   help="a ladder as data (TOML or JSON, like ladder/ladders/*.toml); it joins "
                        "the built-in ladders, replacing one of its name (default: none)")


def _keys_option(s) -> None:
    s.add_argument("--keys", metavar="levanter|marin|FILE.toml",
                   help="another trainer's metric names mapped to ours (tokens, FLOPs, "
                        "progress, LR, params; ladder/sources/keymap.py) (default: ours)")


def _amend_chain_option(s) -> None:
    s.add_argument("--amend-chain", action="append", metavar="FILE",
                   help="also follow these amendments: a chain file (.jsonl, as `preregister "
                        "--amend` writes) or an amendment's own file (repeatable; default: "
                        "only those recorded in amendments.jsonl beside the pre-registration)")


def _fit_options(s) -> None:
    """The options of a law's fit that `fit` and `compare` share (compare fits two laws)."""
    s.add_argument("--bootstrap", type=int, default=200, help="run-level bootstrap replicates")
    s.add_argument("--level", type=float, default=0.9, help="level of the intervals and bands")
    s.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                   help="hold a parameter fixed, e.g. E=1.5 (default: none)")
    s.add_argument("--objective", default="huber", choices=["huber", "ols"],
                   help="huber: summed Huber(1e-3) on log loss; ols: least squares of "
                        "log(L - E) on log C with E fixed (the real ladder's fit; Student-t "
                        "interval with n-2 dof)")
    s.add_argument("--seed", type=int, default=0,
                   help="bootstrap seed (compare: recipe B's is seed + 1)")
    s.add_argument("--free-asymptote", action="store_true",
                   help="keep E free even on a short ladder (<= 5 sizes) that does not "
                        "identify it (default: with --form auto, the forecast's asymptote rule; "
                        "a named form is always its own estimator)")
    s.add_argument("--include-target", action="store_true",
                   help="fit a runs directory's target rung too (default: left out, and said so: "
                        "it is the run the law forecasts)")
    s.add_argument("--equal-weights", action="store_true",
                   help="weight every run alike (default: with --form auto, the forecast "
                        "weights runs by their decades below the largest one where the rollout "
                        "backtest says it forecasts better; a named form is its own estimator)")
    s.add_argument("--allow-unconverged", action="store_true",
                   help="write the law, or compare, even when a fit's best start did not "
                        "converge (default: refuse, exit 65)")
    s.add_argument("--sizes", metavar="FILE",
                   help="CSV/JSON of run sizes (run, params, active_params) for W&B sources "
                        "whose configs lack them (default: from the runs' configs)")


def _json_option(s, what: str) -> None:
    s.add_argument("--json", action="store_true", help=f"print {what} on stdout, as JSON")


def _serve_options(s) -> None:
    s.add_argument("--serve", action="store_true",
                   help="serve a live page on 127.0.0.1 that refreshes as points and alerts "
                        "arrive (Ctrl-C stops it)")
    s.add_argument("--port", type=int, default=8765, help="port of the live page (0: any free)")


def _global_options(p, default) -> None:
    """-v and -q: on the main parser (with their defaults) and on every subcommand, so they may
    stand anywhere on the line (`ladder fit x.csv -q`); a subcommand's copy has no default
    (argparse.SUPPRESS) and so never resets what was given before the subcommand."""
    where = "" if default else " (default: off; the same as before the subcommand)"
    p.add_argument("-v", "--verbose", action="count",
                   default=0 if default else argparse.SUPPRESS,
                   help="more messages on stderr (-vv: debug)" + where)
    p.add_argument("-q", "--quiet", action="store_true",
                   default=False if default else argparse.SUPPRESS,
                   help="only warnings and errors on stderr" + where)


class _SubParser(_Parser):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        _global_options(self, default=False)


# --- ladders and rungs -------------------------------------------------------------------

def _list_command(sub) -> None:
    s = sub.add_parser(
        "list", help="ladders, rungs, params total/active, tokens, FLOPs",
        description="List the ladders (or one), each rung's parameters, tokens, steps, batch "
                    "and FLOPs; * marks the target run.",
        epilog="example:\n  ladder list tiny\n  ladder list marin-535b --json")
    s.add_argument("ladder", nargs="?", help="one ladder (default: all, or --ladder-file's)")
    _json_option(s, "one object per rung")
    _ladder_file_option(s)
    s.set_defaults(func=lambda args: _commands().list_main(args))


def _plan_command(sub) -> None:
    s = sub.add_parser(
        "plan", help="memory and time per step on a mesh, no training",
        description="Estimate per-device memory and time per step of a rung on a data x expert "
                    "mesh, without training (--compile: XLA's own figures).",
        epilog="example:\n  ladder plan marin-535b:27.7B-A1.2B --devices 64\n"
               "  ladder plan tiny:12.8K-A3.8K --devices 8 --compile --json")
    s.add_argument("target", metavar="LADDER[:RUNG]",
                   help="a ladder, or one rung of it (with --ladder-file, ':RUNG' names a rung "
                        "of the file's ladder)")
    _ladder_file_option(s)
    s.add_argument("--devices", type=int, default=1, help="devices in the mesh")
    s.add_argument("--expert-parallel", type=int,
                   help="size of the 'expert' mesh axis (default: largest divisor of --devices "
                        "that divides the number of experts)")
    s.add_argument("--peak-flops", type=float, metavar="FLOP/S",
                   help="peak FLOP/s of one device (default: 2.5e15, one GB200 GPU, bf16 dense; "
                        "see ladder/trainer/plan.py)")
    s.add_argument("--mfu", type=float, help="assumed model FLOPs utilisation (default: 0.4)")
    s.add_argument("--compile", action="store_true",
                   help="also lower and compile the real train and eval steps for this mesh on "
                        "fake CPU devices and report XLA's own bytes, FLOPs (loops x trip "
                        "counts) and collectives per device (default: off; needs LADDER:RUNG)")
    s.add_argument("--accelerator", metavar="NAME",
                   help="the device to lay the rung out for (a name or key of "
                        "ladder/accelerators.py, e.g. h100, h200, gb200): its memory x the usable "
                        "share is the budget and its peak the time's (default: the budget of "
                        "an H100, the time of a GB200)")
    s.add_argument("--memory-per-device", type=float, metavar="BYTES",
                   help="memory budget of one device, instead of the accelerator's; the layout "
                        "(precision, remat, microbatch) is chosen to fit it, by the estimate "
                        "and with --compile by XLA's figure (default: 80 GB x 0.9)")
    s.add_argument("--precision", choices=["bf16", "f32"],
                   help="compute precision (default: bf16 over f32 master weights)")
    s.add_argument("--remat", choices=["none", "dots", "full"],
                   help="rematerialisation (default: the least that fits)")
    s.add_argument("--microbatch", type=int, metavar="SEQUENCES",
                   help="sequences per microbatch (default: the largest that fits at the "
                        "chosen remat)")
    s.add_argument("--eval-batch", type=int, metavar="SEQUENCES",
                   help="sequences of the eval step --compile compiles (default: one per "
                        "device, as `ladder run`)")
    _json_option(s, "the plan")
    s.set_defaults(func=lambda args: _commands().plan_main(args))


def _run_command(sub) -> None:
    s = sub.add_parser(
        "run", help="train ladder rungs",
        description="Train a ladder's rungs, one after another, into DIR/LADDER/RUNG/ (default: "
                    "every rung and then the target).",
        epilog="Training overrides: any training config key (ladder/trainer/trainconfig.py) as\n"
               "--key=value (e.g. --seed=1 --lr=3e-3 --model.capacity_factor=2\n"
               "--schedule.decay_end=0.6); an unknown key is an error.\n\n"
               "exit status: 0 every rung complete (or stopped at --max-steps), 1 a rung\n"
               "diverged, 130 Ctrl-C, 143 SIGTERM (both checkpointed: --resume continues),\n"
               "74 a checkpoint save failed on the disk, 75 another run holds the folder,\n"
               "64+ usage or input errors.\n\n"
               "example (the rungs, not the target; `ladder list tiny` names them):\n"
               "  ladder run tiny --rung 12.8K-A3.8K --rung 22.1K-A8.1K --rung 33.3K-A13.8K")
    s.add_argument("ladder", nargs="?", metavar="LADDER[:RUNG]",
                   help="a ladder (all its rungs, the target last) or one rung of it "
                        "(default: --ladder-file's ladder)")
    _ladder_file_option(s)
    s.add_argument("--rung", action="append", metavar="NAME",
                   help="train only this rung (repeatable; default: all)")
    s.add_argument("--out", default="runs", metavar="DIR",
                   help="runs directory: rungs go to DIR/LADDER/RUNG/")
    s.add_argument("--max-steps", type=int, metavar="N",
                   help="stop after N steps of the planned run, resumable (default: the whole run)")
    s.add_argument("--resume", action="store_true",
                   help="continue unfinished rungs from their last checkpoint")
    _wandb_options(s, "mirror the metrics to W&B (group = ladder, name = rung, job type train)")
    s.add_argument("--data", action="append",
                   help="text files/globs, a token array (.npy, .bin with --vocab-size) or a "
                        "`ladder tokenize` directory (default: the Python stdlib as bytes)")
    s.add_argument("--vocab-size", type=int,
                   help="vocabulary of a .bin token file (default: from the data)")
    s.add_argument("--devices", type=int, help="devices in the mesh (default: all visible)")
    s.add_argument("--expert-parallel", type=int,
                   help="size of the 'expert' mesh axis (default: the largest that fits)")
    s.add_argument("--config", metavar="FILE.json",
                   help="JSON file of training overrides (default: none)")
    s.add_argument("--microbatch", type=int, metavar="SEQUENCES",
                   help="sequences per microbatch: gradient accumulation inside the step "
                        "(default: on a GPU/TPU, with precision (--model.precision) and remat "
                        "(--model.remat), chosen to fit the device's memory and written to "
                        "config.json's layout; on CPU the whole batch)")
    s.add_argument("--eval-batch", type=int, metavar="SEQUENCES",
                   help="sequences per eval call (default: one per device in the mesh)")
    s.add_argument("--peak-flops", type=float, metavar="FLOP/S",
                   help="peak FLOP/s of one device for throughput/mfu (default: the "
                        "accelerator table in ladder/trainer/plan.py; on CPU a measured matmul)")
    s.add_argument("--checkpoint-minutes", type=float, metavar="M",
                   help="also keep a rolling checkpoint every M minutes of wall clock, beside "
                        "the permanent ones (default: none; SIGTERM always checkpoints)")
    s.add_argument("--checkpoint-dir", metavar="DIR|URL",
                   help="checkpoints under DIR/LADDER/RUNG: a folder or gs://, s3:// (Orbax "
                        "through etils; needs gcsfs/s3fs) (default: RUN_DIR/checkpoints); "
                        "saves are asynchronous unless --checkpoint_async=false")
    s.add_argument("--profile-steps", metavar="A:B",
                   help="write a jax.profiler trace of steps A..B (inclusive) into "
                        "RUN_DIR/profile (default: none)")
    g = s.add_argument_group("multi-host JAX (one rung over several processes)")
    g.add_argument("--distributed", choices=["off", "auto", "explicit"],
                   help="off: one process; auto: jax.distributed.initialize() reads the cluster "
                        "(SLURM, Kubernetes, Cloud TPU); explicit: the three flags below "
                        "(default: explicit when --coordinator is given, else off)")
    g.add_argument("--coordinator", metavar="HOST:PORT",
                   help="process 0's coordinator address (default: none)")
    g.add_argument("--num-processes", type=int, metavar="N",
                   help="processes in the run (default: none)")
    g.add_argument("--process-id", type=int, metavar="I",
                   help="this process's index, 0..N-1 (default: none)")
    g.add_argument("--distributed-timeout", type=int, metavar="SECONDS",
                   help="wait at most this long for every process to connect (default: 300)")
    g = s.add_argument_group("whole ladders on a Ray cluster")
    g.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local: rungs one after another in this process; ray: each rung a Ray "
                        "task, those that fit at once in parallel (default: local)")
    g.add_argument("--address", metavar="ADDR",
                   help="Ray cluster address, e.g. auto or ray://HOST:10001 (default: a local "
                        "Ray started for this run, or RAY_ADDRESS)")
    g.add_argument("--resources-per-rung", metavar="JSON",
                   help='Ray resources of one rung task, e.g. \'{"num_gpus": 8}\', or per rung '
                        '\'{"*": {"num_cpus": 1}, "RUNG": {"num_gpus": 4}}\' (default: '
                        '{"num_cpus": 1})')
    g.add_argument("--max-retries", type=int, default=2, metavar="N",
                   help="times a failed rung is retried from its last checkpoint (default: 2)")
    s.set_defaults(func=lambda args: _commands().run_main(args), overrides=[])


def _tokenize_command(sub) -> None:
    s = sub.add_parser(
        "tokenize", help="token shards for `run --data DIR` from text, JSONL or Parquet files",
        description="Encode text, JSONL or Parquet files with a local tokenizer into token "
                    "shards that `ladder run --data DIR` reads.",
        epilog="An interrupted run continues when the same command is run again.\n\n"
               "example:\n  ladder tokenize 'corpus/*.jsonl' --tokenizer tokenizer.json "
               "--out shards")
    s.add_argument("files", nargs="+", metavar="FILES",
                   help="files or globs: .jsonl/.ndjson (.gz) and .parquet hold one document "
                        "per record, any other file is one plain-text document")
    s.add_argument("--tokenizer", required=True, metavar="tokenizer.json",
                   help="a local Hugging Face tokenizers file (nothing is downloaded)")
    s.add_argument("--out", required=True, metavar="DIR", help="directory for the shards and "
                   "manifest.json (must not hold shards already)")
    s.add_argument("--eos", metavar="TOKEN",
                   help="end-of-document token appended to every file (default: the first of "
                        "<|endoftext|>, <|end_of_text|>, </s>, <eos>, <|eos|>, [EOS] in the "
                        "vocabulary)")
    s.add_argument("--shard-tokens", type=int, metavar="N",
                   help="tokens per shard file (default: 2**27, 256 MiB of uint16)")
    s.add_argument("--text-key", default="text", metavar="KEY",
                   help="the field of a JSONL record / column of a Parquet file that holds its "
                        "text (default: text)")
    s.add_argument("--processes", type=int, metavar="N",
                   help="worker processes that encode (0: this process, with the tokenizers "
                        "library's own threads; default: one per CPU core)")
    s.set_defaults(func=lambda args: _commands().tokenize_main(args))


# --- fitting ---------------------------------------------------------------------------------

def _fit_command(sub) -> None:
    s = sub.add_parser(
        "fit", help="fit and export a scaling law",
        description="Fit a scaling law with its uncertainty to points tables or runs and write "
                    "it as law.json.",
        epilog="A runs directory's target rung is left out (--include-target fits it).\n"
               "exit status: 0 written, 65 a fit refused (not converged, too few points),\n"
               "64+ usage or input errors.\n\n"
               "example:\n  ladder fit runs/tiny\n"
               "  ladder fit points.csv --form chinchilla --out law.json")
    s.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="points tables (CSV, Parquet), runs directories, W&B offline run "
                        "directories or wandb://ENTITY/PROJECT/ID[,ID...]")
    from ladder.fit.forms import form_choices  # the one list of forms (numpy only)
    s.add_argument("--form", default="auto",
                   help=f"law form: {form_choices()}; auto: every form marked * that the "
                        "columns allow, chosen by rollout backtest; task: downstream accuracy "
                        "in two steps, needs --via")
    s.add_argument("--metric", action="append", metavar="KEY",
                   help="metric key: a key of runs, a long table's 'metric' value or a wide "
                        "table's loss column; repeatable, and a glob such as 'paloma/*/loss' "
                        "matches the keys the sources hold; several metrics: one law each, all "
                        "in one law.json (default: runs' eval_dropless/loss, a table's loss); "
                        "with --form task, one: the accuracy column")
    s.add_argument("--via", metavar="LOSS_KEY",
                   help="with --form task: the task-loss column (e.g. bits per byte of the "
                        "correct answer) that step 1 fits in params/tokens/compute and step 2 "
                        "maps to accuracy with a sigmoid (Bhagia et al. 2024)")
    s.add_argument("--via-form", default="auto", metavar="FORM",
                   help="with --form task: step 1's form")
    s.add_argument("--prior", action="append", default=[], metavar="NAME=MEAN:SD",
                   help="Gaussian prior on a parameter (in its natural units), e.g. E=1.5:0.2: a "
                        "penalised fit whose prior spread goes into the band (default: none)")
    s.add_argument("--tie", action="append", default=[], metavar="A=B",
                   help="make parameter A equal B, e.g. beta=alpha (default: none)")
    s.add_argument("--by", metavar="COLUMN",
                   help="one law per value of COLUMN, e.g. fraction (default: one law)")
    s.add_argument("--params-column", default="params", choices=["params", "active_params"],
                   help="parameter count of the chinchilla form")
    _fit_options(s)
    _keys_option(s)
    _json_option(s, "the law (law.json's content), not the report,")
    s.add_argument("--out", default="law.json", metavar="FILE", help="where the law is written")
    s.set_defaults(func=lambda args: _fit().fit_main(args))


def _compare_command(sub) -> None:
    s = sub.add_parser(
        "compare", help="compute-equivalent multiplier of recipe B over recipe A on the same "
        "ladder sizes",
        description="What recipe B is worth against recipe A in compute: one law fitted to "
                    "each, the multiplier with its band.",
        epilog="example:\n  ladder compare runs_a/cpu runs_b/cpu --target cpu --out compare")
    s.add_argument("a", metavar="A", help="recipe A (the baseline): a points table, runs "
                   "directory, W&B offline run directory or wandb://ENTITY/PROJECT/ID[,ID...]")
    s.add_argument("b", metavar="B", help="recipe B (the variant), the same kinds")
    s.add_argument("--metric", action="append", metavar="KEY",
                   help="metric key (repeatable; a glob such as 'bpb/*' matches the columns of A's "
                        "points table) (default: the table's loss, runs' eval_dropless/loss)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--at", type=float, metavar="C",
                   help="the multiplier at this compute, FLOPs without the LM head (default: "
                        "the largest B run's)")
    g.add_argument("--target", metavar="LADDER[:RUNG]",
                   help="the multiplier at this rung's compute (a ladder alone: its target)")
    _ladder_file_option(s)
    s.add_argument("--form", default="compute",
                   choices=["compute", "trajectory", "trajectory-capacity"],
                   help="law form of both fits (one of compute alone, so it can be inverted)")
    _fit_options(s)
    _json_option(s, "{metric: {multiplier, lo, hi, per_size, trend, ...}}, not the report,")
    s.add_argument("--out", metavar="DIR", help="write compare.json and compare_METRIC.png here "
                                                "(default: nothing written)")
    s.set_defaults(func=lambda args: _fit().compare_main(args))


def _isoflop_command(sub) -> None:
    s = sub.add_parser(
        "isoflop", help="IsoFLOP approaches 1 and 2: compute-optimal N and D",
        description="IsoFLOP planning (Hoffmann et al. 2022, approaches 1 and 2): the "
                    "compute-optimal parameters and tokens with their bands.",
        epilog="example:\n  ladder isoflop isoflop.csv --budget 1e23 --plot isoflop.png")
    s.add_argument("points", nargs="+", metavar="POINTS",
                   help="points tables (CSV, Parquet: compute, loss, and params or tokens; "
                        "the other from C = 6 N D) or runs directories")
    s.add_argument("--budget", type=float, metavar="C",
                   help="compute budget (FLOPs) to give the compute-optimal N and D for "
                        "(default: none)")
    s.add_argument("--bootstrap", type=int, default=1000,
                   help="run-level bootstrap replicates of the bands")
    s.add_argument("--level", type=float, default=0.9, help="level of the intervals")
    s.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    s.add_argument("--metric", help="metric key of runs, or the loss column of a table (default: "
                                    "loss, else eval_dropless/loss)")
    s.add_argument("--column", action="append", default=[], metavar="NAME=COLUMN",
                   help="read a table's COLUMN as NAME, e.g. compute=compute_budget "
                        "(repeatable; default: the names as they are)")
    s.add_argument("--plot", metavar="FILE.png",
                   help="also draw the profiles and the fits (default: no figure)")
    _json_option(s, "the exponents, their intervals and (with --budget) N and D")
    s.set_defaults(func=lambda args: _commands().isoflop_main(args))


def _predict_command(sub) -> None:
    s = sub.add_parser(
        "predict", help="predict loss from a law",
        description="Predict the loss and its band from a law.json at a size and token count, "
                    "or at a compute.",
        epilog="Prints one JSON object: loss, lo, hi, level.\n\n"
               "example:\n  ladder predict law.json --compute 1.44e10\n"
               "  ladder predict law.json --params 535e9 --active-params 22.8e9 --tokens 18e12")
    s.add_argument("law", metavar="LAW.json", help="a law written by `ladder fit`")
    s.add_argument("--params", type=float, help="total parameters")
    s.add_argument("--active-params", type=float, help="active parameters")
    s.add_argument("--tokens", type=float, help="training tokens")
    s.add_argument("--compute", type=float, help="training FLOPs (no LM head)")
    s.add_argument("--fraction", type=float, help="fraction of the planned run (default: the end)")
    s.add_argument("--level", type=float, default=0.9, help="interval level")
    s.add_argument("--schedule",
                   help="CSV (step, lr) or a named schedule (curve laws; default: none)")
    s.add_argument("--metric", metavar="KEY",
                   help="the metric whose law predicts: required for a law.json of several "
                        "metrics; on one of one metric it must be that metric (default: its "
                        "only law)")
    s.set_defaults(func=lambda args: _fit().predict_main(args))


# --- pre-registration and watch --------------------------------------------------------------

def _preregister_command(sub) -> None:
    s = sub.add_parser(
        "preregister", help="freeze a forecast of a target run",
        description="Freeze a law's forecast of a target run, at every 1% of it, as a hashed, "
                    "read-only pre-registration.",
        epilog="exit status: 0 written, 65 no band (see --allow-no-band), 73 the file exists\n"
               "(never overwritten), 64+ other usage or input errors.\n\n"
               "example:\n  ladder preregister law.json --target tiny:46.4K-A21.1K --runs runs")
    s.add_argument("law", metavar="LAW.json", nargs="?",
                   help="a law written by `ladder fit` (with --at-step, default: the law the "
                        "amended file embeds)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--target", metavar="LADDER:RUNG",
                   help="the target rung (required, but with --at-step: default the amended "
                        "file's target)")
    g.add_argument("--target-spec", metavar="FILE.json",
                   help="the target as a JSON object of pre-registration target fields")
    s.add_argument("--level", type=float,
                   help="band level (default: 0.9; with --at-step, the amended file's)")
    s.add_argument("--require", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config value the forecast requires (repeatable; default: none)")
    s.add_argument("--amend", metavar="OLD.json",
                   help="this amends an earlier pre-registration (default: a new one)")
    s.add_argument("--reason", help="why (with --amend; default: none)")
    g = s.add_argument_group("a change of plan at a step (with --amend; ladder/predict/amend.py)")
    g.add_argument("--at-step", type=int, metavar="S",
                   help="the plan changed at step S: the old forecast is kept up to S, the "
                        "amended one, anchored on the run's evals up to S (--source), from S on "
                        "(default: the amendment replaces the whole forecast)")
    g.add_argument("--source", metavar="RUN",
                   help="the run itself (run directory, metrics.jsonl, CSV, W&B), for the "
                        "anchor of --at-step (default: none)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--multiplier", metavar="M[:LO:HI]",
                   help="compute multiplier of the new recipe over the old, with its interval "
                        "(default: none)")
    m.add_argument("--compare", metavar="COMPARE.json",
                   help="the multiplier from `ladder compare --json` output (default: none)")
    g.add_argument("--seq-len", type=int, metavar="N",
                   help="the sequence length from S on (default: unchanged)")
    g.add_argument("--transition", choices=["compute", "recipe", "relax"],
                   help="relax: the old curve relaxing to the new recipe's (the law from step 0 at "
                        "M x compute) within --transition-width; compute: after S each unit of "
                        "compute counts M x; recipe: the new recipe's law from step 0, shifted to "
                        "the anchor (default: relax, the closest on the cpu switch: docs/LOG.md)")
    g.add_argument("--transition-width", type=float, metavar="W",
                   help="relax: the gap left at f is exp(-(f - f_S) / W) of it, W a fraction "
                        "of the run (default: 0.05)")
    s.add_argument("--runs", metavar="DIR",
                   help="ladder run directories: health reference curves and eval noise")
    s.add_argument("--data-tag",
                   help="data-mix tag the forecast applies to (with --at-step: the tag from S on)")
    s.add_argument("--eval-noise", type=float, metavar="SIGMA",
                   help="sd of one eval's metric (default: estimated from --runs)")
    s.add_argument("--allow-no-band", action="store_true",
                   help="register even when the law gives no band at any point (default: "
                        "refuse, exit 65)")
    _wandb_options(s, "log the frozen forecast as its own W&B run in the ladder's group "
                      "(job type forecast), the file as an artifact")
    s.add_argument("--out", default="prereg.json", metavar="FILE",
                   help="where it is written (read-only; never overwritten)")
    s.set_defaults(func=lambda args: _predict().preregister_main(args))


def _verify_command(sub) -> None:
    s = sub.add_parser(
        "verify", help="check a pre-registration's hash",
        description="Recompute a pre-registration's sha256 and name what changed when it does "
                    "not match.",
        epilog="exit status: 0 the hash (and --expect) match, 65 they do not, 64+ usage or\n"
               "input errors.\n\n"
               "example (SHA256: the digest kept elsewhere, e.g. the W&B artifact's):\n"
               "  ladder verify prereg.json --expect SHA256")
    s.add_argument("prereg", metavar="PREREG.json", help="a pre-registration")
    s.add_argument("--expect", metavar="SHA256",
                   help="the sha256 the file must have, kept outside it (the W&B artifact's "
                        "digest, a ticket): a hand-resealed file verifies, this does not "
                        "(default: none)")
    _amend_chain_option(s)
    _json_option(s, "the verification")
    s.set_defaults(func=lambda args: _predict().verify_main(args))


def _watch_command(sub) -> None:
    s = sub.add_parser(
        "watch", help="compare a live run with its pre-registration",
        description="Judge a run's metrics, live with --follow, against its pre-registration "
                    "and raise alerts.",
        epilog="exit status (with --follow: once the run has finished):\n"
               "  0   nothing above info\n"
               "  1   warnings\n"
               "  2   a critical alert\n"
               "  3   the forecast no longer applies (the run left the pre-registered plan)\n"
               "  64+ usage or input errors (one line naming the file and the field)\n"
               "  130, 143 stopped by Ctrl-C, SIGTERM (the state saved: a restart goes on)\n\n"
               "example (start it before the target run; it waits for the file):\n"
               "  ladder watch prereg.json --source runs/tiny/46.4K-A21.1K/metrics.jsonl "
               "--follow \\\n      --alerts alerts.jsonl")
    s.add_argument("prereg", metavar="PREREG.json", help="the pre-registration (its newest "
                   "amendment recorded in amendments.jsonl beside it, or named with "
                   "--amend-chain, is followed)")
    _amend_chain_option(s)
    s.add_argument("--source", required=True, metavar="SRC",
                   help="metrics.jsonl, CSV, a W&B offline run directory (or its "
                        "latest-run link) or wandb://ENTITY/PROJECT/ID[,ID...]")
    s.add_argument("--metric", help="source key holding the registered metric (default: the "
                                    "registered metric's own key)")
    s.add_argument("--follow", action="store_true", help="keep polling for new points")
    s.add_argument("--alerts", metavar="FILE",
                   help="append alerts here as JSON lines (default: stdout only)")
    s.add_argument("--state", metavar="FILE", help="saved watcher state: a restart neither repeats "
                                                   "an alert nor skips a row (default: none)")
    s.add_argument("--webhook-file", metavar="FILE",
                   help="POST each alert as JSON to the URL in FILE (default: "
                        "$LADDER_WEBHOOK_URL, else none); a URL with a token stays out of the "
                        "process list and of W&B's record of the command line")
    s.add_argument("--webhook", metavar="URL",
                   help="the URL itself (visible to every user in `ps` for the whole follow: "
                        "prefer --webhook-file or $LADDER_WEBHOOK_URL) (default: none)")
    s.add_argument("--wandb-alert", action="store_true",
                   help="wandb.alert from a separate run (wandb:// sources)")
    _wandb_options(s, "log the residuals and alerts into the watcher's own W&B run (job type "
                      "watch, the ladder's group, at the watched run's steps) and post "
                      "wandb.alert")
    s.add_argument("--poll", type=float, metavar="SECONDS",
                   help="seconds between polls with --follow (default: the source's own: 1 for "
                        "files, 2 for W&B offline directories, 60 for the W&B API)")
    s.add_argument("--max-seconds", type=float,
                   help="stop following after this many seconds (default: until the source "
                        "says the run finished)")
    _keys_option(s)
    _json_option(s, "one object with the verdict and the alerts at the end (no alert lines)")
    _serve_options(s)
    s.set_defaults(func=lambda args: _predict().watch_main(args))


# --- reports and the demo --------------------------------------------------------------------

def _report_command(sub) -> None:
    s = sub.add_parser(
        "report", help="plots and an HTML/Markdown report of the artifacts",
        description="Draw the ladder, the law, the watch and MoE health into a self-contained "
                    "index.html, PNGs and summary.md.",
        epilog="example:\n  ladder report --runs runs --law law.json --prereg prereg.json "
               "--alerts alerts.jsonl \\\n      --out report")
    s.add_argument("--runs", metavar="DIR", help="runs directory (default: no ladder curves)")
    s.add_argument("--law", metavar="LAW.json", help="a law (default: none)")
    s.add_argument("--prereg", metavar="PREREG.json", help="a pre-registration (default: none)")
    s.add_argument("--alerts", metavar="FILE",
                   help="alerts.jsonl of `ladder watch` (default: none)")
    s.add_argument("--target-run", metavar="DIR",
                   help="the target's run directory (default: found in --runs by name)")
    s.add_argument("--points", metavar="FILE",
                   help="the points table the law was fitted to, drawn on the law plot "
                        "(default: the points law.json carries)")
    s.add_argument("--out", metavar="DIR",
                   help="where index.html, the PNGs and summary.md go (required unless --serve)")
    _serve_options(s)
    s.set_defaults(func=lambda args: _report().report_main(args))


def _demo_command(sub) -> None:
    s = sub.add_parser(
        "demo", help="everything, on the built-in CPU ladder",
        description="Everything on the built-in cpu ladder: the rungs, the law, the proxy "
                    "hero's pre-registration, its training under a live watcher, the report.",
        epilog="exit status: 0 whenever it ran end to end (the verdict is printed);\n"
               "--strict: the watch's (0 ok, 1 warnings, 2 critical, 3 no longer applies).\n\n"
               "example (about 10 minutes on 2 CPU cores):\n  ladder demo --out demo_out")
    s.add_argument("--out", default="demo_out", metavar="DIR", help="where everything goes")
    s.add_argument("--ladder", default="cpu", help="the ladder to run")
    s.add_argument("--inject", metavar="FAULT", help="fault in the target run: lr-spike, data-swap "
                                                     "or loss-drift (default: none)")
    s.add_argument("--inject-at", type=float, default=0.5, metavar="FRACTION",
                   help="where the fault starts")
    s.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of every rung's init and data order (another seed needs another "
                        "--out)")
    s.add_argument("--strict", action="store_true",
                   help="exit with the watch's status (0 ok, 1 warnings, 2 critical, 3 the "
                        "forecast no longer applies) instead of 0 whenever the demo ran")
    s.set_defaults(func=lambda args: _demo().demo_main(args))


# the subcommands in the order `ladder --help` lists them
COMMANDS = (
    _list_command, _plan_command, _run_command, _tokenize_command, _fit_command, _compare_command,
    _isoflop_command, _predict_command, _preregister_command, _verify_command, _watch_command,
    _report_command, _demo_command,
)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ladder", description=__doc__.splitlines()[0],
                epilog="the first day (README.md walks through it; docs/commands.md has every "
                       "option):\n"
                       "  ladder list tiny\n"
                       "  ladder run tiny --rung 12.8K-A3.8K --rung 22.1K-A8.1K --rung "
                       "33.3K-A13.8K\n"
                       "  ladder fit runs/tiny\n"
                       "  ladder preregister law.json --target tiny:46.4K-A21.1K --runs runs\n"
                       "  ladder watch prereg.json --source runs/tiny/46.4K-A21.1K/metrics.jsonl "
                       "--follow \\\n      --alerts alerts.jsonl   # and, beside it: ladder run "
                       "tiny --rung 46.4K-A21.1K\n"
                       "  ladder report --runs runs --law law.json --prereg prereg.json "
                       "--alerts alerts.jsonl --out report")
    from ladder import __version__
    p.add_argument("--version", action="version", version=f"ladder {__version__}")
    _global_options(p, default=True)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_SubParser)
    for add in COMMANDS:
        add(sub)
    return p


class _StderrHandler(logging.Handler):
    """Log records as plain lines on the *current* sys.stderr (the messages carry their
    'ladder CMD:' prefix already)."""

    def emit(self, record):
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose >= 2 else logging.INFO
    root = logging.getLogger("ladder")
    root.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        root.addHandler(_StderrHandler())
    root.propagate = False


# The extra that installs a module the core install leaves out (pyproject.toml).
EXTRAS = {"jax": "train", "jaxlib": "train", "flax": "train", "optax": "train",
          "orbax": "train", "tqdm": "train", "wandb": "wandb", "ray": "ray",
          "pyarrow": "parquet", "grain": "data", "tokenizers": "data"}
EX_UNAVAILABLE = 69  # sysexits: a service (here: an optional package) is unavailable


def _warning_line(command: str):
    """warnings.showwarning that prints 'ladder CMD: warning: ...', without the source path and
    line of the code that warned."""
    def show(message, category, filename, lineno, file=None, line=None):
        try:
            print(f"ladder {command}: warning: {message}", file=file or sys.stderr)
        except OSError:  # stderr gone (closed pipe): a warning is not worth a crash
            pass
    return show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only `run` takes free --key=value overrides
        if args.command != "run":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    _setup_logging(args.verbose, args.quiet)
    with warnings.catch_warnings():  # restored on return: main() may be called in-process
        warnings.showwarning = _warning_line(args.command)
        ignore_dropped_writes()
        return _run(args)


def _run(args) -> int:
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except InputError as e:
        print(f"ladder {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:  # an optional package of an extra the install left out
        root = (e.name or "").split(".")[0]
        if root not in EXTRAS:
            raise
        print(f"ladder {args.command}: needs the '{EXTRAS[root]}' extra: pip install "
              f"'ladder[{EXTRAS[root]}]' (no module named {e.name!r})", file=sys.stderr)
        return EX_UNAVAILABLE
    except BrokenPipeError:
        # the reader went away (`ladder list | head`): no traceback, and no second error when
        # Python flushes stdout at exit (a command that writes a file: ladder.cli.output)
        from ladder.cli.output import silence
        silence(sys.stdout)
        return 128 + 13  # as if killed by SIGPIPE, like other command-line tools
    except OSError as e:  # (BrokenPipeError, a subclass, is caught above)
        # an OS error no input check foresaw: still one line, naming the file
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"ladder {args.command}: {where}{(e.strerror or str(e)).lower()}",
              file=sys.stderr)
        return 74  # sysexits EX_IOERR
    except KeyboardInterrupt:
        print(f"ladder {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
