"""Tokens/s of the cpu ladder's rungs: this checkout against a baseline checkout, side by side.

    git worktree add /tmp/ladder-base 648f2df      # e.g. the trainer before issue 10's rewrite
    python bench/cpu_throughput_vs.py --baseline /tmp/ladder-base [--rungs 124K-A54.7K] \
        [--steps 40] [--rounds 3]

Each round trains every rung for ``--steps`` steps with ``ladder run cpu --rung R --max-steps N``
once in each checkout (alternating which goes first), each in its own process, with the
checkout's own packages (cwd = the checkout). A run's figure is the median of its
``throughput/tokens_per_s`` over the steps after the first five (the trainer times each step
after compiling it). The ratio new / baseline is taken per round and its median printed, so a
machine shared with other jobs moves both sides alike and the ratio keeps its meaning; the
absolute numbers do not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from ladder.io import read_metrics  # noqa: E402


def tokens_per_s(checkout: Path, rung: str, steps: int, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "ladder", "run", "cpu", "--rung", rung,
           "--max-steps", str(steps), "--out", str(out)]
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    rows = read_metrics(out / "cpu" / rung / "metrics.jsonl")
    vals = [r["throughput/tokens_per_s"] for r in rows if "throughput/tokens_per_s" in r]
    return statistics.median(vals[5:] or vals)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, type=Path, help="a checkout to compare against")
    ap.add_argument("--rungs", nargs="+", default=["40.7K-A15.1K", "124K-A54.7K"],
                    help="cpu ladder rungs (default: the smallest and the largest rung)")
    ap.add_argument("--steps", type=int, default=40, help="steps per run (default: 40)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per rung (default: 3)")
    args = ap.parse_args(argv)
    sides = {"new": HERE, "baseline": args.baseline.resolve()}
    print(f"load: {os.getloadavg()[0]:.1f}  new={HERE}  baseline={sides['baseline']}")
    print(f"{'rung':<14} {'round':>5} {'new tok/s':>10} {'base tok/s':>10} {'new/base':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for rung in args.rungs:
            ratios = []
            for r in range(args.rounds):
                order = ["new", "baseline"] if r % 2 == 0 else ["baseline", "new"]
                got = {s: tokens_per_s(sides[s], rung, args.steps, Path(tmp) / f"{s}{r}{rung}")
                       for s in order}
                ratios.append(got["new"] / got["baseline"])
                print(f"{rung:<14} {r:>5} {got['new']:>10.0f} {got['baseline']:>10.0f} "
                      f"{ratios[-1]:>8.3f}", flush=True)
            print(f"{rung:<14} median new/baseline {statistics.median(ratios):.3f}")
    print(f"load: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
