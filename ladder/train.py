"""The training loop: one rung of a ladder into one run directory.

``train_rung(rung, out_dir, cfg)`` resolves the rung against the training config, loads the data,
builds a jitted ``train_step(state, batch) -> (state, metrics)`` with donated state on a device
mesh with axes ("data", "expert"), and runs ONE visible loop: step, log, eval, checkpoint. The run
directory it writes is the contract of shared/DESIGN.md: ``config.json``, ``env.json``,
``metrics.jsonl``, ``checkpoints/`` (Orbax) and ``summary.json``.

Exactness: batch i is a pure function of (seed, i) (on token shards: drawn by a Grain iterator
whose state is saved in every checkpoint) and the LR of step i a pure function of i, so a run
resumed from a checkpoint at step k recomputes steps k+1... exactly as the uninterrupted run
did (bitwise on CPU). On resume metrics.jsonl is cut back (atomically) to the rows of steps <= k,
so a run killed between a checkpoint and the next one leaves no duplicated or lost rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ladder import __version__, distributed
from ladder.checkpointing import Checkpoints
from ladder.counting import conventions
from ladder.data import Corpus, corrupt_bytes, load_corpus, shuffle_bytes
from ladder.io import (
    EX_USAGE,
    InputError,
    atomic_write_json,
    atomic_write_text,
    iter_jsonl,
    read_json,
    to_jsonable,
)
from ladder.lrtable import LR_SPIKE, SPIKE_AT, SPIKE_SCALE, spike_step
from ladder.lrtable import lr_table as base_lr_table
from ladder.optim import OPTIMIZERS, OptimizerSettings
from ladder.specs import Rung, Schedule
from model.config import ModelConfig

FAULTS = ("lr-spike", "data-swap", "loss-drift")
RUN_CONFIG_SCHEMA = "run-config/1"
SUMMARY_SCHEMA = "run-summary/1"
ENV_SCHEMA = "run-env/1"
EX_DIVERGED = 1        # a diverged run exits 1 (it is not an input error: those are 64+)
EX_INTERRUPTED = 130   # Ctrl-C, as shells report SIGINT
EX_TERMINATED = 143    # SIGTERM (a preemption), as shells report it: 128 + 15


@dataclass(frozen=True)
class TrainConfig:
    """How to train a rung (the rung itself says what to train). JSON round-trip via to_dict.

    ``devices``, ``expert_parallel``, ``wandb`` and ``progress`` are run arguments: they change
    where and how a run is watched, never its numbers (the identity check on resume ignores them).
    """

    seed: int = 0
    checkpoint_every: int = 0        # steps between checkpoints; 0 = every 25% of the run
    checkpoint_minutes: float | None = None  # also a rolling checkpoint this often (wall clock)
    keep: int = 2                    # checkpoints kept (the issue: the last 2)
    eval_sequences: int = 96         # held-out set: this many fixed windows (rounded up to whole
                                     # batches), the same for every rung whatever its batch (96
                                     # divides every cpu-ladder batch). A set that shrank with the
                                     # batch made small rungs' evals noisy: 1k tokens at batch 4.
    eval_every: float | None = None  # fraction of the run between evals; None = the rung's (5%)
    log_every: int = 1               # steps between metrics rows (the loss is checked every step)
    peak_flops: float | None = None  # FLOP/s of ONE device for throughput/mfu; None = the
                                     # accelerator table (ladder.accelerators), on CPU measured once
    devices: int | None = None       # devices in the mesh; None = all visible devices
    expert_parallel: int | None = None  # size of the "expert" mesh axis; None = largest that fits
    microbatch: int | None = None    # sequences per microbatch (gradient accumulation inside the
                                     # step); None = the whole batch. Must divide the batch, and
                                     # the devices must divide it.
    eval_batch: int | None = None    # sequences per eval call (its own small batch: the recipe
                                     # evaluates 64 per rack); None = the rung's batch
    optimizer: str | None = None     # adamw | marin (ladder/optim.py); None = the ladder's
    # Fixed optimizer numbers; None = the optimizer's rule (adamw: b1 0.9, b2 0.95, eps 1e-8,
    # weight decay 0.1 on matrices, clip 1.0; marin: the recipe's rules, see ladder/optim.py).
    b1: float | None = None
    b2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None   # global-norm clipping; 0 disables
    lr: float | None = None          # peak LR override; None = the ladder's LR rule
    schedule: dict = field(default_factory=dict)  # Schedule field overrides (decay_end: re-aim)
    model: dict = field(default_factory=dict)  # ModelConfig field overrides (ablations)
    data: tuple[str, ...] = ()       # text files/globs or one token array; () = Python stdlib
    vocab_size: int | None = None    # for raw .bin token files (and a check for .npy)
    fault: str | None = None         # fault injection for demos: lr-spike, data-swap, loss-drift
    fault_at: float = SPIKE_AT       # ... from this fraction of the planned steps on
    fault_scale: float = SPIKE_SCALE  # lr-spike: LR multiplier
    drift_max: float = 0.3           # loss-drift: share of random tokens reached at the end
    wandb: bool = False
    wandb_project: str | None = None  # None: WANDB_PROJECT, else "ladder" (ladder.wandbrun)
    wandb_entity: str | None = None   # None: WANDB_ENTITY, else W&B's default entity
    progress: bool = True            # tqdm bar on stderr

    def __post_init__(self):
        def check(name, ok, what):
            if not ok:
                raise ValueError(f"{name}: must be {what}, got {getattr(self, name)!r}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for name in ("seed", "checkpoint_every"):
            check(name, is_int(getattr(self, name)) and getattr(self, name) >= 0,
                  "an integer >= 0")
        for name in ("keep", "eval_sequences", "log_every"):
            check(name, is_int(getattr(self, name)) and getattr(self, name) >= 1,
                  "an integer >= 1")
        for name in ("devices", "expert_parallel", "vocab_size", "microbatch", "eval_batch"):
            v = getattr(self, name)
            check(name, v is None or is_int(v) and v >= 1, "null or an integer >= 1")
        for name in ("b1", "b2"):
            v = getattr(self, name)
            check(name, v is None or is_num(v) and 0 <= v < 1, "null or a number in [0, 1)")
        for name in ("eps", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            check(name, v is None or is_num(v) and v >= 0, "null or a number >= 0")
        check("optimizer", self.optimizer is None or self.optimizer in OPTIMIZERS,
              f"null or one of {OPTIMIZERS}")
        for name in ("lr", "peak_flops"):
            v = getattr(self, name)
            check(name, v is None or is_num(v) and v > 0, "null or a number > 0")
        check("checkpoint_minutes", self.checkpoint_minutes is None
              or is_num(self.checkpoint_minutes) and self.checkpoint_minutes > 0,
              "null or a number > 0")
        check("eval_every", self.eval_every is None
              or is_num(self.eval_every) and 0 < self.eval_every <= 1, "null or in (0, 1]")
        check("fault", self.fault is None or self.fault in FAULTS, f"null or one of {FAULTS}")
        check("fault_at", is_num(self.fault_at) and 0 <= self.fault_at < 1, "in [0, 1)")
        check("fault_scale", is_num(self.fault_scale) and self.fault_scale > 0, "> 0")
        check("drift_max", is_num(self.drift_max) and 0 < self.drift_max <= 1, "in (0, 1]")
        for name in ("wandb", "progress"):
            check(name, isinstance(getattr(self, name), bool), "true or false")
        for name in ("wandb_project", "wandb_entity"):
            v = getattr(self, name)
            check(name, v is None or isinstance(v, str) and v, "null or a non-empty string")
        check("model", isinstance(self.model, dict), "an object of model config fields")
        if isinstance(self.data, (list, str)):
            object.__setattr__(self, "data", (self.data,) if isinstance(self.data, str)
                               else tuple(self.data))
        check("data", all(isinstance(p, str) for p in self.data), "a list of paths")
        check("schedule", isinstance(self.schedule, dict), "an object of schedule fields")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["data"] = list(self.data)
        return d

    # Fields that do not change a run's numbers: allowed to differ on resume.
    RUN_ARGUMENTS = ("devices", "expert_parallel", "wandb", "wandb_project", "wandb_entity",
                     "progress", "peak_flops", "checkpoint_every", "checkpoint_minutes", "keep",
                     "log_every")


def train_config(values: dict, *, where: str = "config") -> TrainConfig:
    """A TrainConfig from a dict (a --config file and --key=value overrides merged).

    Dotted keys ``model.X`` / ``schedule.X`` set one field of those nested objects. An unknown key
    or a bad value is an InputError naming ``where`` and the field.
    """
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    flat: dict = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head not in known:
            raise InputError(f"unknown training config key (known: {', '.join(sorted(known))})",
                             path=where, field=key, exit_code=EX_USAGE)
        if rest:
            if head not in ("model", "schedule"):
                raise InputError("only model.X and schedule.X take dotted keys", path=where,
                                 field=key, exit_code=EX_USAGE)
            nested = dict(flat.get(head) or {})
            nested[rest] = value
            flat[head] = nested
        elif head in ("model", "schedule") and isinstance(value, dict) and flat.get(head):
            flat[head] = {**flat[head], **value}
        else:
            flat[head] = value
    for key, value in _leaves(flat):
        if isinstance(value, float) and not math.isfinite(value):  # --lr=1e400 is inf
            raise InputError(f"must be finite, got {value!r}", path=where, field=key,
                             exit_code=EX_USAGE)
    for key, cls, what in (("schedule", Schedule, "schedule key"),
                           ("model", ModelConfig, "model config key")):
        sub = flat.get(key)
        if isinstance(sub, dict):
            unknown = sorted(set(sub) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise InputError(f"unknown {what}", path=where, field=f"{key}.{unknown[0]}",
                                 exit_code=EX_USAGE)
    try:
        return TrainConfig(**flat)
    except (ValueError, TypeError) as e:
        name = str(e).split(":")[0] if ":" in str(e) else None
        raise InputError(str(e).split(": ", 1)[-1], path=where, field=name,
                         exit_code=EX_USAGE) from None


def _leaves(d, prefix: str = ""):
    """(dotted key, value) of every non-container value of a config dict."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        elif isinstance(v, list):
            yield from ((f"{prefix}{k}", x) for x in v)
        else:
            yield f"{prefix}{k}", v


