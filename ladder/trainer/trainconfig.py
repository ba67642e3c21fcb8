"""How to train a rung (plain Python, no JAX import). ``TrainConfig`` holds what changes a
run's numbers (seed, eval set, microbatching, model and data overrides) and three parts:
``optim`` (:class:`OptimizerOverrides`; None everywhere = the ladder's rules), ``run``
(:class:`RunArgs`: where and how a run executes and is watched, never its numbers, so a resume
may change them) and ``fault`` (:class:`Fault` or None: injected for demos and watcher tests).

On disk (config.json's ``"train"``, ``--config`` files, ``--key=value`` overrides) the config is
ONE flat object of the names below (``lr``, ``devices``, ``fault``, ``fault_at``, ...), the same
names the command line takes; :func:`train_config` builds the parts from it and
:meth:`TrainConfig.to_dict` writes it back.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from ladder.io import EX_USAGE, InputError
from ladder.lrtable import LR_SPIKE, SPIKE_AT, SPIKE_SCALE, spike_step
from ladder.model.config import ModelConfig
from ladder.optspec import OPTIMIZERS
from ladder.specs import Rung, Schedule

FAULTS = (LR_SPIKE, "data-swap", "loss-drift")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    """A finite real number (not a bool): NaN and infinity pass no range check here."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# Upper ends of the settings' ranges (issue 26: what a run can be on any machine; the model's
# and a ladder file's are in ladder/model/config.py and ladder/specs.py::LIMITS).
_MAX_COUNT = 2 ** 40     # steps between checkpoints/logs, sequences, devices
_MAX_SEQS = 2 ** 24      # sequences of a batch or an eval set
MIN_EVAL_EVERY = 1e-4    # ladder/specs.py::MIN_EVAL_EVERY: at most 10,000 evals a run


def _check(obj, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name}: must be {what}, got {getattr(obj, name)!r}")


def _check_fields(obj, rules) -> None:
    """:func:`_check` of every field named in each ``(names, ok(value), what)`` of ``rules``,
    in order."""
    for names, ok, what in rules:
        for name in names.split():
            _check(obj, name, ok(getattr(obj, name)), what)


def _optional(ok):
    return lambda v: v is None or ok(v)


@dataclass(frozen=True)
class OptimizerOverrides:
    """What a run changes of the rung's optimizer and LR rule; None = the ladder's rule (adamw:
    b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1 on matrices, clip 1.0; marin: the recipe's
    rules, ladder/trainer/optim.py)."""

    optimizer: str | None = None     # adamw | marin; None = the ladder's
    b1: float | None = None
    b2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None   # global-norm clipping; 0 disables
    lr: float | None = None          # peak LR; None = the ladder's LR rule
    schedule: dict = field(default_factory=dict)  # Schedule field overrides (decay_end: re-aim)
    muon_momentum: float | None = None  # marin: MuonH's momentum (the recipe's 0.95)
    nesterov: bool | None = None     # marin: Nesterov momentum for MuonH (the recipe's: true)

    def __post_init__(self):
        _check_fields(self, (
            ("optimizer", _optional(lambda v: v in OPTIMIZERS), f"null or one of {OPTIMIZERS}"),
            ("b1 b2 muon_momentum", _optional(lambda v: _is_num(v) and 0 <= v < 1),
             "null or a number in [0, 1)"),
            ("nesterov", _optional(lambda v: isinstance(v, bool)), "null, true or false"),
            ("eps weight_decay grad_clip", _optional(lambda v: _is_num(v) and 0 <= v <= 1e6),
             "null or a number in [0, 1e6]"),
            ("lr", _optional(lambda v: _is_num(v) and 0 < v <= 1e3),
             "null or a number in (0, 1e3]"),
            ("schedule", lambda v: isinstance(v, dict), "an object of schedule fields")))

    def apply(self, spec):
        """The rung's optimizer rule (an ``OptimizerSpec``) with this kind and fixed numbers."""
        if self.optimizer is not None:
            spec = spec.replace(kind=self.optimizer)
        fixed = {key: getattr(self, name) for name, key in (
            ("b1", "beta1"), ("b2", "beta2"), ("eps", "eps"), ("weight_decay", "weight_decay"),
            ("grad_clip", "clip"), ("muon_momentum", "muon_momentum"),
            ("nesterov", "nesterov")) if getattr(self, name) is not None}
        return spec.replace(**fixed) if fixed else spec


