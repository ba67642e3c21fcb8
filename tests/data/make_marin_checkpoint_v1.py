"""Writes tests/data/marin_checkpoint_v1/: a checkpoint of the marin optimizer in the layout
before issue 22 (a zero second moment on every MuonH leaf too), for the test that such a
checkpoint still restores (tests/test_optim.py). It must be run with the code of that time, not
with the code under test:

    git archive d5fd03f | tar -x -C /tmp/ladder-d5fd03f
    JAX_PLATFORMS=cpu LADDER_JAX_CACHE=0 PYTHONPATH=/tmp/ladder-d5fd03f \\
        .venv/bin/python tests/data/make_marin_checkpoint_v1.py

It trains the tiny ladder's first rung with the marin optimizer, one layer, the recipe's init
scale, for 3 steps, and keeps the checkpoint of step 3 (an Orbax composite, item "state").
"""

import shutil
import sys
import tempfile
from pathlib import Path

from ladder.specs import LADDERS
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import OptimizerOverrides, RunArgs, TrainConfig

OUT = Path(__file__).resolve().parent / "marin_checkpoint_v1"
STEPS = 3


def config(rung) -> TrainConfig:
    return TrainConfig(optim=OptimizerOverrides(optimizer="marin"),
                       run=RunArgs(peak_flops=1e11, progress=False, checkpoint_every=STEPS),
                       model={"init_std": 0.5 / rung.model.d_model ** 0.5, "n_layers": 1})


def main() -> int:
    import ladder.trainer.optim

    if "scale_by_muon" not in Path(ladder.trainer.optim.__file__).read_text():
        print("run this with the code before issue 22 (see the docstring)", file=sys.stderr)
        return 64
    rung = LADDERS["tiny"].rungs[0]
    with tempfile.TemporaryDirectory() as tmp:
        train_rung(rung, Path(tmp) / "run", config(rung), max_steps=STEPS)
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(Path(tmp) / "run" / "checkpoints" / str(STEPS), OUT / str(STEPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