def parse_overrides(items: list[str]) -> dict:
    """``["--lr=1e-3", "--model.top_k=4"]`` -> ``{"lr": 0.001, "model.top_k": 4}`` (JSON values;
    anything that is not JSON is taken as a string)."""
    out = {}
    for item in items:
        body = item.removeprefix("--")
        key, eq, raw = body.partition("=")
        if not eq or not key:
            raise InputError(f"expected --key=value, got {item!r}", field="overrides",
                             exit_code=EX_USAGE)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        except (ValueError, RecursionError):  # an integer of 4300+ digits, nesting too deep
            raise InputError("not a usable value (too long or nested too deeply)",
                             field=key, exit_code=EX_USAGE) from None
        out[key.replace("-", "_")] = value
    return out


# ------------------------------------------------------------------------------ resolution


def resolve_rung(rung: Rung, cfg: TrainConfig, corpus_vocab: int | None = None) -> Rung:
    """The rung actually trained: model/LR/schedule overrides and the data's vocabulary applied."""
    model_kw = dict(cfg.model)
    if corpus_vocab is not None and corpus_vocab != rung.model.vocab_size:
        model_kw.setdefault("vocab_size", corpus_vocab)
    try:
        model = rung.model.replace(**model_kw) if model_kw else rung.model
    except ValueError as e:
        field_name = str(e).split(":")[0]
        raise InputError(str(e).split(": ", 1)[-1], field=f"model.{field_name}",
                         exit_code=EX_USAGE) from None
    except TypeError as e:
        raise InputError(str(e), field="model", exit_code=EX_USAGE) from None
    if model.precision == "auto":
        # config.json records what ran: f32 on CPU, bf16 on accelerators
        import jax

        from model.config import resolve_precision
        model = model.replace(precision=resolve_precision("auto", jax.default_backend()))
    kw = {"model": model}
    if cfg.lr is not None:
        kw["peak_lr"] = float(cfg.lr)
    if cfg.schedule:
        try:
            kw["schedule"] = dataclasses.replace(rung.schedule, **cfg.schedule)
        except ValueError as e:
            raise InputError(str(e).split(": ", 1)[-1], field=str(e).split(":")[0],
                             exit_code=EX_USAGE) from None
    if cfg.eval_every is not None:
        kw["eval_every"] = float(cfg.eval_every)
    kw["optimizer"] = optimizer_spec(cfg, rung.optimizer)
    return rung.replace(**kw)