CHECKPOINT_SCHEMES = ("", "file", "gs", "s3")   # "": a local path


def checkpoint_scheme(location: str) -> str:
    """The URL scheme of a checkpoint location ("" for a plain path)."""
    head, sep, _ = location.partition("://")
    return head.lower() if sep and head.isalnum() else ""


def profile_range(text) -> tuple[int, int] | None:
    """``"A:B"`` -> (A, B) when 1 <= A <= B, else None."""
    if not isinstance(text, str):
        return None
    a, sep, b = text.partition(":")
    if not sep or not a.strip().isdigit() or not b.strip().isdigit():
        return None
    a, b = int(a), int(b)
    return (a, b) if 1 <= a <= b else None


@dataclass(frozen=True)
class RunArgs:
    """Where and how a run executes and is watched: never its numbers, so these may differ when
    a run is resumed (the identity check ignores them)."""

    devices: int | None = None       # devices in the mesh; None = all visible devices
    expert_parallel: int | None = None  # size of the "expert" mesh axis; None = largest that fits
    peak_flops: float | None = None  # FLOP/s of ONE device for throughput/mfu (None: table)
    checkpoint_every: int = 0        # steps between checkpoints; 0 = every 25% of the run
    checkpoint_minutes: float | None = None  # also a rolling checkpoint this often (wall clock)
    keep: int = 2                    # permanent checkpoints kept
    checkpoint_dir: str | None = None  # None: <run dir>/checkpoints (train.checkpoint_root)
    checkpoint_async: bool = True    # write in the background (checkpointing.py)
    profile_steps: str | None = None  # "A:B": a jax.profiler trace of steps A..B (train._Profile)
    log_every: int = 1               # steps between metrics rows (the loss is checked every step)
    wandb: bool = False
    wandb_project: str | None = None  # None: WANDB_PROJECT, else "ladder" (ladder.wandbrun)
    wandb_entity: str | None = None   # None: WANDB_ENTITY, else W&B's default entity
    progress: bool = True            # tqdm bar on stderr (only ever drawn on a terminal)

    def __post_init__(self):
        _check_fields(self, (
            ("devices expert_parallel", _optional(lambda v: _is_int(v) and 1 <= v <= 2 ** 24),
             "null or an integer in [1, 2**24]"),
            ("checkpoint_every", lambda v: _is_int(v) and 0 <= v <= _MAX_COUNT,
             "an integer in [0, 2**40]"),
            ("keep log_every", lambda v: _is_int(v) and 1 <= v <= _MAX_COUNT,
             "an integer in [1, 2**40]"),
            # 1e20 FLOP/s: ~50,000x a GB200 GPU's dense bf16 peak (ladder/accelerators.py)
            ("peak_flops", _optional(lambda v: _is_num(v) and 0 < v <= 1e20),
             "null or a number in (0, 1e20]"),
            ("checkpoint_minutes", _optional(lambda v: _is_num(v) and 0 < v <= 1e6),
             "null or a number in (0, 1e6]"),
            ("wandb progress checkpoint_async", lambda v: isinstance(v, bool), "true or false"),
            ("checkpoint_dir", _optional(lambda v: isinstance(v, str) and v.strip() != ""
                                         and checkpoint_scheme(v) in CHECKPOINT_SCHEMES),
             "null, a folder, or a file://, gs:// or s3:// URL"),
            ("profile_steps", _optional(lambda v: profile_range(v) is not None),
             "null or 'A:B' with 1 <= A <= B (steps, inclusive)"),
            ("wandb_project wandb_entity", _optional(lambda v: isinstance(v, str) and v != ""),
             "null or a non-empty string")))


