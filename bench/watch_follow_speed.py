"""Judging a long run's metrics.jsonl at once: a 1,000,000-line file with the keys a real MoE run
logs (~40 per line, ~1 KB: per-group parameter norms, per-layer expert load, throughput), as a
watcher started (or restarted without state) late in a 100-day run meets it (issue 14 item 3).

Side by side in one run, on one file, each path in its own fresh process (so its peak memory,
the growth of max RSS during the watch, is its own), the watcher started without a state file:

- ``before``: the column reader (``predict.jsonl_columns``: templates checked with numpy, only
  the keys the rules read decoded, exactly as ``json.loads``), pandas' rolling medians in the
  rules, no column cache (main before this change);
- ``cold``: the same first read with the rules' medians by ``predict.watch.rolling`` (equal to
  pandas' to the bit); it writes the column cache (``predict.column_cache``) as it goes;
- ``warm``: a watcher started again without its state: the cached polls replayed after their
  bytes are checked (CRC-32 of all 1.1 GB), then judged; and the same as ``ladder watch PREREG
  --source FILE`` in a fresh interpreter, end to end;
- with ``--rows``, also the row path (``JsonlSource.columns = False``: a dict per line from
  pandas' ujson, as the watcher read before the column reader).

All must give the same verdict, points, evals and alerts. CPU seconds are the process's own
beside wall seconds; the machine is shared, so the load average is printed with the figures.

    /work/main/.venv/bin/python bench/watch_follow_speed.py [--lines 1000000] [--keep FILE] [--rows]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predict import forecast as fc  # noqa: E402
from predict import synthetic as sy  # noqa: E402
from predict.commands import make_prereg  # noqa: E402

METRIC = "eval_dropless/loss"
GROUPS = ("embed", "attn_q", "attn_kv", "attn_o", "router", "router_bias", "experts_up",
          "experts_down", "shared_up", "shared_down", "norm", "lm_head")


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


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


PATHS = (("before (pandas medians, no cache)", "before"), ("cold (writes the cache)", "cold"),
         ("warm (from the cache)", "warm"))
ROWS = ("rows (ujson dicts)", "rows")


def judge(doc, path: Path, how: str, cache_dir: str):
    """In a fresh process (so each path's peak memory is its own): wall and CPU seconds, the
    growth of max RSS over the process's state before the watch, and the verdict."""
    from predict.live import Watcher
    from predict.sources import JsonlSource
    from predict.watch import rolling
    src = JsonlSource(path)
    src.columns = how != "rows"
    src.cache = how in ("cold", "warm")
    src.cache_dir = cache_dir
    src.parallel_min_bytes = 1 << 62  # one process: the pool starts at 4 cores
    if how in ("before", "rows"):
        rolling.MAX_NETWORK_WINDOW = 0  # every median by pandas, as before
    rss0 = _maxrss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    w = Watcher(doc, src, [], None)
    w.poll()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    verdict = (w.exit_code, w.state["n_points"], w.state["n_evals"],
               sorted((a.kind, a.severity, a.step) for a in w.all_alerts if a.kind != "input"))
    return dt, cpu, _maxrss_mb() - rss0, verdict


def judge_apart(doc, path: Path, how: str, cache_dir: str):
    import concurrent.futures as cf
    import multiprocessing as mp
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(judge, doc, path, how, cache_dir).result()


def _cli_watch(doc, path: Path) -> tuple[float, float, int]:
    """Wall and CPU seconds and the exit status of ``python -m ladder.cli watch PREREG --source
    FILE`` in a fresh interpreter (the column cache beside the file warm)."""
    import subprocess

    from predict import prereg as pr
    d = tempfile.mkdtemp()
    try:
        prereg = pr.write_once(Path(d) / "prereg.json", doc)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, "-m", "ladder.cli", "watch", str(prereg), "--source",
                             str(path)], cwd=Path(__file__).resolve().parents[1],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return dt, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), rc
    finally:
        shutil.rmtree(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="write (or reuse) the metrics file here "
                    "(default: a temporary file)")
    ap.add_argument("--rows", action="store_true", help="also time the row path (default: no)")
    args = ap.parse_args(argv)
    truth = sy.Truth()
    base = sy.ladder_targets(8, ratio=2.5, steps0=80)[7]
    target = fc.Target(name="big", params=base.params, active_params=base.active_params,
                       tokens=base.tokens / base.steps * args.lines, steps=args.lines,
                       compute=base.compute / base.steps * args.lines, seq_len=base.seq_len)
    doc = make_prereg(sy.TruthLaw(truth, run_sigma=0.005), target, eval_noise=0.004)
    tmp = None
    if args.keep:
        path = Path(args.keep)
    else:
        tmp = tempfile.mkdtemp()
        path = Path(tmp) / "metrics.jsonl"
    t0 = time.perf_counter()
    if not path.exists():
        write_metrics(path, args.lines, truth, target)
    size = path.stat().st_size
    print(f"{args.lines:,} lines, {size / 1e6:.0f} MB ({size / args.lines:.0f} B/line), written "
          f"in {time.perf_counter() - t0:.0f} s; {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    res = {}
    sidecar = path.parent / f".{path.name}.watch-cache"  # where `ladder watch` keeps it
    shutil.rmtree(sidecar, ignore_errors=True)  # the cold path starts without one
    paths = PATHS + ((ROWS,) if args.rows else ())
    for name, how in paths:
        dt, cpu, mem, verdict = judge_apart(doc, path, how, None)
        res[how] = (dt, cpu, mem, verdict)
        print(f"  {name:<34} {dt:6.2f} s wall, {cpu:6.2f} s CPU, peak +{mem:5.0f} MB; "
              f"exit {verdict[0]}, {verdict[1]:,} points, {verdict[2]} evals, "
              f"{len(verdict[3])} alerts; load {os.getloadavg()[0]:.2f}")
    cli_s, cli_cpu, cli_rc = _cli_watch(doc, path)
    print(f"  {'warm, `ladder watch` end to end':<34} {cli_s:6.2f} s wall, {cli_cpu:6.2f} s CPU "
          f"(interpreter, imports, pre-registration check, judging); exit {cli_rc}; load "
          f"{os.getloadavg()[0]:.2f}")
    shutil.rmtree(sidecar, ignore_errors=True)
    base = res["before"]
    for name, how in paths[1:]:
        r = res[how]
        print(f"  {name} / before: wall {r[0] / base[0]:.2f}, CPU {r[1] / base[1]:.2f}, memory "
              f"{r[2] / max(base[2], 1):.2f}")
    same = all(r[3] == base[3] for r in res.values())
    print(f"  same verdict, points, evals and alerts: {same}")
    if tmp:
        path.unlink()
        os.rmdir(tmp)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
