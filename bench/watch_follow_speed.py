"""Judging a long run's metrics.jsonl at once: a 1,000,000-line file with the keys a real MoE run
logs (~40 per line, ~1 KB: per-group parameter norms, per-layer expert load, throughput), as a
watcher started late in a 100-day run meets it (issue 14 item 3; the gate of issue 24 item 3).

Side by side in one run, on one file, each in its own fresh process (so its peak memory, the
growth of max RSS during the watch, is its own):

- ``json.loads loop``: a plain loop of ``json.loads`` over every line (the gate's baseline);
- ``first read``: ``Watcher(prereg, JsonlSource(file)).poll()`` without a state file: every
  line parsed (orjson; ``json.loads`` for the lines with NaN/Infinity tokens), the rows turned
  into columns in slices of 20,000, judged;
- ``ladder watch`` end to end: ``python -m ladder watch PREREG --source FILE`` in a fresh
  interpreter (imports, the pre-registration's check, the read, the judging);
- ``restart with --state``: ``ladder watch ... --state S --alerts A`` run twice; the second
  starts at the saved byte offset, so it reads nothing and repeats no alert;
- with ``--tree DIR`` (another checkout, e.g. the main branch before a change), its first read
  and its ``ladder watch`` end to end on the same file, beside ours.

The gate (issue 24): the first read of 1M lines <= 5 s on 2 cores, and ``ladder watch`` end to
end at most 0.6x the ``json.loads`` loop. Issue 38 withdrew the 0.6x and states the first read's
own gate: at most 1.2x the ``json.loads`` loop, whatever parser the reader uses. All paths must
give the same verdict, points, evals and alerts. CPU seconds are the process's own beside wall
seconds; the machine is shared, so the load average is printed with the figures.

    nice python bench/watch_follow_speed.py [--lines 1000000] [--keep FILE] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METRIC = "eval_dropless/loss"
GROUPS = ("embed", "attn_q", "attn_kv", "attn_o", "router", "router_bias", "experts_up",
          "experts_down", "shared_up", "shared_down", "norm", "lm_head")


def target_and_prereg(lines: int):
    """The synthetic truth, a target of ``lines`` steps and its pre-registration."""
    from ladder.predict import forecast as fc
    from tests import synthetic as sy
    from ladder.predict.prereg import make_prereg
    truth = sy.Truth()
    base = sy.ladder_targets(8, ratio=2.5, steps0=80)[7]
    target = fc.Target(name="big", params=base.params, active_params=base.active_params,
                       tokens=base.tokens / base.steps * lines, steps=lines,
                       compute=base.compute / base.steps * lines, seq_len=base.seq_len)
    doc = make_prereg(sy.TruthLaw(truth, run_sigma=0.005), target, eval_noise=0.004)
    return truth, target, doc


def write_metrics(path: Path, lines: int, truth, target, seed: int = 0) -> int:
    """A realistic metrics.jsonl (DESIGN.md keys, float noise in every value); its size."""
    rng = np.random.default_rng(seed)
    g = np.arange(1, lines + 1) / lines
    curve = truth.loss(target.compute, g)
    tl = curve + rng.normal(0, 0.02, lines)
    gn = 0.3 * np.exp(rng.normal(0, 0.1, lines))
    noise = rng.normal(0, 1, (lines, 8))
    tps = target.tokens / lines
    every = max(1, lines // 100)

    def r6(x):  # as a trainer logs them: float32 values, ~6 significant digits
        return float(f"{x:.6g}")

    with open(path, "w") as fh:
        for i in range(lines):
            s = i + 1
            z = noise[i]
            r = {"step": s, "tokens": s * tps, "progress": r6(s / lines),
                 "time": round(1.7e9 + s * 0.5, 1), "train/loss": r6(tl[i]),
                 "train/ce": r6(tl[i] - 1e-4), "train/z_loss": r6(1e-4 * (1 + 0.01 * z[0])),
                 "optim/lr": r6(3e-4 * (1 - 0.95 * g[i])), "grad/norm": r6(gn[i])}
            for k, grp in enumerate(GROUPS):
                r[f"params/norm/{grp}"] = r6(10.0 + k + 0.01 * z[k % 8])
            r.update({"moe/drop_frac": r6(0.03 + 0.001 * z[1]),
                      "moe/load_max_over_mean": r6(1.4 + 0.02 * z[2]),
                      "moe/router_entropy": r6(5.1 + 0.01 * z[3])})
            for layer in range(8):
                r[f"moe/layer_{layer}/load_max_over_mean"] = r6(1.4 + 0.01 * z[(layer + 4) % 8])
            r.update({"throughput/tokens_per_s": r6(1.2e6 * (1 + 0.01 * z[5])),
                      "throughput/mfu": r6(0.41 + 0.001 * z[6]), "flops": r6(6.1e18 * s)})
            if s % every == 0:
                r[METRIC] = r6(curve[i] + 0.004 * z[7])
                r["eval/loss"] = r6(r[METRIC] + 0.01)
                r["eval/bpb"] = r6(r[METRIC] / 0.69)
            fh.write(json.dumps(r) + "\n")
    return path.stat().st_size


# Each measurement runs in a fresh interpreter whose sys.path starts with the tree measured.
# memory: the peak resident size during the measured part minus the resident size at its start
# (ru_maxrss alone would be the imports' transient peak when the measured part stays below it).
# The peak is the process's own VmHWM: Linux carries ru_maxrss over an exec, so a child's
# ru_maxrss starts at this process's peak (the file read into the page cache, ~1.1 GB).
_RSS = """
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20