@dataclass(frozen=True)
class Fault:
    """A fault injected from ``at`` (a fraction of the planned steps) on, for demos and watcher
    tests: ``lr-spike`` multiplies the LR by ``scale``; ``data-swap`` shuffles each batch's bytes;
    ``loss-drift`` replaces a share of tokens by random ones, growing linearly to ``drift_max``
    at the end of the run."""

    kind: str
    at: float = SPIKE_AT
    scale: float = SPIKE_SCALE
    drift_max: float = 0.3

    def __post_init__(self):
        _check_fields(self, (
            ("kind", lambda v: v in FAULTS, f"one of {FAULTS}"),
            ("at", lambda v: _is_num(v) and 0 <= v < 1, "in [0, 1)"),
            ("scale", lambda v: _is_num(v) and 0 < v <= 1e6, "in (0, 1e6]"),
            ("drift_max", lambda v: _is_num(v) and 0 < v <= 1, "in (0, 1]")))

    def first_step(self, steps: int) -> int:
        """First (0-based) step of a ``steps``-step run that the fault affects."""
        return spike_step(steps, self.at)


@dataclass(frozen=True)
class TrainConfig:
    """How to train a rung (the rung itself says what to train): the settings that change a
    run's numbers, and its optimizer overrides, run arguments and fault (see the module doc)."""

    seed: int = 0
    eval_sequences: int | None = None  # held-out windows per eval; None = the rung's
    eval_every: float | None = None  # fraction of the run between evals; None = the rung's (5%)
    microbatch: int | None = None    # sequences per microbatch; None = the whole batch
    eval_batch: int | None = None    # sequences per eval call (eval_batch_size)
    model: dict = field(default_factory=dict)  # ModelConfig field overrides (ablations)
    data: tuple[str, ...] = ()       # text files/globs or one token array; () = Python stdlib
    vocab_size: int | None = None    # for raw .bin token files (and a check for .npy)
    # training batches from other data than ``data``'s training split; the evals stay on
    # ``data``'s held-out split, one yardstick for two mixtures (issue 27). None = ``data``
    # (not (): a config.json that lacks these keys must still resume)
    train_data: tuple[str, ...] | None = None
    switch_data: tuple[str, ...] | None = None  # from switch_at on, training batches from these
    switch_at: float | None = None   # fraction of the planned steps where the data switches
    optim: OptimizerOverrides = field(default_factory=OptimizerOverrides)
    run: RunArgs = field(default_factory=RunArgs)
    fault: Fault | None = None

    def __post_init__(self):
        for name in ("data", "train_data", "switch_data"):   # a path or a list: a tuple
            v = getattr(self, name)
            if isinstance(v, (list, str)):
                object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v))
        _check_fields(self, (
            ("seed", lambda v: _is_int(v) and 0 <= v < 2 ** 63, "an integer in [0, 2**63)"),
            ("vocab_size microbatch eval_batch eval_sequences",
             _optional(lambda v: _is_int(v) and 1 <= v <= _MAX_SEQS),
             "null or an integer in [1, 2**24]"),
            ("eval_every", _optional(lambda v: _is_num(v) and MIN_EVAL_EVERY <= v <= 1),
             f"null or in [{MIN_EVAL_EVERY:g}, 1]"),
            ("model", lambda v: isinstance(v, dict), "an object of model config fields"),
            ("data", lambda v: all(isinstance(p, str) for p in v), "a list of paths"),
            ("train_data switch_data",
             _optional(lambda v: len(v) > 0 and all(isinstance(p, str) for p in v)),
             "null or a non-empty list of paths"),
            ("switch_at", _optional(lambda v: _is_num(v) and 0 < v < 1), "null or in (0, 1)")))
        _check(self, "switch_at", (self.switch_at is None) == (self.switch_data is None),
               "given with switch_data (and only with it)")

    def to_dict(self) -> dict:
        """The flat object of config.json's ``"train"`` (see :data:`FLAT_KEYS`)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("optim", "run", "fault")}
        d["data"] = list(self.data)
        for name in ("train_data", "switch_data"):
            d[name] = None if getattr(self, name) is None else list(getattr(self, name))
        d.update(dataclasses.asdict(self.optim))
        d.update(dataclasses.asdict(self.run))
        fault = self.fault or Fault(FAULTS[0])
        d.update({"fault": self.fault.kind if self.fault else None, "fault_at": fault.at,
                  "fault_scale": fault.scale, "drift_max": fault.drift_max})
        return d


RUN_ARGUMENTS = tuple(f.name for f in dataclasses.fields(RunArgs))
# flat key -> (part, field) for the keys that live in a part; the rest are TrainConfig's own
FLAT_KEYS = {**{f.name: ("optim", f.name) for f in dataclasses.fields(OptimizerOverrides)},
             **{name: ("run", name) for name in RUN_ARGUMENTS},
             "fault": ("fault", "kind"), "fault_at": ("fault", "at"),
             "fault_scale": ("fault", "scale"), "drift_max": ("fault", "drift_max")}
_OWN = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in ("optim", "run",
                                                                                "fault"))
KNOWN_KEYS = tuple(sorted((*_OWN, *FLAT_KEYS)))
_PARTS = {"optim": OptimizerOverrides, "run": RunArgs, "fault": Fault}


def train_config(values: dict | None = None, *, where: str = "config") -> TrainConfig:
    """A TrainConfig from the flat object (a --config file and --key=value overrides merged;
    config.json's "train").

    Dotted keys ``model.X`` / ``schedule.X`` set one field of those nested objects. An unknown key
    or a bad value is an InputError naming ``where`` and the field (the flat key).
    """
    flat: dict = {}
    for key, value in (values or {}).items():
        head, _, rest = key.partition(".")
        if head not in KNOWN_KEYS:
            raise InputError(f"unknown training config key (known: {', '.join(KNOWN_KEYS)})",
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
    parts: dict = {name: {} for name in (None, *_PARTS)}   # None: TrainConfig's own keys
    for key, value in flat.items():
        part, name = FLAT_KEYS.get(key, (None, key))
        parts[part][name] = value
    for part, cls in _PARTS.items():
        if part == "fault" and parts[part].get("kind") is None:
            # no fault: its settings (to_dict writes them) are inert, but still checked
            _build(cls, {**parts.pop(part), "kind": FAULTS[0]}, where, part)
        else:
            parts[None][part] = _build(cls, parts.pop(part), where, part)
    return _build(TrainConfig, parts[None], where)


def _build(cls, kw: dict, where: str, part: str | None = None):
    """``cls(**kw)``; its ValueError an InputError naming the flat key (:data:`FLAT_KEYS`)."""
    try:
        return cls(**kw)
    except (ValueError, TypeError) as e:
        name = str(e).split(":")[0] if ":" in str(e) else None
        flat = next((k for k, v in FLAT_KEYS.items() if v == (part, name)), name)
        raise InputError(str(e).split(": ", 1)[-1], path=where, field=flat or None,
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


# ------------------------------------------------------------------------------ the rung as run


def resolve_rung(rung: Rung, cfg: TrainConfig, corpus_vocab: int | None = None) -> Rung:
    """The rung actually trained: model/LR/schedule overrides and the data's vocabulary applied."""
    model_kw = dict(cfg.model)
    if corpus_vocab is not None and corpus_vocab != rung.model.vocab_size:
        model_kw.setdefault("vocab_size", corpus_vocab)
    try:
        model = rung.model.replace(**model_kw) if model_kw else rung.model
    except ValueError as e:
        raise _usage_error(e, "model.") from None
    except TypeError as e:
        raise InputError(str(e), field="model", exit_code=EX_USAGE) from None
    if model.precision == "auto":
        # config.json records what ran: f32 on CPU, bf16 on accelerators
        import jax

        from ladder.model.config import resolve_precision
        model = model.replace(precision=resolve_precision("auto", jax.default_backend()))
    kw = {"model": model}
    if cfg.optim.lr is not None:
        kw["peak_lr"] = float(cfg.optim.lr)
    if cfg.optim.schedule:
        try:
            kw["schedule"] = dataclasses.replace(rung.schedule, **cfg.optim.schedule)
        except ValueError as e:
            raise _usage_error(e) from None
    if cfg.eval_every is not None:
        kw["eval_every"] = float(cfg.eval_every)
    try:
        kw["optimizer"] = cfg.optim.apply(rung.optimizer)
    except ValueError as e:   # e.g. a MuonH setting for an AdamW rung
        raise _usage_error(e) from None
    return rung.replace(**kw)


def _usage_error(e: ValueError, prefix: str = "") -> InputError:
    """A config's ValueError ("field: message") as an InputError naming the field."""
    return InputError(str(e).split(": ", 1)[-1], field=prefix + str(e).split(":")[0],
                      exit_code=EX_USAGE)


def checkpoint_steps(rung: Rung, run: RunArgs) -> set[int]:
    """Steps after which a checkpoint is saved (always the last). By default every quarter of
    the run: an Orbax save costs ~0.2-0.7 s here, a lot next to a CPU rung's 10-60 s."""
    if run.checkpoint_every:
        return set(range(run.checkpoint_every, rung.steps + 1, run.checkpoint_every)) \
            | {rung.steps}
    return {max(1, round(rung.steps * q / 4)) for q in (1, 2, 3, 4)}


def cell_fits(rung: Rung, devices: int, sequences: int) -> bool:
    """A call of ``sequences`` sequences split over ``devices`` gives every device whole
    capacity cells (``model.capacity_tokens``; None: a cell is whatever a call sees)."""
    cell = rung.model.capacity_tokens
    return sequences % devices == 0 and (cell is None
                                         or sequences // devices * rung.seq_len % cell == 0)


def check_cell(rung: Rung, devices: int, sequences: int, field: str) -> None:
    """InputError naming ``field`` (microbatch or eval_batch) and the smallest value whose
    per-device share holds whole capacity cells, when ``sequences`` does not (issue 22 item 2:
    the trained function is the recipe's only while the cell is)."""
    if cell_fits(rung, devices, sequences):
        return
    cell, seq = rung.model.capacity_tokens, rung.seq_len
    if field == "microbatch":
        fits = [m for m in range(1, rung.batch + 1)
                if rung.batch % m == 0 and cell_fits(rung, devices, m)]
        hint = (f"the smallest microbatch that does is {fits[0]}" if fits else
                f"no microbatch of the {rung.batch}-sequence batch does on {devices} devices")
    else:
        hint = f"the smallest {field} that does is {devices * cell // math.gcd(cell, seq)}"
    raise InputError(f"{sequences} sequences over {devices} devices give each "
                     f"{sequences / devices:g} x {seq} tokens, not whole capacity cells of "
                     f"{cell} tokens (model.capacity_tokens); {hint}", field=field,
                     exit_code=EX_USAGE)


def microbatch_size(rung: Rung, cfg: TrainConfig) -> int:
    """Sequences per microbatch (the whole batch by default); InputError unless it divides it."""
    mb = cfg.microbatch or rung.batch
    if rung.batch % mb:
        raise InputError(f"must divide the batch ({rung.batch} sequences), got {mb}",
                         field="microbatch", exit_code=EX_USAGE)
    return mb


def eval_batch_size(cfg: TrainConfig, devices: int, rung: Rung | None = None) -> int:
    """Sequences per eval call: ``cfg.eval_batch``, else the rung's (its ladder's rule), else
    one per device, the smallest batch the mesh splits (the whole batch compiled to ~3 TiB per
    device at 1.6B-A61M, issue 22); with a capacity cell longer than a sequence, the fewest
    per device that hold whole cells (marin-535b: 16 of 4096 tokens), so the as-trained eval
    drops what training would (issue 22 item 2)."""
    per_device = 1
    cell = rung.model.capacity_tokens if rung is not None else None
    if cell is not None:
        per_device = cell // math.gcd(cell, rung.seq_len)
    return cfg.eval_batch or (rung.eval_batch if rung is not None else None) or \
        devices * per_device


def eval_sequences(cfg: TrainConfig, rung: Rung) -> int:
    """Held-out windows per eval: ``cfg.eval_sequences``, else the rung's (its ladder's)."""
    return cfg.eval_sequences or rung.eval_sequences
