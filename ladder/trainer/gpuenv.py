"""XLA settings for MoE training on NVIDIA GPUs, set before JAX starts its backend (issue 37
item 4).

XLA reads ``XLA_FLAGS`` and ``XLA_PYTHON_CLIENT_MEM_FRACTION`` once, when the first backend is
created, not at ``import jax``. So :func:`apply` runs first thing in ``ladder run``, in
``train_rung`` (Ray workers, library callers) and in bench/gpu_rung.py; when a backend is
already up it changes nothing and records that it came too late. Only on a GPU platform: CPU
and TPU runs see no change. The user's own environment wins (a flag already in ``XLA_FLAGS``, by
name, or a variable already set), and ``LADDER_GPU_FLAGS=0`` turns all of this off; env.json
(``gpu_env``) records what was set and what was the user's. XLA aborts on a flag it does not
know, and flags come and go between jaxlib releases: only the flags a child process on the CPU
backend (which parses every XLA flag) accepts are set.

Sources: NVIDIA's JAX-Toolbox (rosetta/docs/GPU_performance.md, "the guide" below, and its
containers' environment) and JAX's gpu_performance_tips. No NCCL variable is set: NVIDIA's
container dropped its one (NCCL_NVLS_ENABLE=0, JAX-Toolbox PR 1708) and leaves NCCL to its own
tuning; ``CUDA_DEVICE_MAX_CONNECTIONS=1`` helps Hopper and hurts Blackwell (the guide's Blackwell
tips), so it is the user's to set.
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import logging
import os
import re
import subprocess
import sys

from ladder.accelerators import GPU_MEM_FRACTION

log = logging.getLogger(__name__)

_MIB = 2 ** 20
XLA_GPU_FLAGS = (
    # overlap collectives (the expert all-to-all, FSDP's all-gathers and reduce-scatters) with
    # compute: the one XLA flag NVIDIA's JAX container sets by default, JAX's first GPU tip
    ("xla_gpu_enable_latency_hiding_scheduler", "true"),
    # FSDP over a scanned layer stack prefetches the next layer's weights while this one
    # computes (the guide's "Enable Optimizations for FSDP communication"; MaxText's and
    # JAX-Toolbox's GPU training scripts set all four)
    ("xla_gpu_enable_pipelined_all_gather", "true"),
    ("xla_gpu_enable_pipelined_reduce_scatter", "true"),
    ("xla_gpu_enable_pipelined_all_reduce", "true"),
    ("xla_gpu_enable_while_loop_double_buffering", "true"),
    # many small per-layer collectives merged up to these sizes (the guide's "many small
    # collectives": 1 GiB / GPUs, reduce-scatter 1 GiB / (2 x GPUs)); one 8-GPU node's values,
    # since the GPU count is not known before the backend starts
    ("xla_gpu_all_gather_combine_threshold_bytes", str(128 * _MIB)),
    ("xla_gpu_all_reduce_combine_threshold_bytes", str(128 * _MIB)),
    ("xla_gpu_reduce_scatter_combine_threshold_bytes", str(64 * _MIB)),
)
# 0.9 (JAX's default 0.75): the guide, "We typically set it to 0.9 or 0.8"; the layout is
# chosen for this share
ENV_VARS = (("XLA_PYTHON_CLIENT_MEM_FRACTION", str(GPU_MEM_FRACTION)),)
OFF_SWITCH = "LADDER_GPU_FLAGS"

_applied: dict | None = None   # what the first apply() in this process did


def _flag_names(xla_flags: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"--([A-Za-z0-9_]+)", xla_flags)}


def gpu_platform(environ=os.environ) -> bool:
    """Whether JAX will start on an NVIDIA GPU, judged without starting it."""
    plats = (environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or "").lower()
    if plats.strip():
        return any(p.strip() in ("cuda", "gpu") for p in plats.split(","))
    if environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    plugin = any((d.metadata["Name"] or "").lower().replace("_", "-").startswith(
        ("jax-cuda", "jaxlib-cuda")) for d in md.distributions())
    return plugin and bool(glob.glob("/dev/nvidia[0-9]*"))


def backend_started() -> bool:
    """Whether this process's JAX has created a backend already (then XLA_FLAGS is read)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
        return bool(getattr(xla_bridge, "_backends", {}))
    except ImportError:   # a JAX without this module: assume the worst
        return True


def accepted_flags(flags: list[str]) -> list[str]:
    """The flags of ``flags`` this jaxlib accepts: one child process on the CPU backend; on a
    refusal, one per flag."""
    def ok(chunk):
        env = {**os.environ, "XLA_FLAGS": " ".join(chunk), "JAX_PLATFORMS": "cpu",
               OFF_SWITCH: "0"}
        r = subprocess.run([sys.executable, "-c",
                            "import jax.numpy as j; j.zeros(1).block_until_ready()"],
                           env=env, capture_output=True, timeout=300, check=False)
        return r.returncode == 0
    if not flags or ok(flags):
        return list(flags)
    return [f for f in flags if ok([f])]


def apply(environ=os.environ, *, probe: bool = True, force_gpu: bool | None = None) -> dict:
    """Set the GPU settings in ``environ`` (module docstring); returns (and remembers, for
    env.json) what it did. A second call reports the first one's result."""
    global _applied
    if _applied is not None and environ is os.environ:
        return _applied
    result: dict = {"gpu": False, "set": {}, "user": {}, "xla_flags_set": [],
                    "xla_flags_user": [], "xla_flags_refused": []}
    is_gpu = gpu_platform(environ) if force_gpu is None else force_gpu
    if environ.get(OFF_SWITCH, "").strip().lower() in ("0", "false", "off", "no"):
        result["note"] = f"{OFF_SWITCH}=0: nothing set"
    elif not is_gpu:
        result["note"] = "not a GPU platform: nothing set"
    elif environ is os.environ and backend_started():
        result.update(gpu=True, note="JAX's backend had started before the GPU settings could "
                                     "be applied: nothing set (set XLA_FLAGS yourself)")
        log.warning("%s", result["note"])
    else:
        result["gpu"] = True
        user_flags = environ.get("XLA_FLAGS", "")
        names = _flag_names(user_flags)
        result["xla_flags_user"] = sorted(names)
        ours = [f"--{k}={v}" for k, v in XLA_GPU_FLAGS if k not in names]
        good = accepted_flags(ours) if probe else ours
        result["xla_flags_refused"] = [f for f in ours if f not in good]
        if good:
            environ["XLA_FLAGS"] = f"{user_flags} {' '.join(good)}".strip()
        result["xla_flags_set"] = good
        for name, value in ENV_VARS:
            if name in environ:
                result["user"][name] = environ[name]
            else:
                environ[name] = value
                result["set"][name] = value
        log.info("ladder: GPU settings: XLA_FLAGS += %s; %s", " ".join(good) or "nothing",
                 result["set"] or "no variable set")
    result["XLA_FLAGS"] = environ.get("XLA_FLAGS", "")
    if environ is os.environ:
        _applied = result
    return result


def applied() -> dict:
    """What :func:`apply` did in this process (for env.json); {} when it never ran."""
    return dict(_applied or {})
