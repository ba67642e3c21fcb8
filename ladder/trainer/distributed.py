"""Multi-host JAX for one rung: start-up, who writes, and which rows of a batch a process feeds.

One rung can span several processes (hosts), each owning some devices of one global ("data",
"expert") mesh, joined by ``jax.distributed.initialize`` (:class:`DistributedConfig`). Process 0
writes the run directory (:func:`is_writer`; every process writes its own checkpoint shards);
each process builds only its rows of a batch (:func:`local_rows`, :func:`global_array`); and
step-boundary decisions are taken by all together (:func:`agree`: an Orbax save is collective,
and a process that saved alone would wait for the others forever).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ladder.io import EX_USAGE, InputError

MODES = ("off", "auto", "explicit")
# Seconds to wait for every process to reach the coordinator. JAX's own default is 300 s; it is
# also ours, so a slow scheduler that starts hosts minutes apart still connects.
DEFAULT_TIMEOUT_S = 300


@dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-host run: "off" (the default: a single-host run never
    tries to connect), "auto" (``jax.distributed.initialize()`` reads the cluster's environment
    on SLURM, Kubernetes JobSet, Cloud TPU, Open MPI ...) or "explicit" (a coordinator, process
    count and process id)."""

    mode: str = "off"
    coordinator: str | None = None    # HOST:PORT of process 0's coordinator service
    num_processes: int | None = None
    process_id: int | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {self.mode!r}")
        explicit = (self.coordinator, self.num_processes, self.process_id)
        if self.mode == "explicit":
            if any(v is None for v in explicit):
                raise ValueError("coordinator: --coordinator, --num-processes and --process-id "
                                 "go together")
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"coordinator: must be HOST:PORT, got {self.coordinator!r}")
            if not isinstance(self.num_processes, int) or self.num_processes < 1:
                raise ValueError(f"num_processes: must be an integer >= 1, got "
                                 f"{self.num_processes!r}")
            if not isinstance(self.process_id, int) or not 0 <= self.process_id \
                    < self.num_processes:
                raise ValueError(f"process_id: must be in [0, {self.num_processes}), got "
                                 f"{self.process_id!r}")
        elif any(v is not None for v in explicit):
            raise ValueError(f"coordinator: --coordinator/--num-processes/--process-id need "
                             f"--distributed explicit (or none), not {self.mode!r}")
        if not isinstance(self.timeout_s, int) or self.timeout_s < 1:
            raise ValueError(f"timeout_s: must be an integer >= 1, got {self.timeout_s!r}")


def from_args(mode: str | None, coordinator: str | None, num_processes: int | None,
              process_id: int | None, timeout_s: int | None = None) -> DistributedConfig:
    """The config of the `ladder run` flags; a coordinator without a mode means "explicit".
    Bad flags are an InputError naming the flag."""
    if mode is None:
        mode = "explicit" if coordinator is not None or num_processes is not None \
            or process_id is not None else "off"
    try:
        return DistributedConfig(mode, coordinator, num_processes, process_id,
                                 DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
    except ValueError as e:
        name, _, message = str(e).partition(": ")
        raise InputError(message, field=f"--{name.replace('_', '-')}",
                         exit_code=EX_USAGE) from None


def initialize(cfg: DistributedConfig) -> dict:
    """Join the multi-host run (nothing for mode "off"); must run before any JAX computation.
    Returns what env.json records about the processes."""
    if cfg.mode == "off":
        return {"mode": "off", "process_index": 0, "process_count": 1}
    import jax

    if cfg.mode == "auto":
        try:
            jax.distributed.initialize(initialization_timeout=cfg.timeout_s)
        except (ValueError, RuntimeError) as e:  # no cluster environment JAX knows
            seen = environment_hint()
            raise InputError(f"auto-detection failed ({str(e).splitlines()[0]}); cluster "
                             f"environment seen: {seen or 'none'}", field="--distributed",
                             exit_code=EX_USAGE) from None
    else:
        jax.distributed.initialize(coordinator_address=cfg.coordinator,
                                   num_processes=cfg.num_processes, process_id=cfg.process_id,
                                   initialization_timeout=cfg.timeout_s)
    return info(cfg.mode)


def info(mode: str | None = None) -> dict:
    """Process index and count, local and global device counts (for env.json)."""
    import jax

    return {"mode": mode or ("multi-process" if jax.process_count() > 1 else "off"),
            "process_index": jax.process_index(), "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(), "devices": jax.device_count()}


def is_writer() -> bool:
    """True in the process that writes the run directory (process 0; the only one when off)."""
    import jax

    return jax.process_index() == 0


def local_rows(sharding, batch: int) -> slice:
    """The rows of a [batch, ...] array that this process's devices hold under ``sharding``: a
    contiguous block (a mesh built from ``jax.devices()`` orders the devices by process)."""
    idx = sharding.addressable_devices_indices_map((batch,))
    starts = sorted({(s[0].start or 0, batch if s[0].stop is None else s[0].stop)
                     for s in idx.values()})
    lo, hi = starts[0][0], starts[-1][1]
    covered = sum(b - a for a, b in starts)
    if covered != hi - lo:
        raise ValueError(f"this process's rows of the batch are not contiguous: {starts}")
    return slice(lo, hi)


def global_array(sharding, local: np.ndarray, global_shape: tuple[int, ...]):
    """A global jax.Array from this process's rows (``local``); identical to device_put of the
    whole array when there is one process."""
    import jax

    return jax.make_array_from_process_local_data(sharding, local, global_shape)


def agree(*flags: bool) -> tuple[bool, ...]:
    """Each flag OR-ed over all processes (a no-op for one process): every process then takes
    the same branch at a step boundary."""
    import jax

    if jax.process_count() == 1:
        return tuple(bool(f) for f in flags)
    from jax.experimental import multihost_utils

    got = multihost_utils.process_allgather(np.asarray(flags, np.int32))
    return tuple(bool(v) for v in np.asarray(got).reshape(-1, len(flags)).max(axis=0))


def barrier(name: str) -> None:
    """Wait until every process reaches ``name`` (a no-op for one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def environment_hint() -> str | None:
    """Which cluster environment ``--distributed auto`` would read, if one is visible."""
    for var, name in (("SLURM_JOB_ID", "SLURM"), ("JOBSET_NAME", "Kubernetes JobSet"),
                      ("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("TPU_WORKER_HOSTNAMES", "Cloud TPU"),
                      ("MEGASCALE_COORDINATOR_ADDRESS", "Cloud TPU multislice")):
        if os.environ.get(var):
            return name
    return None