def optimizer_spec(cfg: TrainConfig, spec):
    """The rung's optimizer rule with the training config's kind and fixed numbers applied."""
    if cfg.optimizer is not None:
        spec = spec.replace(kind=cfg.optimizer)
    fixed = {key: getattr(cfg, name) for name, key in (
        ("b1", "beta1"), ("b2", "beta2"), ("eps", "eps"), ("weight_decay", "weight_decay"),
        ("grad_clip", "clip")) if getattr(cfg, name) is not None}
    return spec.replace(**fixed) if fixed else spec


def lr_table(rung: Rung, cfg: TrainConfig) -> np.ndarray:
    """Peak LR x schedule for every step (0-based), with the lr-spike fault applied: the one LR
    table (:mod:`ladder.lrtable`, which the curve laws rebuild from config.json), in float32."""
    spike = fault_step(rung, cfg) if cfg.fault == LR_SPIKE else None
    return base_lr_table(rung.schedule, rung.steps, rung.peak_lr, spike_at=spike,
                         spike_scale=cfg.fault_scale).astype(np.float32)


def fault_step(rung: Rung, cfg: TrainConfig) -> int:
    """First (0-based) step affected by the configured fault."""
    return spike_step(rung.steps, cfg.fault_at)


def checkpoint_steps(rung: Rung, cfg: TrainConfig) -> set[int]:
    """Steps after which a checkpoint is saved (always the last). By default every quarter of
    the run: an Orbax save costs ~0.2-0.7 s here, a lot next to a CPU rung's 10-60 s."""
    if cfg.checkpoint_every:
        return set(range(cfg.checkpoint_every, rung.steps + 1, cfg.checkpoint_every)) \
            | {rung.steps}
    return {max(1, round(rung.steps * q / 4)) for q in (1, 2, 3, 4)}


# ------------------------------------------------------------------------------ environment


def enable_compilation_cache() -> str | None:
    """Persist compiled XLA programs across processes (a rung's step compiles in 5-20 s on 2 busy
    CPU cores, measured here, and a re-run, a resume or a test re-uses them). Directory:
    $LADDER_JAX_CACHE (``0`` disables), else ~/.cache/ladder/jax. An already configured JAX
    cache is left alone."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = os.environ.get("LADDER_JAX_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "ladder", "jax"))
    if not path or path == "0":
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path


@lru_cache(maxsize=1)
def measure_peak_flops(n: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of an n x n float32 matmul on the default device (best of ``repeats``)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def peak_flops_info(per_device: float | None, devices: int) -> dict:
    """The peak FLOP/s that MFU divides by, and where it came from.

    MFU = model FLOPs per second (flops-v1, LM head included) / (devices x one device's nominal
    dense bf16 peak, :data:`ladder.accelerators.ACCELERATORS`) on GPUs/TPUs. ``per_device`` (the
    ``peak_flops`` setting, ``--peak-flops``) overrides the table. On CPU the peak is measured
    (a float32 matmul) and NOT multiplied by the device count: fake host devices share the same
    cores, so the host's matmul rate is the whole mesh's peak.
    """
    import jax

    from ladder.accelerators import accelerator_peak

    dev = jax.devices()[0]
    kind = dev.device_kind
    if per_device:
        return {"flops_per_s": float(per_device), "devices": devices,
                "total_flops_per_s": float(per_device) * devices, "device_kind": kind,
                "source": "config (peak_flops, per device)"}
    if dev.platform != "cpu":
        entry = accelerator_peak(kind)
        if entry is not None:
            return {"flops_per_s": entry["flops"], "devices": devices,
                    "total_flops_per_s": entry["flops"] * devices, "device_kind": kind,
                    "source": f"{entry['name']} bf16 dense, {entry['source']}"}
    rate = measure_peak_flops()
    return {"flops_per_s": rate, "devices": devices, "device_kind": kind,
            "total_flops_per_s": rate if dev.platform == "cpu" else rate * devices,
            "source": "measured: 2048x2048 f32 matmul on the host (all devices share it)"
            if dev.platform == "cpu" else
            f"measured: 2048x2048 f32 matmul x {devices} devices ({kind!r} is not in "
            f"ladder.accelerators.ACCELERATORS; pass --peak-flops)"}


def microbatch_size(rung: Rung, cfg: TrainConfig) -> int:
    """Sequences per microbatch (the whole batch by default); InputError unless it divides it."""
    mb = cfg.microbatch or rung.batch
    if rung.batch % mb:
        raise InputError(f"must divide the batch ({rung.batch} sequences), got {mb}",
                         field="microbatch", exit_code=EX_USAGE)
    return mb


def git_sha() -> dict:
    root = Path(__file__).resolve().parent.parent
    def git(*a):
        try:
            return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True,
                                  timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    sha = git("rev-parse", "HEAD")
    return {"sha": sha or None, "dirty": bool(git("status", "--porcelain")) if sha else None}


def environment(corpus: Corpus, mesh_info: dict, peak: dict) -> dict:
    import importlib.metadata as md

    import jax
    versions = {}
    for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "wandb", "tqdm"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    devs = jax.devices()
    return {
        "schema": ENV_SCHEMA, "ladder_version": __version__, "git": git_sha(),
        "python": platform.python_version(), "platform": platform.platform(),
        "hostname": socket.gethostname(), "versions": versions,
        "devices": {"backend": jax.default_backend(), "count": len(devs),
                    "kind": devs[0].device_kind, "process_count": jax.process_count()},
        "mesh": mesh_info, "peak_flops": peak, "corpus": corpus.fingerprint,
        "started": time.time(),
    }


# ------------------------------------------------------------------------------ the step


BATCH_AXES = ("data", "expert")   # dense work: the batch is split over every device


def make_mesh(n_devices: int | None, expert_parallel: int | None, n_experts: int, batch: int):
    """A ("data", "expert") mesh. The default expert axis is the largest divisor of the device
    count that divides the number of experts. ``batch`` (the sequences of one microbatch) is split
    over ALL devices (data x expert), so no device holds another's sequences whatever the
    split between the axes: a 1 x 8 mesh no longer means the whole batch on every device."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    n = n_devices or len(devices)
    if n > len(devices):
        raise InputError(f"{n} devices requested, {len(devices)} visible", field="devices",
                         exit_code=EX_USAGE)
    if expert_parallel is None:
        expert_parallel = max(e for e in range(1, n + 1) if n % e == 0 and n_experts % e == 0)
    ep = expert_parallel
    if n % ep or n_experts % ep:
        raise InputError(f"expert axis {ep} must divide both the devices ({n}) and the experts "
                         f"({n_experts})", field="expert_parallel", exit_code=EX_USAGE)
    if batch % n:
        raise InputError(f"the {n} devices must divide the sequences of a microbatch ({batch}): "
                         f"the batch is split over all of them", field="microbatch",
                         exit_code=EX_USAGE)
    return Mesh(np.array(devices[:n]).reshape(n // ep, ep), ("data", "expert"))


def _fsdp_spec(shape: tuple, fixed: dict, mesh):
    """PartitionSpec splitting the largest axis of ``shape`` (not in ``fixed``) that the mesh's
    remaining axes divide over those axes (FSDP-style: GSPMD gathers the weight where it is used
    and reduce-scatters its gradient); ``fixed`` maps axis index -> mesh axis already used."""
    from jax.sharding import PartitionSpec as P

    free = tuple(a for a in BATCH_AXES if a not in fixed.values() and mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in free])) if free else 1
    spec = [fixed.get(i) for i in range(len(shape))]
    if size > 1:
        axes = [i for i in range(len(shape)) if i not in fixed and shape[i] % size == 0]
        if axes:
            spec[max(axes, key=lambda i: shape[i])] = free if len(free) > 1 else free[0]
    return P(*spec)


