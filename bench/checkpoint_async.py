"""Time the training loop waits for checkpoints: synchronous Orbax saves beside asynchronous ones
(the default), side by side in one process, on a rung of the cpu ladder.

Each variant trains the rung for --steps steps with a checkpoint every --every steps (the last
step too), --repeats times, interleaved; the summary's ``timing.checkpoint_s`` is the time the
loop spent inside ``save`` (async: the copy off the devices and any wait for the previous save).
Also prints the size of one checkpoint on disk.

    nice -n 15 python bench/checkpoint_async.py [--rung 324K-A167K] [--steps 20] [--every 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ladder.specs import LADDERS  # noqa: E402
from ladder.trainer.train import train_rung  # noqa: E402
from ladder.trainer.trainconfig import RunArgs, TrainConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rung", default=None, help="cpu-ladder rung (default: its target)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    ladder = LADDERS["cpu"]
    rung = next(r for r in ladder.all if r.name == a.rung) if a.rung else ladder.all[-1]
    saves = len(range(a.every, a.steps + 1, a.every)) + (a.steps % a.every != 0)
    tmp = Path(tempfile.mkdtemp(prefix="ladder-ckpt-bench-"))
    results: dict[bool, list[dict]] = {False: [], True: []}
    size = None
    try:
        for rep in range(a.repeats):
            for background in (False, True):
                out = tmp / f"{background}-{rep}"
                cfg = TrainConfig(run=RunArgs(peak_flops=1e11, progress=False,
                                              checkpoint_every=a.every,
                                              checkpoint_async=background))
                s = train_rung(rung, out, cfg, max_steps=a.steps)
                results[background].append(s["timing"])
                step_dir = out / "checkpoints" / str(a.steps)
                size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
                shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"cpu/{rung.name}: {rung.params.total:,} parameters, {a.steps} steps, {saves} saves, "
          f"one checkpoint {size / 1e6:.2f} MB on disk")
    per = {}
    for background, runs in results.items():
        wait = min(r["checkpoint_s"] for r in runs) / saves
        steps = min(r["steps_s"] for r in runs) / a.steps
        per[background] = wait
        print(f"{'async' if background else 'sync '}: the loop waits {wait * 1e3:.0f} ms per "
              f"save (best of {len(runs)}), a step takes {steps * 1e3:.0f} ms")
    print(f"async/sync wait per save: {per[True] / per[False]:.2f}")


if __name__ == "__main__":
    main()
