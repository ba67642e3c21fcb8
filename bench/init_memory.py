"""Host memory and time of a fresh train state's parameters: the whole model drawn in numpy and
then placed (model.init + jax.device_put, the init before issue 22) beside each process drawing
only its devices' shards (model.init_sharded, what Programs.init_state does now).

Model: marin-535b's 1.6B-A61M rung (its recipe switches, experts of width d/2) scaled down to
--d-model, --vocab, --layers and --experts so that it fits beside other work on a small
machine. On fake CPU devices the devices' memory IS host memory, so the figure that matters is
the peak resident set of a process above what its own shards take: one process x 8 devices
(all shards local) and 2 processes x 4 devices (jax.distributed on 127.0.0.1; each process
holds half). Each measurement is a fresh process; peak RSS from getrusage, minus the RSS before
the init (JAX, the traced shapes and shardings already built).

    nice -n 15 python bench/init_memory.py [--d-model 768] [--vocab 128256] [--layers 1]
        [--experts 96]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
import jax
process, n_proc, port, variant, layers, experts, d, vocab = sys.argv[1:9]
if int(n_proc) > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}", int(n_proc), int(process))
import numpy as np
import ladder.model as M
from ladder.trainer.optim import OptimizerSpec
from ladder.specs import LADDERS
from ladder.trainer.step import make_mesh, make_optimizer, state_shardings
from flax.traverse_util import flatten_dict

rung = LADDERS["marin-535b"].rungs[0]
# heads stay 128 wide (d/128 of them, KV heads as the rung's, floor 1); experts of width d/2
h = max(1, int(d) // 128)
cfg = rung.model.replace(n_layers=int(layers), n_experts=int(experts), d_model=int(d),
                         vocab_size=int(vocab), n_heads=h, n_kv_heads_local=max(1, h // 4),
                         n_kv_heads_global=max(1, h // 8), expert_dim=int(d) // 2,
                         latent_dim=int(d) // 2, gated_norm_rank=min(128, int(d)))
n = len(jax.devices())
mesh = make_mesh(n, None, cfg.n_experts, n)
shard = state_shardings(cfg, make_optimizer(OptimizerSpec().settings(1.0, 1, 1)), mesh)["params"]
shapes, _ = M.param_shapes(cfg)
total = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(shapes))
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
before = rss()
t = time.perf_counter()
if variant == "whole":
    params, _ = M.init(cfg, 0)
    params = jax.device_put(params, shard)
else:
    params, _ = M.init_sharded(cfg, 0, shard)
jax.block_until_ready(params)
dt = time.perf_counter() - t
local = sum(s.data.nbytes for x in jax.tree.leaves(params) for s in x.addressable_shards)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"variant": variant, "process": int(process), "processes": int(n_proc),
                  "devices": n, "model_bytes": total, "local_shard_bytes": local,
                  "peak_above_start": peak - before, "rss_after": rss() - before, "seconds": dt}))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(variant: str, processes: int, a) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // processes}"}
    port = str(_port())
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(i), str(processes), port,
                               variant, str(a.layers), str(a.experts), str(a.d_model),
                               str(a.vocab)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=3600)
        if p.returncode:
            raise SystemExit(e[-3000:])
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--experts", type=int, default=96)
    a = ap.parse_args()
    gib = 2 ** 30
    rows = {}
    for processes in (1, 2):
        for variant in ("whole", "sharded"):
            r = measure(variant, processes, a)
            rows[(processes, variant)] = r
            for x in r:
                print(f"{processes} process(es) x {8 // processes} devices, {variant:7s} "
                      f"(process {x['process']}): model {x['model_bytes'] / gib:.2f} GiB, its "
                      f"shards {x['local_shard_bytes'] / gib:.2f} GiB, peak RSS above start "
                      f"{x['peak_above_start'] / gib:.2f} GiB, {x['seconds']:.1f} s", flush=True)
    for processes in (1, 2):
        w = max(x["peak_above_start"] for x in rows[(processes, "whole")])
        s = max(x["peak_above_start"] for x in rows[(processes, "sharded")])
        print(f"{processes} process(es): sharded/whole peak host memory per process "
              f"{s / w:.2f}")


if __name__ == "__main__":
    main()