def _param_shardings(params, groups, mesh, n_experts: int):
    """Routed-expert weights split on their E axis over "expert" (and FSDP-style over "data" on
    another axis); every other weight FSDP-style over all devices (its largest axis the device
    count divides; replicated when none does, e.g. norm scales of odd width). The E axis is
    leading in unrolled layers ([E, L, F]) and second under the scanned groups ([n_groups, E, L,
    F]; model.transformer.expert_axis); a scanned group's stack axis is never split (scan slices
    it)."""
    import jax
    from jax.sharding import NamedSharding

    from model.transformer import expert_axis, stacked_axes

    routed = {id(x) for x in groups["routed_experts"]}

    def stacked(names):  # a scanned group's stack axis: never split
        return {i: None for i in range(stacked_axes(names))}

    def spec(path, x):
        if id(x) in routed:
            names = tuple(k.key for k in path)
            axis = expert_axis(names)
            if x.shape[axis] != n_experts:
                raise ValueError(f"routed expert weight {'/'.join(names)} of shape {x.shape} has "
                                 f"no E axis at {axis}")
            fixed = {**stacked(names), axis: "expert"}
            return NamedSharding(mesh, _fsdp_spec(x.shape, fixed, mesh))
        return NamedSharding(mesh, _fsdp_spec(x.shape, stacked(tuple(k.key for k in path)), mesh))
    return jax.tree_util.tree_map_with_path(spec, params)


def make_optimizer(settings: OptimizerSettings):
    """The rung's optimizer (``adamw`` or ``marin``, ladder/optim.py). The learning rate is
    applied in the step from the step's own input, so the compiled program does not depend on
    the schedule (a resumed, re-aimed or fault-injected run re-uses it)."""
    from ladder import optim

    return optim.make_optimizer(settings)


def state_shardings(model_cfg: ModelConfig, optimizer, mesh) -> dict:
    """Shardings of the train state, from abstract shapes (nothing allocated): parameters and
    their Adam moments as :func:`_param_shardings`, the step and router bias replicated."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import model as M

    params, _ = M.param_shapes(model_cfg)
    pshard = _param_shardings(params, M.param_groups(params), mesh, model_cfg.n_experts)
    repl = NamedSharding(mesh, P())
    opt_state = jax.eval_shape(optimizer.init, params)
    oshard = optax.tree_utils.tree_map_params(
        optimizer, lambda _, s: s, opt_state, pshard, transform_non_params=lambda _: repl)
    return {"step": repl, "params": pshard, "opt_state": oshard, "router_bias": repl}


def batch_sharding(mesh):
    """Sequences split over every device of the mesh (data x expert)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(BATCH_AXES))


@dataclass
class Programs:
    """The jitted programs of one (model, optimizer, mesh, microbatches); cached per process, so
    a resumed or repeated run in the same process does not trace the model again."""

    model_cfg: ModelConfig
    optimizer: object
    shardings: dict
    train_step: Callable     # jitted train_step(state, batch) -> (state, metrics), state donated
    eval_step: Callable      # jitted eval_step(params, router_bias, batch) -> dict
    init_opt: Callable       # jitted optimizer.init with the opt_state shardings
    _compiled: dict = field(default_factory=dict)

    def init_state(self, seed: int) -> dict:
        """Fresh train state placed on the mesh: step, params, opt_state, router_bias."""
        import jax
        import jax.numpy as jnp

        import model as M

        params, router_bias = M.init(self.model_cfg, seed)
        params = jax.device_put(params, self.shardings["params"])
        return {"step": jax.device_put(jnp.zeros((), jnp.int32), self.shardings["step"]),
                "params": params, "opt_state": self.init_opt(params),
                "router_bias": jax.device_put(jnp.asarray(router_bias, jnp.float32),
                                              self.shardings["router_bias"])}

    def abstract_state(self) -> dict:
        """The train state as ShapeDtypeStructs with their shardings (nothing allocated)."""
        import jax
        import jax.numpy as jnp

        import model as M

        params, bias = M.param_shapes(self.model_cfg)
        shapes = {"step": jax.ShapeDtypeStruct((), jnp.int32), "params": params,
                  "opt_state": jax.eval_shape(self.optimizer.init, params),
                  "router_bias": bias}
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            shapes, self.shardings)

    def compiled_step(self, state, batch):
        """The train step compiled ahead of time for these shapes (so a step's measured time
        never includes compilation)."""
        key = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
        if key not in self._compiled:
            self._compiled[key] = self.train_step.lower(state, batch).compile()
        return self._compiled[key]


def programs(model_cfg: ModelConfig, cfg: TrainConfig, mesh,
             optimizer: OptimizerSettings | None = None, microbatches: int = 1) -> Programs:
    """The programs for ``model_cfg`` on ``mesh``, the step's batch split into ``microbatches``.
    ``optimizer``: the rung's resolved settings (``Rung.optimizer_settings``); None = AdamW with
    ``cfg``'s numbers (its LR enters per step, so no rung is needed)."""
    if optimizer is None:
        from ladder.optim import OptimizerSpec
        spec = optimizer_spec(cfg, OptimizerSpec())
        if spec.kind != "adamw":
            raise ValueError("optimizer: marin needs the rung's settings (Rung.optimizer_settings)")
        optimizer = spec.settings(1.0, 1, 1)
    return _programs(model_cfg, optimizer, mesh, microbatches)


