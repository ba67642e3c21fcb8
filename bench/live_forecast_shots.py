"""Screenshots of the updated forecast (issue 40) on the live page and the report, in headless
Chromium: a synthetic target drifting from 30% of its run (tests/synthetic.py), watched to
62%, its pre-registration frozen before.

    python bench/live_forecast_shots.py --out DIR      (writes DIR/live_updated.png and
                                                        DIR/report_updated.png)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def shot(chromium: str, url: str, path: Path, height: int) -> None:
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={path}", f"--window-size=1200,{height}",
                    "--virtual-time-budget=4000", url], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def main(argv=None) -> int:
    from ladder.cli.main import main as cli
    from ladder.predict import prereg as pr
    from tests import synthetic as sy
    from ladder.predict.live import Watcher
    from ladder.predict.prereg import make_prereg
    from ladder.sources import JsonlSource
    from ladder.reports.live import LivePage

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("headless Chromium not installed", file=sys.stderr)
        return 69
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        truth, target = sy.Truth(), sy.ladder_targets(4, steps0=150)[-1]
        noise = sy.RunNoise(run_sigma=0.005, eval_sigma=0.003)
        p = pr.write_once(out / "prereg.json",
                          make_prereg(sy.TruthLaw(truth, run_sigma=0.005), target,
                                      eval_noise=0.003))
        run = out / "target"
        run.mkdir()
        rows = sy.make_run(truth, target, noise=noise, seed=2,
                           fault=sy.Fault("drift", 0.3, 0.05)).rows
        (run / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows if r["progress"] <= 0.62))
        alerts = out / "alerts.jsonl"
        cli(["watch", str(p), "--source", str(run / "metrics.jsonl"), "--alerts", str(alerts)])
        cli(["report", "--prereg", str(p), "--target-run", str(run), "--alerts", str(alerts),
             "--out", str(out / "report")])
        w = Watcher(p, JsonlSource(run / "metrics.jsonl"))
        page = LivePage.for_watcher(w, port=0, poll_ms=300)
        try:
            w.poll()
            page.body()  # the state of the watch, and its chart drawn before the shot
            while not page.drawings:
                time.sleep(0.05)
            shot(chromium, page.url, args.out / "live_updated.png", 1400)
        finally:
            page.close()
        shot(chromium, (out / "report" / "index.html").as_uri(), args.out / "report_updated.png",
             1400)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
