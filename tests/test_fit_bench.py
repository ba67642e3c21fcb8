"""The fitter's benchmarks skip cleanly without the anchors folder."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.heavy  # 12 s on 2 busy cores
def test_benches_skip_without_anchors(tmp_path):
    for script in ("bench/accuracy.py", "bench/fit_speed.py"):
        r = subprocess.run([sys.executable, str(ROOT / script), "--anchors",
                            str(tmp_path / "absent")], check=False, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("skip:")
