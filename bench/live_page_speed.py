"""The live page of a watcher on a long run (issue 24, item 4; issue 36 item 4): the CPU per state
change and per poll, and the page's memory at 1,000,000 metrics lines, beside the page as it was
before issue 24 (it re-read the run directory and drew the figure with matplotlib for every new
version).

Side by side in one run, on files written by bench/watch_follow_speed.py's generator (~40 keys a
line, an eval every 1% of the run):

- ``after`` (``ladder.reports.live.WatcherFeed``): a watcher judges the whole file with its page
  attached, then a few more lines arrive and it polls again; timed: per state change, the
  refresh (the state rebuilt from the page's bounded series, its JSON encoded) and the drawing
  of the chart (the report's watch figure of the downsampled points as a PNG, which the page's
  drawing thread does at most once per ``REDRAW_S``); per poll, a refresh at an unchanged
  version (the cached bytes), ``GET /state.json`` and ``GET /chart.png`` over HTTP; the page's
  own memory (its series, the JSON and the PNG). Done at ``--small`` lines too, to show the
  page's memory does not grow with the run.
- ``before``: the old refresh, ``ladder.reports.inputs.load_inputs`` of the run directory, the
  matplotlib watch figure and its PNG, in a fresh process (its time and max-RSS growth), at
  ``--before-lines`` (default 200,000: it reads the whole file every time; 1M takes minutes).

    python bench/live_page_speed.py [--lines 1000000] [--small 100000] [--before-lines 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from watch_follow_speed import target_and_prereg, write_metrics  # noqa: E402


def run_dir(root: Path, lines: int, extra: int) -> tuple[Path, dict]:
    """A run directory whose metrics.jsonl holds ``lines`` lines and ``extra`` more aside
    (``more.jsonl``: what arrives after the first read); its pre-registration."""
    truth, target, doc = target_and_prereg(lines + extra)
    d = root / f"run{lines}"
    d.mkdir(parents=True, exist_ok=True)
    full = d / "all.jsonl"
    if not full.exists():
        write_metrics(full, lines + extra, truth, target)
    with open(full, "rb") as f:
        data = f.read()
    cut = 0
    for _ in range(lines):
        cut = data.index(b"\n", cut) + 1
    (d / "metrics.jsonl").write_bytes(data[:cut])
    (d / "more.jsonl").write_bytes(data[cut:])
    return d, doc


def after(d: Path, doc: dict) -> dict:
    """The watcher's page: CPU per state change and per poll, and the page's memory."""
    from ladder.predict import prereg as pr
    from ladder.predict.live import Watcher
    from ladder.reports.live import LivePage
    from ladder.sources import JsonlSource

    prereg = d / "prereg.json"
    if not prereg.exists():
        pr.write_once(prereg, doc)
    w = Watcher(prereg, JsonlSource(d / "metrics.jsonl"), [], None)
    page = LivePage.for_watcher(w, port=0, redraw_s=0)
    try:
        t0 = time.perf_counter()
        w.poll()
        first_read = time.perf_counter() - t0
        page.body()
        while not page.drawings:  # the first drawing (imports matplotlib) is not timed
            time.sleep(0.01)
        with open(d / "metrics.jsonl", "ab") as f:
            f.write((d / "more.jsonl").read_bytes())
        w.poll()
        page.redraw_s = 3600  # the page's own thread draws no more: the drawing is timed here
        c0 = time.process_time()
        body = page.body()  # a new version: rebuilt
        new_version_cpu = time.process_time() - c0
        draw = page.feed.state()["chart"]
        draw_cpu, png = min((_timed(draw) for _ in range(3)), key=lambda r: r[0])
        reps = 200
        c0 = time.process_time()
        for _ in range(reps):
            page.body()
        same_version_cpu = (time.process_time() - c0) / reps
        http = {}
        for path in ("state.json", "chart.png"):
            t0 = time.perf_counter()
            for _ in range(20):
                with urllib.request.urlopen(page.url + path, timeout=30) as r:
                    r.read()
            http[path] = (time.perf_counter() - t0) / 20
        x, _ = page.feed.metric.points()
        ds = page.feed.metric
        series = sum(a.nbytes for a in (ds.lo_x, ds.lo_y, ds.hi_x, ds.hi_y))
        return {"lines": w.state["n_points"], "first_read_s": first_read,
                "refresh_new_version_cpu_s": new_version_cpu, "draw_cpu_s": draw_cpu,
                "png_bytes": len(png), "refresh_same_version_cpu_s": same_version_cpu,
                "http_state_s": http["state.json"], "http_chart_s": http["chart.png"],
                "page_bytes": series + len(body) + len(page.chart() or b""),
                "json_bytes": len(body), "drawn": len(x), "exit": w.exit_code}
    finally:
        page.close()


def _timed(draw) -> tuple[float, bytes]:
    """The page's drawing of ``draw`` (reports.live._png): (CPU s, PNG bytes)."""
    from ladder.reports.live import _png
    c0 = time.process_time()
    png = _png(draw)
    return time.process_time() - c0, png