@lru_cache(maxsize=4)
def _programs(model_cfg: ModelConfig, settings: OptimizerSettings, mesh,
              microbatches: int) -> Programs:
    import jax

    optimizer = make_optimizer(settings)
    shard = state_shardings(model_cfg, optimizer, mesh)
    return Programs(model_cfg, optimizer, shard,
                    make_train_step(model_cfg, optimizer, shard, mesh, microbatches),
                    make_eval_step(model_cfg, mesh),
                    jax.jit(optimizer.init, out_shardings=shard["opt_state"]))


def init_state(model_cfg: ModelConfig, cfg: TrainConfig, mesh) -> dict:
    """Fresh train state for ``model_cfg`` on ``mesh`` (see Programs.init_state)."""
    return programs(model_cfg, cfg, mesh).init_state(cfg.seed)


# Statistics of a microbatch that are means over its tokens (equal-sized microbatches: the step's
# value is their mean, exactly) and those that are sums.
_MEAN_STATS = ("ce", "z_loss", "moe/drop_frac", "moe/router_entropy", "moe/router_z_loss",
               "moe/balance_loss")
_SUM_STATS = ("moe/load",)


def accumulate(model_cfg: ModelConfig, objective, params, tokens, targets, microbatches: int,
               param_shardings=None, mesh=None, segment_ids=None):
    """Loss, stats and gradients of the mean loss over ``tokens`` [B, S], computed in
    ``microbatches`` equal parts under ``jax.lax.scan`` (gradients summed in float32).
    ``segment_ids`` [B, S] (documents packed in a sequence, or None) are split like the tokens.

    Microbatch j holds sequences j, j + M, j + 2M, ... (a reshape that keeps every device's
    sequences on that device). Means over tokens are averaged, counts summed, and the
    balancing rule's statistic merged by the rule's own function (model.moe.merge_bias_stat), so
    the bias target is that of the whole step. The Switch balance loss, logged only, is the mean
    of the microbatches' (it is not linear in their loads).
    ``objective(params, tokens, targets, segment_ids) -> (loss, stats)``."""
    import jax
    import jax.numpy as jnp

    from model.moe import bias_target_from_stat, empty_bias_stat, merge_bias_stat

    grad_fn = jax.value_and_grad(objective, has_aux=True)
    if microbatches == 1:
        return grad_fn(params, tokens, targets, segment_ids)
    B, S = tokens.shape
    M = microbatches

    def split(x):   # [B, S] -> [M, B/M, S]; row i*M + j -> microbatch j
        x = jnp.swapaxes(x.reshape(B // M, M, S), 0, 1)
        if mesh is not None:
            from jax.sharding import NamedSharding
            from jax.sharding import PartitionSpec as P
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, BATCH_AXES)))
        return x

    shapes = jax.eval_shape(objective, params, tokens[: B // M], targets[: B // M],
                            None if segment_ids is None else segment_ids[: B // M])[1]
    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if param_shardings is not None:
        zero_grads = jax.lax.with_sharding_constraint(zero_grads, param_shardings)
    def split_experts(stat):
        # the balancing statistic [layers, E, n] stays split over "expert" on its E axis
        if mesh is None:
            return stat
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        return jax.lax.with_sharding_constraint(stat, NamedSharding(mesh, P(None, "expert")))

    def merge(stat, new):
        # each device merges its own experts' rows: GSPMD does not partition top_k and gathered
        # the whole [layers, E, 2n] operand on every device (measured with `ladder plan
        # --compile`: +3.6 GB per layer for 27.7B-A1.2B on 64 devices, n = 961K)
        if mesh is None or mesh.size == 1:
            return merge_bias_stat(model_cfg, stat, new)
        from jax.sharding import PartitionSpec as P
        spec = P(None, "expert")
        return jax.shard_map(lambda a, b: merge_bias_stat(model_cfg, a, b), mesh=mesh,
                             in_specs=(spec, spec), out_specs=spec, check_vma=False)(stat, new)

    carry = (zero_grads, jnp.zeros((), jnp.float32),
             {k: jnp.zeros(shapes[k].shape, jnp.float32) for k in _MEAN_STATS + _SUM_STATS},
             split_experts(empty_bias_stat(model_cfg, shapes["moe/bias_stat"].shape)))

    def body(carry, mb):
        grads, loss_sum, sums, stat = carry
        (loss, st), g = grad_fn(params, *mb)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        sums = {k: sums[k] + st[k] for k in sums}
        stat = merge(stat, split_experts(st["moe/bias_stat"]))
        return (grads, loss_sum + loss, sums, stat), None

    xs = (split(tokens), split(targets), None if segment_ids is None else split(segment_ids))
    (grads, loss_sum, sums, stat), _ = jax.lax.scan(body, carry, xs)
    grads = jax.tree.map(lambda g: g / M, grads)
    stats = {k: sums[k] / M for k in _MEAN_STATS}
    load = sums["moe/load"]                                                    # [L, E]
    stats.update({"moe/load": load, "moe/bias_stat": stat,
                  "moe/bias_target": bias_target_from_stat(model_cfg, stat),
                  "moe/load_max_over_mean": jnp.max(jnp.max(load, axis=-1)
                                                    / jnp.mean(load, axis=-1))})
    return (loss_sum / M, stats), grads


def make_train_step(model_cfg: ModelConfig, optimizer, state_shardings, mesh=None,
                    microbatches: int = 1):
    """The jitted ``train_step(state, batch) -> (state, metrics)``; the state is donated.

    ``batch`` is the step's input: ``tokens`` and ``targets`` [B, S] (split over every device)
    and ``lr``, this step's learning rate (a scalar from the schedule table). The step runs
    under ``mesh`` (the MoE layers read it from the context and go expert-parallel), in
    ``microbatches`` parts (:func:`accumulate`); the balancing rule sees the whole step."""
    import contextlib

    import jax
    import jax.numpy as jnp
    import optax

    import model as M
    from model.moe import step_tokens

    def in_mesh():
        return (jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None
                else contextlib.nullcontext())

    def train_step(state, batch):
        params, rb = state["params"], state["router_bias"]

        def objective(p, tokens, targets, segment_ids):
            return M.loss_fn(model_cfg, p, rb, tokens, targets, segment_ids=segment_ids)

        with in_mesh(), step_tokens(batch["tokens"].size):
            (loss, stats), grads = accumulate(model_cfg, objective, params, batch["tokens"],
                                              batch["targets"], microbatches,
                                              state_shardings["params"], mesh,
                                              batch.get("segment_ids"))
        updates, opt_state = optimizer.update(grads, state["opt_state"], params, lr=batch["lr"])
        params = optax.apply_updates(params, jax.tree.map(lambda u: -batch["lr"] * u, updates))
        new_rb = M.update_router_bias(model_cfg, rb, stats)
        metrics = {"train/loss": loss, "train/ce": stats["ce"], "train/z_loss": stats["z_loss"],
                   "grad/norm": optax.global_norm(grads), "optim/lr": batch["lr"]}
        metrics.update({k: v for k, v in stats.items() if k.startswith("moe/") and v.ndim == 0})
        for group, leaves in M.param_groups(params).items():
            metrics[f"params/norm/{group}"] = jnp.sqrt(sum(jnp.sum(jnp.square(x))
                                                           for x in leaves))
        metrics["params/norm/router_bias"] = jnp.sqrt(jnp.sum(jnp.square(new_rb)))
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state,
                     "router_bias": new_rb}
        return new_state, metrics

    return jax.jit(train_step, donate_argnums=0, out_shardings=(state_shardings, None))


def make_eval_step(model_cfg: ModelConfig, mesh=None):
    """Held-out CE of one batch as trained (capacity, drops) and dropless (the ragged path);
    the drop fraction. Runs under ``mesh`` like the train step."""
    import contextlib

    import jax

    import model as M

    def eval_step(params, router_bias, batch):
        ctx = (jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None
               else contextlib.nullcontext())
        seg = batch.get("segment_ids")   # packed documents never attend across a boundary
        with ctx:
            _, s = M.loss_fn(model_cfg, params, router_bias, batch["tokens"], batch["targets"],
                             segment_ids=seg)
            _, sd = M.loss_fn(model_cfg, params, router_bias, batch["tokens"], batch["targets"],
                              dropless=True, segment_ids=seg)
        return {"loss": s["ce"], "dropless": sd["ce"], "drop_frac": s["moe/drop_frac"]}

    return jax.jit(eval_step)


# ------------------------------------------------------------------------------ run files


class MetricsFile:
    """metrics.jsonl: one row per logged step, appended and flushed; cut back on resume.
    Only the writing process (process 0 of a multi-host run) changes it; the others read it."""

    def __init__(self, path: Path, writer: bool = True):
        self.path = path
        self.writer = writer
        self._f = None

    def truncate_to(self, step: int) -> None:
        """Keep only complete rows with ``step <= step`` (atomic rewrite); drop the rest."""
        if not self.writer or not self.path.exists():
            return
        rows = [r for _, r in iter_jsonl(self.path)
                if isinstance(r.get("step"), int) and r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def rows(self) -> list[dict]:
        return [r for _, r in iter_jsonl(self.path)] if self.path.exists() else []

    def append(self, row: dict) -> None:
        if not self.writer:
            return
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held open)
        self._f.write(json.dumps(to_jsonable(row), allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class WandbMirror:
    """Mirrors metrics rows to Weights & Biases (WANDB_MODE=offline works without network).

    The run is grouped by the ladder, named by the rung, of job type ``train`` and tagged with
    both (``ladder.wandbrun``); ``step``, ``tokens`` and ``flops`` are logged as metrics so any of
    them can be a panel's x axis. The same W&B run id is reused on resume; its local directory
    (an offline run directory is a `ladder watch` source) is recorded in summary.json.
    """

    PREFIXES = ("train", "eval", "eval_dropless", "optim", "grad", "params", "moe", "throughput")

    def __init__(self, out_dir: Path, rung: Rung, cfg: TrainConfig, run_id: str | None,
                 config: dict):
        import wandb

        from ladder import wandbrun

        entity, project = wandbrun.resolve(cfg.wandb_entity, cfg.wandb_project)
        self.run = wandb.init(entity=entity, project=project, group=rung.ladder, name=rung.name,
                              job_type="train", tags=wandbrun.tags(rung.ladder, rung.name,
                                                                   "train"),
                              dir=str(out_dir), id=run_id, resume="allow", config=config,
                              reinit="finish_previous")
        wandbrun.define_axes(self.run, self.PREFIXES)
        self.info = {"id": self.run.id, "dir": str(Path(self.run.dir).parent),
                     "mode": os.environ.get("WANDB_MODE", "online"), "entity": entity,
                     "project": project, "group": rung.ladder, "name": rung.name,
                     "job_type": "train"}

    def log(self, row: dict) -> None:
        self.run.log(dict(row), step=int(row["step"]))

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


# ------------------------------------------------------------------------------ the run


def train_rung(rung: Rung, out_dir: str | os.PathLike, cfg: TrainConfig | None = None, *,
               max_steps: int | None = None, resume: bool = True,
               on_metrics: Callable[[dict], None] | None = None) -> dict:
    """Train ``rung`` into ``out_dir`` and return its summary (the dict written to summary.json).

    A completed (or diverged) run is not retrained: its summary is returned. An unfinished one
    is resumed from its latest checkpoint when ``resume``, else it is an InputError.
    ``max_steps`` stops after that many steps of the planned schedule (the schedule is not
    shortened; status stays "running").
    ``on_metrics(row)`` sees every metrics row as it is written. Bad input raises InputError
    before anything is written. Divergence returns status "diverged"; Ctrl-C checkpoints and
    returns status "running" with ``"interrupted": True``; so does SIGTERM (a preemption), with
    ``"signal": "SIGTERM"``. Under ``jax.distributed`` every process calls this; process 0 writes
    the run directory and each process feeds its own rows of every batch.
    """
    cfg = cfg or TrainConfig()
    out = Path(out_dir)
    t_start = time.perf_counter()
    timing = {"setup_s": 0.0, "steps_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0}
    if max_steps is not None and max_steps < 1:
        raise InputError(f"must be >= 1, got {max_steps}", field="max_steps", exit_code=EX_USAGE)

    # --- everything that can be bad input is checked before the first file is written -------
    corpus = load_corpus(cfg.data, cfg.vocab_size)
    rung = resolve_rung(rung, cfg, corpus.vocab_size)
    if corpus.vocab_size > rung.model.vocab_size:
        raise InputError(f"the data has token ids up to {corpus.vocab_size - 1}, the model's "
                         f"vocabulary is {rung.model.vocab_size}", field="model.vocab_size",
                         exit_code=EX_USAGE)
    corpus.check_fits(rung.seq_len, ",".join(cfg.data) or "python-stdlib")
    config = {"schema": RUN_CONFIG_SCHEMA, "rung": rung.to_dict(), "train": cfg.to_dict()}
    previous = _previous_run(out, config, resume)
    if previous is not None and previous.get("status") in ("complete", "diverged"):
        return previous  # finished: a diverged run would only diverge again from its checkpoint

    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    enable_compilation_cache()
    microbatch = microbatch_size(rung, cfg)
    eval_batch = cfg.eval_batch or rung.batch
    mesh = make_mesh(cfg.devices, cfg.expert_parallel, rung.model.n_experts, microbatch)
    if eval_batch % mesh.devices.size:
        raise InputError(f"the {mesh.devices.size} devices must divide it ({eval_batch})",
                         field="eval_batch", exit_code=EX_USAGE)
    mesh_info = {"axes": list(mesh.axis_names), "shape": dict(mesh.shape),
                 "devices": int(mesh.devices.size), "microbatch": microbatch,
                 "microbatches": rung.batch // microbatch, "eval_batch": eval_batch}
    config["mesh"] = mesh_info
    peak = peak_flops_info(cfg.peak_flops, int(mesh.devices.size))

    # --- the run directory (process 0 writes it; every process checkpoints its shards) ------
    writer = distributed.is_writer()
    distributed.barrier("ladder-run-checked")  # all read the old run before process 0 rewrites
    write_json = atomic_write_json if writer else (lambda *a, **k: None)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    write_json(out / "env.json", {**environment(corpus, mesh_info, peak),
                                  "processes": distributed.info()})
    ckpt = Checkpoints(out / "checkpoints", cfg.keep, cfg.checkpoint_minutes)
    metrics = MetricsFile(out / "metrics.jsonl", writer=writer)

    lrs = lr_table(rung, cfg)
    progs = programs(rung.model, cfg, mesh, rung.optimizer_settings, rung.batch // microbatch)
    split = batch_sharding(mesh)
    rows = distributed.local_rows(split, rung.batch)  # this process's rows of a batch
    feed = corpus.train_feed(cfg.seed, rung.batch, rung.seq_len, rows)
    state = progs.init_state(cfg.seed)
    start = ckpt.latest_step()
    if start:
        state = ckpt.restore(start, state, feed.iterator)
        feed.seek(start)
    metrics.truncate_to(start)   # rows past the checkpoint are recomputed, identically
    if not start and writer and metrics.path.exists():
        metrics.path.unlink()
    eval_step = progs.eval_step
    replicated = NamedSharding(mesh, P())

    def to_global(b: dict, n: int):  # this process's rows of an n-row batch -> global arrays
        return {k: distributed.global_array(split, v, (n, *v.shape[1:])) for k, v in b.items()}

    eval_rows = distributed.local_rows(split, eval_batch)
    eval_set = [to_global({k: v[eval_rows] for k, v in b.items()}, eval_batch)
                for b in corpus.eval_batches(-(-cfg.eval_sequences // eval_batch), eval_batch,
                                             rung.seq_len)]

    def get_batch(i: int):  # input of step i (0-based): this process's rows of batch i
        b = feed.batch(i)
        if cfg.fault == "data-swap" and i >= fault_step(rung, cfg):
            b = shuffle_bytes(b, cfg.seed, i)
        if cfg.fault == "loss-drift" and i >= fault_step(rung, cfg):
            start = fault_step(rung, cfg)  # noise share grows linearly to drift_max at the end
            share = cfg.drift_max * (i - start + 1) / max(1, rung.steps - start)
            b = corrupt_bytes(b, share, rung.model.vocab_size, cfg.seed, i)
        return {**to_global(b, rung.batch),
                "lr": distributed.global_array(replicated, lrs[i], ())}

    def evaluate(params, router_bias) -> dict:
        parts = [jax.device_get(eval_step(params, router_bias, b)) for b in eval_set]
        loss = float(np.mean([p["loss"] for p in parts]))
        dropless = float(np.mean([p["dropless"] for p in parts]))
        row = {"eval/loss": loss, "eval_dropless/loss": dropless,
               "eval/drop_frac": float(np.mean([p["drop_frac"] for p in parts]))}
        if corpus.bytes_per_token:  # bits per byte of the dropless loss (the fitted metric)
            row["eval/bpb"] = dropless / math.log(2) / corpus.bytes_per_token
        return row

    wb = None
    wandb_info = (previous or {}).get("wandb")
    if cfg.wandb and writer:
        wb = WandbMirror(out, rung, cfg, (wandb_info or {}).get("id"), config)
        wandb_info = wb.info
    summary = _summary(rung, "running", start, cfg, peak, wandb_info)
    write_json(out / "summary.json", summary)

    stop = min(rung.steps, max_steps or rung.steps)
    evals = set(rung.eval_steps())
    saves = checkpoint_steps(rung, cfg)
    train_flops_per_token = rung.flops.training(1, lm_head=True)  # MFU counts the LM head's work
    interrupted = _StopFlag()
    batch = get_batch(start) if start < stop else None
    if batch is not None:  # compile before the clock starts, so tokens/s is the step's own
        train_step = progs.compiled_step(state, batch)
    from tqdm.auto import tqdm
    bar = tqdm(total=rung.steps, initial=start, desc=f"{rung.ladder}/{rung.name}", unit="step",
               disable=not (cfg.progress and writer), mininterval=0.5, dynamic_ncols=True,
               leave=False)
    status, last_saved, final, stopped = "running", start, {}, False
    tick = time.perf_counter()
    timing["setup_s"] = tick - t_start  # data, tracing and compiling: this session's overhead
    try:
        with interrupted:
            for i in range(start, stop):                 # ONE visible loop over steps
                step = i + 1
                state, m = train_step(state, batch)
                if step < stop:
                    batch = get_batch(step)             # next batch, built while this one runs
                m = {k: float(v) for k, v in jax.device_get(m).items()}
                now = time.perf_counter()
                dt, tick = now - tick, now
                timing["steps_s"] += dt
                row = {"step": step, "tokens": step * rung.tokens_per_step,
                       "progress": step / rung.steps, "time": time.time(), **m,
                       "throughput/tokens_per_s": rung.tokens_per_step / dt,
                       "throughput/mfu": rung.tokens_per_step / dt * train_flops_per_token
                       / peak["total_flops_per_s"],
                       "flops": rung.compute(step * rung.tokens_per_step)}
                diverged = not math.isfinite(m["train/loss"])
                if step in evals and not diverged:
                    t_eval = time.perf_counter()
                    row.update(evaluate(state["params"], state["router_bias"]))
                    timing["eval_s"] += time.perf_counter() - t_eval
                if step % cfg.log_every == 0 or step in evals or step == stop or diverged:
                    metrics.append(row)
                    if wb:
                        wb.log(row)
                    if on_metrics:
                        on_metrics(row)
                bar.update(1)
                bar.set_postfix(loss=f"{m['train/loss']:.3f}",
                                tok_s=f"{row['throughput/tokens_per_s']:.0f}", refresh=False)
                if diverged:
                    status = "diverged"
                    final = {"train/loss": m["train/loss"], "diverged_at_step": step}
                    break
                # a signal or the rolling clock, agreed by all processes (the save is collective)
                stopping, due = distributed.agree(interrupted.set, ckpt.due())
                if step in saves or step == stop or stopping or due:
                    t_save = time.perf_counter()
                    ckpt.save(step, state, feed.state_for(step),
                              rolling=step not in saves and step != stop)
                    timing["checkpoint_s"] += time.perf_counter() - t_save
                    last_saved = step
                    write_json(out / "summary.json",
                               _summary(rung, "running", step, cfg, peak, wandb_info))
                if stopping:
                    stopped = True
                    break
                tick = time.perf_counter()              # evals and saves are not step time
            else:
                if stop == rung.steps:
                    status = "complete"
    except BaseException:
        bar.close()
        metrics.close()
        write_json(out / "summary.json", {
            **_summary(rung, "failed", last_saved, cfg, peak, wandb_info),
            "error": "training raised an exception; see the log"})
        if wb:
            wb.finish(exit_code=1)
        raise
    finally:
        ckpt.close()
    bar.close()
    metrics.close()
    step_done = last_saved if status != "diverged" else final["diverged_at_step"]
    if status == "complete":
        distributed.barrier("ladder-metrics-written")  # process 0 has written every row
        evals_seen = [r for r in metrics.rows() if "eval_dropless/loss" in r]
        final = {k: v for k, v in evals_seen[-1].items() if k.startswith(("eval", "train/"))} \
            if evals_seen else {}
    summary = _summary(rung, status, step_done, cfg, peak, wandb_info, final=final)
    summary["timing"] = {k: round(v, 3) for k, v in timing.items()}  # this session's wall time
    if stopped:  # by a signal here, or in another process of this run ("peer")
        summary["interrupted"] = True
        summary["signal"] = interrupted.signal_name or "peer"
    write_json(out / "summary.json", summary)
    if wb:
        wb.finish(exit_code=0 if status in ("complete", "running") else 1)
    return summary


def _summary(rung: Rung, status: str, step: int, cfg: TrainConfig, peak: dict,
             wandb_info: dict | None, final: dict | None = None) -> dict:
    p, pe = rung.params, rung.params_exact
    tokens_seen = step * rung.tokens_per_step
    s = {"schema": SUMMARY_SCHEMA, "status": status, "step": step, "steps": rung.steps,
         "ladder": rung.ladder, "rung": rung.name, "is_target": rung.is_target,
         "params": p.total, "active_params": p.active, "param_convention": p.convention,
         "params_exact": pe.total, "active_params_exact": pe.active,
         "tokens": rung.tokens, "tokens_seen": tokens_seen,
         "compute": rung.compute(lm_head=False), "compute_with_lm_head": rung.compute(lm_head=True),
         "compute_seen": rung.compute(tokens_seen), "peak_lr": rung.peak_lr,
         "seq_len": rung.seq_len, "batch": rung.batch, "seed": cfg.seed,
         "conventions": conventions(), "peak_flops": peak, "final": final or {},
         "updated": time.time()}
    if cfg.fault:
        s["fault"] = {"kind": cfg.fault, "from_step": fault_step(rung, cfg) + 1,
                      "scale": cfg.fault_scale if cfg.fault == "lr-spike" else None}
    if wandb_info:
        s["wandb"] = wandb_info
    return s


def _previous_run(out: Path, config: dict, resume: bool) -> dict | None:
    """The summary of an earlier run in ``out`` (None if there is none); InputError when it is
    a different run, or an unfinished one and ``resume`` is off."""
    if not (out / "summary.json").exists() and not (out / "checkpoints").exists():
        return None
    summary = read_json(out / "summary.json", schema="run-summary") \
        if (out / "summary.json").exists() else {"status": "running"}
    if (out / "config.json").exists():
        old = read_json(out / "config.json", schema="run-config")
        if old.get("rung") != json.loads(json.dumps(to_jsonable(config["rung"]))):
            raise InputError("the run directory holds a different rung; use another --out",
                             path=out / "config.json", field="rung", exit_code=EX_USAGE)
        old_train = old.get("train", {})
        for key, value in json.loads(json.dumps(to_jsonable(config["train"]))).items():
            if key not in TrainConfig.RUN_ARGUMENTS and old_train.get(key) != value:
                raise InputError(f"differs from the run in this directory ({old_train.get(key)!r}"
                                 f" there, {value!r} now); use another --out",
                                 path=out / "config.json", field=f"train.{key}",
                                 exit_code=EX_USAGE)
    if summary.get("status") in ("complete", "diverged"):
        return summary
    if not resume:
        raise InputError(f"holds an unfinished run (status {summary.get('status')!r}); pass "
                         f"--resume to continue it or remove the directory", path=out,
                         exit_code=EX_USAGE)
    return summary


class _StopFlag:
    """Ctrl-C (SIGINT) or a preemption (SIGTERM) sets a flag that the loop checks after each step
    (checkpoint, then exit) instead of raising inside a step, whose donated input state would
    then be lost. A second signal of either kind gives up at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.set = False
        self.signal_name: str | None = None
        self._old: dict = {}

    def _handler(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave the signals alone
                break
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}
        return False
