"""Issue 27 item 3: the cpu ladder's proxy hero switches its training data at 30% of its steps,
and the forecast is amended at the switch from `ladder compare`'s multiplier.

The two corpora: the default corpus (the Python standard library, byte tokens) split by kind of
file, both without the documents the default corpus holds out for evaluation:

- **top**: the standard library's top-level modules (``Lib/*.py``: general-purpose code with
  docstrings, 4.5 MB);
- **pkg**: the modules inside its packages (``Lib/*/**.py``: asyncio, email, tkinter, idlelib,
  the ``encodings`` codec tables, ``pydoc_data``'s documentation text, ...; 7 MB).

Every run is evaluated on the default corpus's held-out documents (``data`` stays the default;
the training batches come from ``train_data``/``switch_data``, ladder/trainer/trainconfig.py): one
yardstick for both mixtures, as the real hero's Paloma. Steps, one command each, all cached in
OUT (a rerun skips what is there):

1. the cpu ladder's 4 rungs on each corpus (``ladder run cpu --rung ...``);
2. ``ladder compare`` (trajectory form, at the proxy hero's compute) in the direction
   that makes the switch an improvement (from the corpus worse at the hero's compute to the
   better, as the real hero switched to the mixture its ladder preferred);
3. the law of the old corpus's rungs (``ladder fit --form trajectory-capacity``) and the
   pre-registration of the proxy hero on it (``ladder preregister``);
4. the proxy hero trained on the old corpus to S = 30% of its steps (``--max-steps S``), the
   amendment written from its evals up to S (``ladder preregister --amend --at-step S
   --compare``), then the hero resumed with the new corpus from S (``switch_data``);
5. ``ladder watch`` of the chain, and the errors after S of: the amended forecast, the old
   forecast, the naive "same curve shifted to the last eval", the amendment's other transition
   (``recipe``: the new corpus's law from step 0, shifted to the anchor) and the anchor alone
   (multiplier 1); the band coverage of each; and the same in the first 20% of the run after S
   (the transition) and after it.

    nice -n 15 python bench/mixture_switch.py [--out DIR] [--seed 0] [--switch-at 0.3] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

METRIC = "eval_dropless/loss"
FORM = "trajectory-capacity"   # the law of the hero's forecast: the demo's (cli/demo.py: why)
# the comparison's form: `ladder compare --form trajectory-capacity` gives no multiplier here (NaN:
# "B's loss at the target is above A's law everywhere on the grid"), and the compute form on the
# 4 rungs' final losses alone extrapolates to 226x [10.5x, inf] (B's fit did not converge); the
# trajectory form uses every eval of the rungs' curves
COMPARE_FORM = "trajectory"
SWITCH_AT = 0.3


def ladder(*args, ok=(0,)) -> str:
    cmd = [sys.executable, "-m", "ladder", *map(str, args)]
    print("$ ladder " + " ".join(map(str, args)), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    if p.returncode not in ok:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


def corpora() -> dict[str, list[str]]:
    """The two file lists (absolute paths), the default corpus's held-out documents left out."""
    from ladder.trainer.data import is_held_out, stdlib_files
    root, files = stdlib_files()
    out: dict[str, list[str]] = {"top": [], "pkg": []}
    for f in files:
        rel = f.relative_to(root)
        if is_held_out(str(rel)):
            continue
        out["top" if len(rel.parts) == 1 else "pkg"].append(str(f))
    return out


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1))
    return path


