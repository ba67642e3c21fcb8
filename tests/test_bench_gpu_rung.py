"""bench/gpu_rung.py --smoke: the GPU benchmark's code path runs on CPU with tiny shapes."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_rung_smoke(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_rung", ROOT / "bench" / "gpu_rung.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    assert bench.main(["--smoke", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["steps"] == 2 and row["batch"] == 2 and row["devices"] == 1
    assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1
    assert row["peak_memory_bytes"] > 0
    assert "measured" in row["peak"]["source"]        # CPU: the matmul, not the table
    assert "tokens/s" in capsys.readouterr().out
