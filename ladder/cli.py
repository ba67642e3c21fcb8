"""The `ladder` command line: parses arguments and calls library functions; nothing else.

Each subcommand's implementation lives beside its library (``fit.commands``, ``predict.commands``,
...) and is imported only when that subcommand runs, so `ladder list` and `ladder fit` never pay
for JAX start-up. Bad input raises :class:`ladder.io.InputError`; it is printed as one line and
the process exits with its status (64+).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ladder.io import EX_USAGE, InputError


def _call(target: str):
    """Handler 'package.module:function', imported lazily."""
    def handler(args: argparse.Namespace) -> int:
        module, func = target.split(":")
        return getattr(importlib.import_module(module), func)(args) or 0
    return handler


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2; usage errors are 64 here (sysexits EX_USAGE)
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EX_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ladder", description=__doc__.splitlines()[0])
    from ladder import __version__
    p.add_argument("--version", action="version", version=f"ladder {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    # --- ladders and rungs -------------------------------------------------------------------
    s = sub.add_parser("list", help="ladders, rungs, params total/active, tokens, FLOPs")
    s.add_argument("ladder", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_call("ladder.commands:list_main"))

    s = sub.add_parser("plan", help="memory and time per step on a mesh, no training")
    s.add_argument("target", metavar="LADDER[:RUNG]")
    s.add_argument("--devices", type=int, default=1)
    s.add_argument("--expert-parallel", type=int, default=None,
                   help="size of the 'expert' mesh axis (default: largest divisor of --devices "
                        "that divides the number of experts)")
    s.add_argument("--peak-flops", type=float, default=None, metavar="FLOP/S",
                   help="peak FLOP/s of one device (default: 2.5e15, one GB200 GPU, bf16 dense; "
                        "see ladder/plan.py)")
    s.add_argument("--mfu", type=float, default=None,
                   help="assumed model FLOPs utilisation (default: 0.4)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_call("ladder.commands:plan_main"))

    s = sub.add_parser("run", help="train ladder rungs")
    s.add_argument("ladder")
    s.add_argument("--rung", action="append", default=None, metavar="NAME")
    s.add_argument("--out", default="runs")
    s.add_argument("--max-steps", type=int, default=None)
    s.add_argument("--resume", action="store_true")
    s.add_argument("--wandb", action="store_true")
    s.add_argument("--data", action="append", default=None,
                   help="text files/globs, or a token array (.npy, .bin with --vocab-size)")
    s.add_argument("--vocab-size", type=int, default=None)
    s.add_argument("--devices", type=int, default=None)
    s.add_argument("--expert-parallel", type=int, default=None)
    s.add_argument("--config", default=None, help="JSON file of training overrides")
    s.add_argument("overrides", nargs="*", metavar="--key=value", default=[])
    s.set_defaults(func=_call("ladder.commands:run_main"))

    # --- fitting ---------------------------------------------------------------------------------
    s = sub.add_parser("fit", help="fit and export a scaling law")
    s.add_argument("sources", nargs="+", metavar="SOURCE")
    s.add_argument("--form", default="auto",
                   help="law form: auto (every form the columns allow, chosen by rollout "
                        "backtest), compute, chinchilla, trajectory, moe, mpl, momentum "
                        "(default: %(default)s)")
    s.add_argument("--metric", default=None)
    s.add_argument("--bootstrap", type=int, default=200,
                   help="run-level bootstrap replicates (default: %(default)s)")
    s.add_argument("--level", type=float, default=0.9,
                   help="level of the intervals and bands (default: %(default)s)")
    s.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                   help="hold a parameter fixed, e.g. E=1.5 (default: none)")
    s.add_argument("--prior", action="append", default=[], metavar="NAME=MEAN:SD",
                   help="Gaussian prior on a parameter (in its natural units), e.g. "
                        "E=1.5:0.2: a penalised fit whose prior spread goes into the band "
                        "(default: none)")
    s.add_argument("--tie", action="append", default=[], metavar="A=B",
                   help="make parameter A equal B, e.g. beta=alpha (default: none)")
    s.add_argument("--by", default=None, metavar="COLUMN",
                   help="one law per value of COLUMN, e.g. fraction (default: one law)")
    s.add_argument("--objective", default="huber", choices=["huber", "ols"],
                   help="huber: summed Huber(1e-3) on log loss; ols: least squares of "
                        "log(L - E) on log C with E fixed (the real ladder's fit; Student-t "
                        "interval with n-2 dof) (default: %(default)s)")
    s.add_argument("--params-column", default="params", choices=["params", "active_params"],
                   help="parameter count of the chinchilla form (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    s.add_argument("--free-asymptote", action="store_true",
                   help="keep E free even on a short ladder (<= 5 sizes) that does not "
                        "identify it (default: also fit a prior and a fixed-E variant and "
                        "choose by rollout backtest)")
    s.add_argument("--allow-unconverged", action="store_true",
                   help="write the law even when the best start did not converge (default: "
                        "refuse, exit 65)")
    s.add_argument("--out", default=None, help="law.json to write (default: none)")
    s.set_defaults(func=_call("fit.commands:fit_main"))

    s = sub.add_parser("predict", help="predict loss from a law")
    s.add_argument("law")
    s.add_argument("--params", type=float, default=None)
    s.add_argument("--active-params", type=float, default=None)
    s.add_argument("--tokens", type=float, default=None)
    s.add_argument("--compute", type=float, default=None)
    s.add_argument("--fraction", type=float, default=None)
    s.add_argument("--level", type=float, default=0.9)
    s.add_argument("--schedule", default=None, help="CSV (step, lr) or a named schedule")
    s.set_defaults(func=_call("fit.commands:predict_main"))

    # --- pre-registration and watch --------------------------------------------------------------
    s = sub.add_parser("preregister", help="freeze a forecast of a target run")
    s.add_argument("law")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--target", metavar="LADDER:RUNG")
    g.add_argument("--target-spec", metavar="FILE.json")
    s.add_argument("--level", type=float, default=0.9)
    s.add_argument("--require", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--amend", default=None, metavar="OLD.json")
    s.add_argument("--reason", default=None)
    s.add_argument("--runs", default=None, metavar="DIR",
                   help="ladder run directories: health reference curves and eval noise")
    s.add_argument("--data-tag", default=None, help="data-mix tag the forecast applies to")
    s.add_argument("--eval-noise", type=float, default=None, metavar="SIGMA",
                   help="sd of one eval's metric (default: estimated from --runs)")
    s.add_argument("--allow-no-band", action="store_true",
                   help="register even when the law gives no band at any point (default: "
                        "refuse, exit 65)")
    s.add_argument("--out", default="prereg.json")
    s.set_defaults(func=_call("predict.commands:preregister_main"))

    s = sub.add_parser("verify", help="check a pre-registration's hash")
    s.add_argument("prereg")
    s.set_defaults(func=_call("predict.commands:verify_main"))

    s = sub.add_parser("watch", help="compare a live run with its pre-registration")
    s.add_argument("prereg")
    s.add_argument("--source", required=True, metavar="SRC")
    s.add_argument("--metric", default=None)
    s.add_argument("--follow", action="store_true")
    s.add_argument("--alerts", default=None, metavar="FILE")
    s.add_argument("--state", default=None, metavar="FILE")
    s.add_argument("--webhook", default=None, metavar="URL")
    s.add_argument("--wandb-alert", action="store_true")
    s.add_argument("--poll", type=float, default=0.2, metavar="SECONDS")
    s.add_argument("--max-seconds", type=float, default=None)
    s.set_defaults(func=_call("predict.commands:watch_main"))

    # --- reports and the demo --------------------------------------------------------------------
    s = sub.add_parser("report", help="plots and an HTML/Markdown report of the artifacts")
    s.add_argument("--runs", default=None)
    s.add_argument("--law", default=None)
    s.add_argument("--prereg", default=None)
    s.add_argument("--alerts", default=None)
    s.add_argument("--target-run", default=None, metavar="DIR")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_call("reports.commands:report_main"))

    s = sub.add_parser("demo", help="everything, on the built-in CPU ladder")
    s.add_argument("--out", default="demo_out")
    s.add_argument("--ladder", default="cpu")
    s.add_argument("--inject", default=None, metavar="FAULT")
    s.add_argument("--inject-at", type=float, default=0.5, metavar="FRACTION")
    s.set_defaults(func=_call("ladder.demo:demo_main"))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only `run` takes free --key=value overrides
        if args.command != "run":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"ladder {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"ladder {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
