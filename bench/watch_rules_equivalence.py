"""The watcher's alerts on this tree beside another checkout's (``--tree DIR``): for a rework of
the rules that must keep every alert (issue 25: each rule one class; the state file a section per
rule).

On the synthetic target of 1,200 steps (an eval every 1%; ``predict.synthetic``) the scenarios
the rule tests use (healthy, shifts either way, trend inside the band, rising, contingency, NaN,
a train-loss spike, grad norm, token drops, router entropy and expert load, router bias, a
parameter group, a heal after a bump, health signals that clear, a missing metric, a shortened
run, and the synthetic faults) are judged two ways, with and without the ladder's health
reference: whole, and in 7 polls with the state through JSON between them (a restart at each).
Each tree runs in its own process and writes every alert (all fields), exit status, the
decision rule (its parameters as written and its words), the alert kinds and the watched keys;
the rows that differ are printed, and the exit status is 1 when any does. Beside it, the time
each tree takes to judge the runs whole and in polls of 12 rows (~1% of the run: a follower's
pace, where reading and writing the state once per call weighs most).

    nice python bench/watch_rules_equivalence.py --tree /path/to/main-checkout
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def record(out_path: str) -> None:
    """This process's tree: every scenario's alerts and the derived tables, as JSON."""
    from tests import synthetic as sy
    from ladder.predict import watch as W
    try:  # beside ladder.predict.prereg's build since issue 25, among the commands before
        from ladder.predict.prereg import make_prereg
    except ImportError:
        from ladder.cli.predict import make_prereg
    from ladder.predict.watch import WatchConfig, check

    truth = sy.Truth()
    rungs = sy.ladder_targets(4, steps0=150)
    target = rungs[-1]
    noise = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)
    law = sy.TruthLaw(truth, run_sigma=0.005)
    tmp = Path(tempfile.mkdtemp())
    for i, t in enumerate(rungs[:3]):
        d = tmp / "ladder" / t.name
        d.mkdir(parents=True)
        rows = sy.make_run(truth, t, noise=noise, seed=100 + i).rows
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = {"ref": make_prereg(law, target, runs=str(tmp / "ladder"), eval_noise=0.003,
                               created="2026-01-01T00:00:00Z"),
            "noref": make_prereg(law, target, eval_noise=0.003, created="2026-01-01T00:00:00Z")}

    def rows(fault="none", at=0.5, size=0.02, seed=1, offset=0.0):
        return sy.make_run(truth, target, noise=noise, fault=sy.Fault(fault, at, size),
                           seed=seed, offset=offset).rows

    def edit(seed, lo, hi, change):
        rs = rows(seed=seed)
        for r in rs:
            if lo <= r["progress"] < hi:
                change(r)
        return rs

    def scale(key, factor, at=0.5):
        return edit(1, at, 2.0, lambda r: r.__setitem__(key, r[key] * factor))

    def metric(factor):
        return lambda r: r.__setitem__("eval_dropless/loss", r["eval_dropless/loss"] * factor) \
            if "eval_dropless/loss" in r else None

    def sick(r):
        r["grad/norm"] *= 6.0
        r["moe/drop_frac"] = 0.5
        r["moe/router_entropy"] *= 0.1

    def rename(r):  # the metric logged under another key (a wrong --metric)
        if "eval_dropless/loss" in r:
            r["eval_nodrop/loss"] = r.pop("eval_dropless/loss")

    def shorten(r):  # progress of a run planned 0.6x as long
        r["progress"] = r["step"] / (0.6 * target.steps)

    def spike():
        return edit(9, 0.7, 0.701, lambda r: r.__setitem__("train/loss", r["train/loss"] * 1.5))

    cases = {
        "healthy": lambda: rows(seed=1),
        "shift": lambda: rows("shift", 0.5, 0.02, seed=2),
        "below": lambda: rows("shift", 0.3, -0.03, seed=3),
        "trend": lambda: rows("shift", 0.5, 0.02, seed=15, offset=math.log(1 - 0.012)),
        "rising": lambda: rows("shift", 0.5, 0.03, seed=3),
        "contingency": lambda: rows("shift", 0.1, 0.02, seed=11),
        "nan": lambda: rows("nan", 0.6, seed=6),
        "spike": spike,
        "grad": lambda: scale("grad/norm", 5.0),
        "drop": lambda: rows("drop", 0.4, 0.15, seed=7),
        "entropy": lambda: scale("moe/router_entropy", 0.2),
        "load": lambda: scale("moe/load_max_over_mean", 2.6),
        "bias": lambda: scale("params/norm/router_bias", 6.0, at=0.6),
        "param": lambda: scale("params/norm/blocks", 3.0),
        "bump": lambda: edit(4, 0.4, 0.5, metric(1.03)),
        "health_clears": lambda: edit(21, 0.4, 0.55, sick),
        "rise_clears": lambda: edit(22, 0.5, 0.56, metric(1.05)),
        "no_metric": lambda: edit(2, 0.0, 2.0, rename),
        "shortened": lambda: edit(14, 0.0, 2.0, shorten),
    }
    for f in ("shift", "drift", "drop", "nan", "lrspike", "collapse"):
        cases["fault_" + f] = (lambda f=f: rows(f, 0.4, 0.05, seed=30))

    out: dict = {
        "parameters": json.dumps(WatchConfig().to_dict(), indent=2),
        "words": W.decision_rule_words(WatchConfig(), 0.9),
        "words_tuned": W.decision_rule_words(
            WatchConfig(k_consecutive=4, spike_k=9.0, nan_keys=("a",), alert_level=0.95), 0.8),
        "kinds": sorted(W.alert_kinds()), "kinds_watch": sorted(W.alert_kinds("watch")),
        "kinds_health": sorted(W.alert_kinds("health")),
        "keys": W.watched_keys("eval_dropless/loss")[1],
        "rules": [(r.name, r.scope, list(r.kinds), r.panel, list(r.prefixes),
                   list(r.reads("m", WatchConfig()))) for r in W.RULES],
    }
    seconds = {"whole": 0.0, "polls": 0.0}
    for name, make in cases.items():
        for dn, doc in docs.items():
            rs = make()
            t0 = time.perf_counter()
            whole = check(doc, rs, None, now=0)
            seconds["whole"] += time.perf_counter() - t0
            out[f"{name}/{dn}/whole"] = [a.to_dict() for a in whole.alerts] + [whole.exit_code]
            n, st, polls = len(rs), None, []
            cuts = [0, 7, n // 5, n // 3, n // 2, n // 2 + 1, 3 * n // 4, n]
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
                res = check(doc, rs[a:b], st, now=i)
                st = json.loads(json.dumps(res.state))
                polls += [[i, x.to_dict()] for x in res.alerts]
            out[f"{name}/{dn}/polls"] = polls + [res.exit_code]
            # a follower's polls: 12 rows each (~1% of the run), against the view it keeps,
            # the state passed on as it is
            view, st, t0 = W.PreregView.of(doc), None, time.perf_counter()
            for a in range(0, n, 12):
                st = check(view, rs[a:a + 12], st, now=0).state
            seconds["polls"] += time.perf_counter() - t0
    Path(out_path).write_text(json.dumps({"alerts": out, "seconds": seconds}, default=str))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", required=True, help="another checkout to compare with")
    ap.add_argument("--record", help=argparse.SUPPRESS)  # internal: write this tree's record
    args = ap.parse_args(argv)
    if args.record:
        record(args.record)
        return 0
    here = Path(__file__).resolve().parents[1]
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in (("this tree", here), ("--tree", Path(args.tree).resolve())):
            path = Path(tmp) / f"{len(got)}.json"
            env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
            subprocess.run([sys.executable, __file__, "--tree", str(tree), "--record",
                            str(path)], cwd=tree, env=env, check=True)
            got[name] = json.loads(path.read_text())
    a, b = got["this tree"]["alerts"], got["--tree"]["alerts"]
    for what in ("whole", "polls"):
        mine, theirs = got["this tree"]["seconds"][what], got["--tree"]["seconds"][what]
        print(f"judging {'whole runs' if what == 'whole' else 'in polls of 12 rows'}: "
              f"{mine:.2f} s here, {theirs:.2f} s in --tree ({mine / theirs:.2f}x)")
    differ = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
    alerts = sum(len(v) - 1 for k, v in a.items() if k.endswith("/whole"))
    print(f"{len(a)} rows ({sum(k.endswith('/whole') for k in a)} runs, {alerts} alerts judged "
          f"whole); {len(differ)} differ" + (f": {', '.join(differ)}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