def peak_mb():
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024
"""

_JSON_LOOP = """
import json, resource, sys, time
""" + _RSS + """
path = sys.argv[1]
rss0 = rss_mb()

t0, c0 = time.perf_counter(), time.process_time()
n = 0
with open(path, "rb") as f:
    for line in f:
        json.loads(line)
        n += 1
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "mem": peak_mb() - rss0,
                  "lines": n}))
"""

_FIRST_READ = """
import json, resource, sys, time
""" + _RSS + """
tree, prereg, path = sys.argv[1:4]
sys.path.insert(0, tree)
from ladder.predict.live import Watcher
from ladder.sources import JsonlSource
doc = json.load(open(prereg))
src = JsonlSource(path)
for attr, value in (("cache", False), ("parallel_min_bytes", 1 << 62)):  # older trees
    if hasattr(src, attr):
        setattr(src, attr, value)
rss0 = rss_mb()
t0, c0 = time.perf_counter(), time.process_time()
w = Watcher(doc, src, [], None)
w.poll()
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
alerts = sorted([a.kind, a.severity, a.step] for a in w.all_alerts if a.kind != "input")
print(json.dumps({"wall": dt, "cpu": cpu,
                  "mem": peak_mb() - rss0,
                  "verdict": [w.exit_code, w.state["n_points"], w.state["n_evals"], alerts]}))
