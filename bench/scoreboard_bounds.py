"""How far a better band alone could take the scoreboard (issue 35 item 3): bounds on the
aggregate interval score with a variant's centres held fixed.

    python bench/scoreboard_bounds.py SCOREBOARD.json [--variant defaults] [--out FILE.md]

SCOREBOARD.json is `bench/scoreboard.py --json`'s output. Every band below keeps the variant's
centre and the shape of its band (the lower and upper half-widths scaled alike), so only the
width changes. Rows:

- the variant as it is;
- hindsight, per ladder: each ladder's own best scale, chosen on its own targets. No forecast can
  know it; it is the floor for any change of width;
- one width for every ladder (a constant relative half-width, no information from the fit):
  in-sample, and learned leave-one-ladder-out;
- two families that mix the fit's own width with a constant, ``k hw^g c^(1-g)`` and
  ``k sqrt(hw^2 + c^2)``: in-sample (the grid's best on all ladders) and leave-one-ladder-out
  (each ladder scored with the grid point the other ladders choose), the protocol's test;
- each ladder's share of the variant's aggregate.
The interval score is the scoreboard's (Gneiting & Raftery 2007, alpha 0.1, relative to the
actual), the aggregate its mean over ladders.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

ALPHA = 0.1  # bench/scoreboard.py's


def interval_score(y, lo, hi) -> float:
    return float(np.mean(((hi - lo) + (2 / ALPHA) * np.clip(lo - y, 0, None)
                          + (2 / ALPHA) * np.clip(y - hi, 0, None)) / y))


def scaled(lad: dict, width) -> tuple[np.ndarray, np.ndarray]:
    """The ladder's band with each target's half-width hw (relative, mean of both sides) moved
    to ``width(hw)``, keeping its asymmetry."""
    p, lo, hi = lad["pred"], lad["lo"], lad["hi"]
    hw = ((p - lo) + (hi - p)) / 2 / p
    s = width(hw) / hw
    return p - (p - lo) * s, p + (hi - p) * s


def score(ladders: dict, width, skip: str | None = None) -> float:
    return float(np.mean([interval_score(lad["y"], *scaled(lad, width))
                          for name, lad in ladders.items() if name != skip]))


def in_sample_and_lolo(ladders: dict, make, grids) -> tuple[float, float]:
    points = list(itertools.product(*grids))
    best = min(score(ladders, make(*pt)) for pt in points)
    held = []
    for name, lad in ladders.items():
        chosen = min(points, key=lambda pt: score(ladders, make(*pt), skip=name))
        held.append(interval_score(lad["y"], *scaled(lad, make(*chosen))))
    return best, float(np.mean(held))


def bounds(ladders: dict) -> list[tuple[str, float]]:
    scales = np.exp(np.linspace(np.log(0.01), np.log(10), 400))
    per_ladder = [min(interval_score(lad["y"], *scaled(lad, lambda hw, k=k: k * hw))
                      for k in scales) for lad in ladders.values()]
    const = in_sample_and_lolo(ladders, lambda c: (lambda hw: np.full_like(hw, c)),
                               [np.linspace(0.001, 0.15, 300)])
    ks = np.exp(np.linspace(-1, 1, 9))
    loglin = in_sample_and_lolo(
        ladders, lambda k, g, c: (lambda hw: k * hw ** g * c ** (1 - g)),
        [ks, np.linspace(0, 1.5, 7), [0.01, 0.02, 0.03, 0.05]])
    floor = in_sample_and_lolo(
        ladders, lambda k, c: (lambda hw: k * np.sqrt(hw ** 2 + c ** 2)),
        [ks, [0.0, 0.005, 0.01, 0.02, 0.03]])
    return [("as it is", score(ladders, lambda hw: hw)),
            ("hindsight: each ladder's own best scale", float(np.mean(per_ladder))),
            ("one width for all, in-sample", const[0]),
            ("one width for all, leave-one-ladder-out", const[1]),
            ("k hw^g c^(1-g), in-sample", loglin[0]),
            ("k hw^g c^(1-g), leave-one-ladder-out", loglin[1]),
            ("k sqrt(hw^2 + c^2), in-sample", floor[0]),
            ("k sqrt(hw^2 + c^2), leave-one-ladder-out", floor[1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="bench/scoreboard.py --json output")
    ap.add_argument("--variant", default="defaults")
    ap.add_argument("--out", help="write the markdown here as well")
    args = ap.parse_args()
    results = json.loads(Path(args.json).read_text())["results"][args.variant]
    ladders = {name: {k: np.asarray(r[k], float) for k in ("y", "pred", "lo", "hi")}
               for name, r in results.items() if r.get("error") is None and r.get("y")}
    rows = bounds(ladders)
    total = rows[0][1] * len(ladders)
    lines = [f"Bounds with `{args.variant}`'s centres fixed ({len(ladders)} ladders):", "",
             "| band | aggregate interval score |", "|---|---:|"]
    lines += [f"| {label} | {value:.4f} |" for label, value in rows]
    lines += ["", "| ladder | interval score | share of the aggregate |", "|---|---:|---:|"]
    for name, lad in ladders.items():
        s = interval_score(lad["y"], lad["lo"], lad["hi"])
        lines.append(f"| {name} | {s:.4f} | {s / total:.0%} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