def evals(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    from ladder.predict.amend import read_evals
    return read_evals(str(run_dir), METRIC)


def errors(steps, y, f_steps, centre, lo, hi, S: int, steps_total: int) -> dict:
    """Mean |relative error|, the final relative error and the band coverage after S; the same
    within the first 20% of the run after S and after that."""
    after = steps > S
    out = {}
    for name, sel in (("after", after),
                      ("transition", after & (steps <= S + 0.2 * steps_total)),
                      ("later", steps > S + 0.2 * steps_total)):
        e = np.interp(steps[sel], f_steps, centre)
        a = np.interp(steps[sel], f_steps, lo)
        b = np.interp(steps[sel], f_steps, hi)
        rel = e / y[sel] - 1
        out[name] = {"n": int(sel.sum()), "mean_abs_rel": float(np.mean(np.abs(rel))),
                     "max_abs_rel": float(np.max(np.abs(rel))),
                     "coverage": float(np.mean((y[sel] >= a) & (y[sel] <= b)))}
    e_fin = float(np.interp(steps[-1], f_steps, centre))
    out["final_rel"] = e_fin / float(y[-1]) - 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench_out" / "mixture_switch"))
    ap.add_argument("--seed", type=int, default=0, help="seed of every run (init and data)")
    ap.add_argument("--switch-at", type=float, default=SWITCH_AT,
                    help="fraction of the hero's steps where its data switches (default: 0.3)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    from ladder.predict import prereg as pr
    from ladder.predict.amend import Plan, amended_forecast, multiplier_from_compare
    from ladder.predict.forecast import Target
    from ladder.predict.watch import PreregView
    from ladder.specs import get_ladder

    t0 = time.time()
    out = Path(args.out) / f"seed{args.seed}"
    out.mkdir(parents=True, exist_ok=True)
    cpu = get_ladder("cpu")
    hero = cpu.target
    S = int(round(args.switch_at * hero.steps))
    # the rungs, their comparison and the old law are shared by every switch point; the hero,
    # its pre-registration and the amendment chain have a folder per switch point
    here = out / f"switch{args.switch_at:g}"
    here.mkdir(exist_ok=True)
    files = corpora()
    sizes = {k: sum(Path(f).stat().st_size for f in v) for k, v in files.items()}
    # 1. the rungs on each corpus
    for name in ("top", "pkg"):
        cfg = write_json(out / f"train-{name}.json", {"seed": args.seed, "train_data": files[name]})
        rungs = [a for r in cpu.rungs for a in ("--rung", r.name)]
        ladder("run", "cpu", *rungs, "--out", out / name, "--config", cfg)
    # 2. which corpus is better at the hero's compute, and the multiplier of the switch
    cmp_path = out / "compare-pkg-over-top.json"
    if not cmp_path.exists():
        cmp_path.write_text(ladder("compare", out / "top" / "cpu", out / "pkg" / "cpu", "--form",
                                   COMPARE_FORM, "--target", f"cpu:{hero.name}", "--json",
                                   "--seed", args.seed))
    m_pkg = json.loads(cmp_path.read_text())[METRIC]["multiplier"]
    old, new = ("top", "pkg") if m_pkg >= 1 else ("pkg", "top")
    cmp_path = out / f"compare-{new}-over-{old}.json"
    if not cmp_path.exists():
        cmp_path.write_text(ladder("compare", out / old / "cpu", out / new / "cpu", "--form",
                                   COMPARE_FORM, "--target", f"cpu:{hero.name}", "--json",
                                   "--seed", args.seed))
    comparison = json.loads(cmp_path.read_text())[METRIC]
    # 3. the old corpus's law and the hero's pre-registration
    law = out / f"law-{old}.json"
    if not law.exists():
        ladder("fit", out / old / "cpu", "--form", FORM, "--out", law)
    prereg = here / "prereg.json"
    if not prereg.exists():
        ladder("preregister", law, "--target", f"cpu:{hero.name}", "--runs", out / old / "cpu",
               "--data-tag", f"stdlib-{old}", "--out", prereg)
    # 4. the hero to S on the old corpus, the amendment, then on the new corpus
    hero_cfg = write_json(here / "train-hero.json", {
        "seed": args.seed, "train_data": files[old], "switch_data": files[new],
        "switch_at": args.switch_at})   # evals every 5%, the registered rung's (another eval_every
    #                                changes the rung's configuration: not_applicable)
    hero_dir = here / "hero" / "cpu" / hero.name
    amended = here / "prereg-switch.json"
    if not amended.exists():
        ladder("run", "cpu", "--rung", hero.name, "--out", here / "hero", "--config", hero_cfg,
               "--max-steps", S, "--resume")
        ladder("preregister", "--amend", prereg, "--reason",
               f"training data switches from stdlib-{old} to stdlib-{new} at step {S}",
               "--at-step", S, "--source", hero_dir, "--data-tag", f"stdlib-{new}",
               "--compare", cmp_path, "--transition", "compute", "--out", amended)
    ladder("run", "cpu", "--rung", hero.name, "--out", here / "hero", "--config", hero_cfg,
           "--resume")
    # 5. the watch, and the errors after S
    # the watch's exit is its verdict (1, 2: warnings, critical findings; 3: not applicable)
    verdict = json.loads(ladder("watch", prereg, "--source", hero_dir, "--json", ok=(0, 1, 2, 3)))
    steps, y = evals(hero_dir)
    o_doc, a_doc = pr.load(prereg), pr.load(amended)
    ov, av = PreregView.of(o_doc), PreregView.of(a_doc)
    grid = np.arange(0, hero.steps + 1)
    oc, olo, ohi = ov.expected(grid / hero.steps, alert=False)
    ac, alo, ahi = av.expected(grid / hero.steps, alert=False)
    last = steps[steps <= S][-1]
    shift = float(y[steps == last][0] / np.interp(last, grid, oc))
    from ladder.fit import load_law
    law_obj = load_law(law)
    target = Target.from_rung(hero)
    mult = multiplier_from_compare(str(cmp_path), METRIC)
    pre = (steps[steps <= S], y[steps <= S])
    noise = float(o_doc["eval_noise"]["sigma"])
    variants = {}
    # the amendment written is the compute transition's (the first default: the table of
    # docs/LOG.md); the others are computed here from the same evals up to S
    for label, kw in (("recipe transition", {"transition": "recipe", "m": mult}),
                      *((f"relax transition, width {w:g}", {"transition": "relax", "m": mult,
                                                            "width": w})
                        for w in (0.02, 0.05, 0.1)),
                      ("anchor only (M = 1)", {"transition": "compute", "m": None})):
        body = amended_forecast(o_doc, law_obj, target, Plan(S, kw["m"], f"stdlib-{new}"), pre,
                                level=float(o_doc["band_level"]), eval_noise=noise,
                                transition=kw["transition"], width=kw.get("width", 0.05))
        fr = np.array([r["fraction"] for r in body["forecast"]]) * hero.steps
        variants[label] = errors(steps, y, fr, *(np.array([r[k] for r in body["forecast"]])
                                                 for k in ("loss", "lo", "hi")), S, hero.steps)
    res = {
        "seed": args.seed, "switch_at": args.switch_at, "switch_step": S, "steps": hero.steps,
        "old": old, "new": new,
        "corpus_bytes": sizes, "files": {k: len(v) for k, v in files.items()},
        "multiplier": {k: comparison.get(k) for k in ("multiplier", "lo", "hi", "level", "at",
                                                       "decades_beyond", "trend")},
        "multiplier_pkg_over_top": m_pkg,
        "watch": {k: verdict.get(k) for k in ("exit", "worst", "not_applicable",
                                              "follows_from_step", "evals", "prereg")},
        "watch_alert_kinds": sorted({(a["kind"], a["severity"], a.get("step"))
                                     for a in verdict.get("alerts", [])
                                     if a["kind"] not in ("input", "prereg")},
                                    key=lambda t: (t[2] is None, t[2] or 0)),
        "final": {"observed": float(y[-1]), "amended": a_doc["final"],
                  "old": o_doc["final"]},
        "band_share_of_change": a_doc["change"]["final_band_share_of_change"],
        "anchor": a_doc["change"]["anchor"],
        "errors": {
            "amended (compute transition)": errors(steps, y, grid, ac, alo, ahi, S, hero.steps),
            "old forecast": errors(steps, y, grid, oc, olo, ohi, S, hero.steps),
            "naive (old curve shifted to the last eval)":
                errors(steps, y, grid, oc * shift, olo * shift, ohi * shift, S, hero.steps),
            **variants},
        "seconds": time.time() - t0,
    }
    write_json(here / "result.json", res)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    m = res["multiplier"]
    print(f"seed {args.seed}: {old} -> {new} at step {S} of {hero.steps}; multiplier of {new} "
          f"over {old} at the hero's compute {m['multiplier']:.3f} [{m['lo']:.3f}, "
          f"{m['hi']:.3f}] ({m['level']:.0%}; pkg over top {m_pkg:.3f}); the change's share of "
          f"the final band's variance {res['band_share_of_change']:.0%}")
    print(f"watch: exit {res['watch']['exit']}, {res['watch']['evals']} evals, follows from step "
          f"{res['watch']['follows_from_step']}; alerts {res['watch_alert_kinds']}")
    print(f"{'forecast':<44}{'mean|err| after S':>18}{'final err':>10}{'coverage':>10}"
          f"{'transition':>12}{'later':>8}")
    for k, e in res["errors"].items():
        print(f"{k:<44}{e['after']['mean_abs_rel']:>17.2%}{e['final_rel']:>+10.2%}"
              f"{e['after']['coverage']:>10.0%}{e['transition']['mean_abs_rel']:>12.2%}"
              f"{e['later']['mean_abs_rel']:>8.2%}")
    print(f"({res['errors']['old forecast']['after']['n']} evals after S; {res['seconds']:.0f} s)")
    return 0 if all(math.isfinite(e["after"]["mean_abs_rel"])
                    for e in res["errors"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
