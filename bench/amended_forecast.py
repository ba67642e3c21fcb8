"""Issue #6 on the CPU ladder: the proxy hero's plan changes, and the forecast is amended honestly.

After `ladder demo` (its rungs and its frozen prereg.json are reused), this script
1. takes the law for the amendment: ``--law mpl`` fits the schedule-aware multi-power law (Luo et
   al. 2025; fit.curve_fit) on the rungs' whole curves, with the exact LR of every step rebuilt from
   each run's config.json; ``--law trajectory`` reuses the demo's law.json (a shortened run whose
   decay is re-aimed to its new end keeps the schedule's shape, so it is a run of 0.6x the planned
   compute in that law's own domain); the multi-power law's projections are printed either way;
2. copies the demo's frozen pre-registration into OUT/ (byte for byte: the chain lives in one
   folder) and writes an amendment for the changed plan: the same proxy hero, shortened to
   ``--decay-end`` (default 60%) of its planned tokens with the LR decay re-aimed to end there,
   linked to the old file by its sha256, with the reason;
3. trains that shortened proxy hero;
4. watches it twice with the real `ladder watch` command: against the old pre-registration alone
   (it must say "not_applicable", exit 3, rather than raise a false alarm) and through the chain
   (the watcher follows the amendment and judges the run against it);
5. prints whether the amended band holds the run's final loss.

    python bench/amended_forecast.py [--demo demo_out] [--law mpl|trajectory] [--decay-end 0.6]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ladder.fit import load_law, load_points  # noqa: E402
from ladder.fit.curve_fit import fit_curve_law  # noqa: E402
from ladder.fit.lr_schedules import NamedSchedule  # noqa: E402
from ladder.io import as_float, atomic_write_json  # noqa: E402
from tests.helpers import contingency_forecast, schedules_from_sources  # noqa: E402
from ladder.specs import get_ladder  # noqa: E402


def watch(prereg: Path, source: Path, alerts: Path) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "ladder", "watch", str(prereg), "--source", str(source),
           "--alerts", str(alerts)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return p.returncode, (p.stdout + p.stderr).strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", default=str(ROOT / "demo_out"), help="output of `ladder demo`")
    ap.add_argument("--out", default=None, help="default: DEMO/amended")
    ap.add_argument("--ladder", default="cpu")
    ap.add_argument("--decay-end", type=float, default=0.6)
    ap.add_argument("--bootstrap", type=int, default=100)
    ap.add_argument("--law", default="mpl", choices=["mpl", "trajectory"],
                    help="the law the amendment is forecast with")
    args = ap.parse_args(argv)
    from ladder.predict import prereg as pr
    from ladder.predict.forecast import Target
    from ladder.predict.prereg import make_prereg

    demo = Path(args.demo)
    out = Path(args.out) if args.out else demo / "amended"
    ladder = get_ladder(args.ladder)
    runs = demo / "runs" / ladder.name
    rung_dirs = [runs / r.name for r in ladder.rungs]
    old_prereg = demo / "prereg.json"
    missing = [p for p in [old_prereg, *rung_dirs] if not p.exists()]
    if missing:
        print(f"run `ladder demo --out {demo}` first: missing {missing[0]}")
        return 2
    t0 = time.time()

    # 1. the schedule-aware law, on the rungs only ------------------------------------------
    law_path = out / "law-mpl.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = load_points([str(d) for d in rung_dirs], include_incomplete=False)
        law = fit_curve_law(points, "mpl", bootstrap=args.bootstrap, level=0.9, seed=0,
                            metric=points.attrs.get("metric"),
                            schedules=schedules_from_sources([str(d) for d in rung_dirs]))
    atomic_write_json(law_path, law.to_json())
    print(f"[1/4] multi-power law on {len(points)} eval points of {len(rung_dirs)} rungs -> "
          f"{law_path} ({time.time() - t0:.0f} s); the amendment uses the {args.law} law")

    # 2. the amendment ----------------------------------------------------------------------
    hero = ladder.target
    short = dataclasses.replace(hero, steps=max(1, round(args.decay_end * hero.steps)))
    chain_dir = out / f"chain-{args.law}"
    chain_dir.mkdir(parents=True, exist_ok=True)
    old_copy = chain_dir / "prereg.json"
    if not old_copy.exists():
        shutil.copyfile(old_prereg, old_copy)
        old_copy.chmod(0o444)
    new_path = chain_dir / "prereg-amended.json"
    cf = contingency_forecast(law, hero, args.decay_end)
    reason = (f"contingency: shorten to {args.decay_end:.0%} of the planned tokens "
              f"({short.steps} of {hero.steps} steps) with the LR decay re-aimed to end there")
    if not new_path.exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            amend_law = (law.on(NamedSchedule.of_rung(short)) if args.law == "mpl"
                         else load_law(demo / "law.json"))
            doc = make_prereg(amend_law, Target.from_rung(short), level=0.9,
                              runs=str(runs), data_tag="python-stdlib",
                              amends=pr.amendment(old_copy, reason))
        pr.write_once(new_path, doc)
    doc = pr.load(new_path)
    fin = {k: as_float(v) for k, v in doc["final"].items()}
    print(f"[2/4] amended pre-registration {new_path} (amends sha256 "
          f"{doc['amends']['sha256'][:12]}...): final {fin['loss']:.4f} "
          f"[{fin['lo']:.4f}, {fin['hi']:.4f}]")
    print(f"      the multi-power law: as planned {cf.planned.loss:.4f} "
          f"[{cf.planned.lo:.4f}, {cf.planned.hi:.4f}] at {cf.planned.tokens:,} tokens; "
          f"shortened {cf.shortened.loss:.4f} [{cf.shortened.lo:.4f}, {cf.shortened.hi:.4f}] "
          f"at {cf.shortened.tokens:,} tokens")

    # 3. the shortened run ------------------------------------------------------------------
    from ladder.trainer.train import TrainConfig, train_rung

    run_dir = out / "runs" / ladder.name / f"{hero.name}-short"
    print(f"[3/4] training {hero.name} for {short.steps} of its {hero.steps} steps, decay "
          f"re-aimed -> {run_dir}")
    summary = train_rung(short, run_dir, TrainConfig(), resume=True)
    actual = as_float(summary["final"].get(doc["metric"]))

    # 4. the two watches --------------------------------------------------------------------
    alone = out / "unamended"
    alone.mkdir(parents=True, exist_ok=True)
    if not (alone / "prereg.json").exists():
        shutil.copyfile(old_prereg, alone / "prereg.json")
    code_old, text_old = watch(alone / "prereg.json", run_dir / "metrics.jsonl",
                               out / "alerts-unamended.jsonl")
    code_new, text_new = watch(old_copy, run_dir / "metrics.jsonl",
                               out / f"alerts-chain-{args.law}.jsonl")
    inside = fin["lo"] <= actual <= fin["hi"]
    result = {"law": args.law, "decay_end": args.decay_end, "steps": short.steps,
              "planned_steps": hero.steps,
              "amended_final": fin, "actual_final": actual, "inside": inside,
              "unamended_watch_exit": code_old, "chain_watch_exit": code_new,
              "seconds": time.time() - t0}
    atomic_write_json(out / f"result-{args.law}.json", result)
    print("[4/4] watch against the old pre-registration alone (exit "
          f"{code_old}; 3 = the forecast no longer applies):")
    print("      " + "\n      ".join(text_old.splitlines()[-4:]))
    print(f"      watch through the chain (exit {code_new}):")
    print("      " + "\n      ".join(text_new.splitlines()[-4:]))
    print(f"result: actual final {actual:.4f}, amended forecast {fin['loss']:.4f} "
          f"[{fin['lo']:.4f}, {fin['hi']:.4f}] -> {'INSIDE' if inside else 'OUTSIDE'} the band; "
          f"unamended watch exit {code_old} ({'not_applicable' if code_old == 3 else 'WRONG'})")
    print(json.dumps(result))
    return 0 if inside and code_old == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