"""


def _child(code: str, *args: str, cwd: Path = ROOT) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"measurement failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cli(tree: Path, argv: list[str]) -> tuple[float, float, int, str]:
    """Wall and CPU seconds, exit status and stdout of ``python -m ladder ARGV`` in
    ``tree`` (a fresh interpreter)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ladder", *argv], cwd=tree,
                       capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dt, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), r.returncode, r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="write (or reuse) the metrics file here "
                    "(default: a temporary file)")
    ap.add_argument("--tree", default=None, metavar="DIR",
                    help="another checkout measured beside this one (default: none)")
    args = ap.parse_args(argv)
    truth, target, doc = target_and_prereg(args.lines)
    work = Path(tempfile.mkdtemp())
    path = Path(args.keep) if args.keep else work / "metrics.jsonl"
    t0 = time.perf_counter()
    if not path.exists():
        write_metrics(path, args.lines, truth, target)
    size = path.stat().st_size
    print(f"{args.lines:,} lines, {size / 1e6:.0f} MB ({size / args.lines:.0f} B/line), ready "
          f"in {time.perf_counter() - t0:.0f} s; {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    from ladder.predict import prereg as pr
    prereg = pr.write_once(work / "prereg.json", doc)
    path.read_bytes()  # into the page cache: every reader starts from memory
    rows: list[tuple[str, float, float, float | None, str]] = []
    verdicts = {}

    def add(name, wall, cpu, mem, note=""):
        rows.append((name, wall, cpu, mem, note))
        print(f"  {name:<44} {wall:6.2f} s wall, {cpu:6.2f} s CPU"
              + (f", peak +{mem:5.0f} MB" if mem is not None else "")
              + (f"; {note}" if note else "") + f"; load {os.getloadavg()[0]:.2f}", flush=True)

    base = _child(_JSON_LOOP, str(path))
    add("json.loads loop (baseline)", base["wall"], base["cpu"], base["mem"],
        f"{base['lines']:,} lines")
    trees = [("this tree", ROOT)] + ([("--tree", Path(args.tree).resolve())] if args.tree else [])
    sidecar = path.parent / f".{path.name}.watch-cache"  # an older tree's column cache
    for label, tree in trees:
        shutil.rmtree(sidecar, ignore_errors=True)
        fr = _child(_FIRST_READ, str(tree), str(prereg), str(path))
        verdicts[label] = fr["verdict"]
        v = fr["verdict"]
        add(f"{label}: first read (Watcher.poll)", fr["wall"], fr["cpu"], fr["mem"],
            f"exit {v[0]}, {v[1]:,} points, {v[2]} evals, {len(v[3])} alerts")
        extra = ["--column-cache", "off"] if label != "this tree" else []
        dt, cpu, rc, _ = _cli(tree, ["watch", str(prereg), "--source", str(path), *extra])
        add(f"{label}: `ladder watch` end to end", dt, cpu, None,
            f"exit {rc}; {dt / base['wall']:.2f}x the json.loads loop's wall, "
            f"{cpu / base['cpu']:.2f}x its CPU")
        if label != "this tree":  # an older tree's column cache, warm
            _cli(tree, ["watch", str(prereg), "--source", str(path)])
            dt, cpu, rc, _ = _cli(tree, ["watch", str(prereg), "--source", str(path)])
            add(f"{label}: `ladder watch`, column cache warm", dt, cpu, None,
                f"exit {rc}; {dt / base['wall']:.2f}x the json.loads loop's wall, "
                f"{cpu / base['cpu']:.2f}x its CPU")
            shutil.rmtree(sidecar, ignore_errors=True)
    state, alerts = work / "state.json", work / "alerts.jsonl"
    watch = ["watch", str(prereg), "--source", str(path), "--state", str(state), "--alerts",
             str(alerts)]
    dt1, cpu1, rc1, out1 = _cli(ROOT, watch)
    n1 = len(alerts.read_text().splitlines()) if alerts.exists() else 0
    dt2, cpu2, rc2, out2 = _cli(ROOT, watch)
    n2 = len(alerts.read_text().splitlines()) if alerts.exists() else 0
    offset = json.loads(state.read_text())["source"]["offset"]
    add("this tree: `ladder watch --state`, first", dt1, cpu1, None,
        f"exit {rc1}, {n1} alert lines")
    add("this tree: `ladder watch --state`, restarted", dt2, cpu2, None,
        f"exit {rc2}; {n2 - n1} alert lines added, {len(out2.splitlines())} printed; "
        f"state offset {offset:,} of {size:,} bytes")
    print("\n| path | wall s | CPU s | peak MB | notes |\n|---|---|---|---|---|")
    for name, wall, cpu, mem, note in rows:
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {'' if mem is None else f'{mem:.0f}'} | "
              f"{note} |")
    first = next(r for r in rows if r[0] == "this tree: first read (Watcher.poll)")
    e2e = next(r for r in rows if r[0] == "this tree: `ladder watch` end to end")
    same = len({json.dumps(v) for v in verdicts.values()}) == 1
    restart_ok = rc2 == rc1 and n2 == n1 and offset == size
    # on a machine shared with other work, wall time is mostly waiting: the process's CPU
    # seconds are the measure that does not depend on the neighbours (both are printed)
    ratio = first[2] / base["cpu"]
    print(f"\ngate (CPU seconds; wall in the table): first read {first[2]:.2f} s (<= 5 s: "
          f"{first[2] <= 5}), {ratio:.2f}x the json.loads loop (<= 1.2x, issue 38: "
          f"{ratio <= 1.2}; wall {first[1] / base['wall']:.2f}x); end to end "
          f"{e2e[2] / base['cpu']:.2f}x the json.loads loop "
          f"(<= 0.6: {e2e[2] / base['cpu'] <= 0.6}); same verdict in every tree: {same}; "
          f"restart repeats nothing and reads nothing: {restart_ok}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if same and restart_ok else 1


if __name__ == "__main__":
    sys.exit(main())