def _hwm_mb() -> float:
    """This process's peak resident memory (VmHWM: per address space, so a child started by a
    big parent starts from its own, unlike getrusage's ru_maxrss, which a fork inherits)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def before_child(d: str, prereg: str) -> None:
    """The old page's refresh (ladder/reports/live.py before issue 24): re-read the run directory,
    draw the watch figure with matplotlib, encode its PNG."""
    import matplotlib
    matplotlib.use("Agg")
    from ladder.reports import plots
    from ladder.reports.inputs import load_inputs
    rss0 = _hwm_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    inp = load_inputs(prereg=prereg, target_run=d)
    fig = plots.plot_watch(inp)
    png = plots.png_bytes(fig)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = _hwm_mb()
    print(json.dumps({"refresh_s": dt, "refresh_cpu_s": cpu, "png_bytes": len(png),
                      "rss_growth_mb": rss - rss0, "max_rss_mb": rss}))


def before(d: Path, doc: dict) -> dict:
    from ladder.predict import prereg as pr
    prereg = d / "prereg.json"
    if not prereg.exists():
        pr.write_once(prereg, doc)
    r = subprocess.run([sys.executable, __file__, "--child", str(d), str(prereg)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        before_child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--before-lines", type=int, default=200_000)
    ap.add_argument("--extra", type=int, default=1000, help="lines that arrive after the "
                    "first read")
    ap.add_argument("--keep", default=None, help="a folder for the files (reused; default: "
                    "a temporary one)")
    args = ap.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp())
    print(f"{os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = {}
    for n in sorted({args.small, args.lines}):
        d, doc = run_dir(root, n, args.extra)
        a = after(d, doc)
        rows[n] = a
        print(f"  after, {a['lines']:>9,} lines: per state change "
              f"{a['refresh_new_version_cpu_s'] * 1e3:.1f} ms CPU (state) + "
              f"{a['draw_cpu_s'] * 1e3:.0f} ms CPU (the chart's drawing, "
              f"{a['png_bytes'] / 1024:.0f} KiB PNG, {a['drawn']:,} points); per poll "
              f"{a['refresh_same_version_cpu_s'] * 1e6:.1f} us CPU (cached), "
              f"{a['http_state_s'] * 1e3:.1f} ms GET /state.json, "
              f"{a['http_chart_s'] * 1e3:.1f} ms GET /chart.png over HTTP; page "
              f"{a['page_bytes'] / 1024:.0f} KiB ({a['json_bytes'] / 1024:.0f} KiB JSON); the "
              f"watcher's own first read {a['first_read_s']:.1f} s; load "
              f"{os.getloadavg()[0]:.2f}")
    d, doc = run_dir(root, args.before_lines, args.extra)
    with open(d / "metrics.jsonl", "ab") as f:
        f.write((d / "more.jsonl").read_bytes())
    b = before(d, doc)
    print(f"  before, {args.before_lines + args.extra:>8,} lines: refresh {b['refresh_s']:.2f} s "
          f"wall, {b['refresh_cpu_s']:.2f} s CPU (re-read + matplotlib), max RSS "
          f"+{b['rss_growth_mb']:.0f} MB ({b['max_rss_mb']:.0f} MB); load "
          f"{os.getloadavg()[0]:.2f}")
    big = rows[args.lines]
    grew = max(b["rss_growth_mb"], 1)
    change = big["refresh_new_version_cpu_s"] + big["draw_cpu_s"]
    print(f"  after at {args.lines:,} / before at {args.before_lines:,}: CPU per state change "
          f"(state + drawing) {change / b['refresh_cpu_s']:.4f}; page memory / the "
          f"before refresh's RSS growth {big['page_bytes'] / 1024 ** 2 / grew:.5f}")
    print(f"  page memory at {args.lines:,} / at {args.small:,} lines: "
          f"{rows[args.lines]['page_bytes'] / rows[args.small]['page_bytes']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
