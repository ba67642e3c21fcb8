"""Rungs and ladders: frozen dataclasses, each rung a pure function of a few dials and the
ladder's rules. Plain Python (no JAX), so `ladder list`, `fit` and `predict` load it cheaply.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from ladder.counting import FLOP_CONVENTION, SIZING_CONVENTIONS, count_params, flops_per_token
from ladder.io import InputError, loads, read_bytes, safe_name
from ladder.model.config import SWITCH_FIELDS, ModelConfig, ModelSwitches
from ladder.optspec import OptimizerSettings, OptimizerSpec

SCHEDULES = ("linear", "wsd", "cosine", "constant")

# What a rung can be on any machine (issue 26: a width of 10**200 crashed, hung or planned ~1e300
# steps). Generous against every published model (the hero: d 6144, 48 layers, 791 tokens per
# active parameter; contexts ~1M at most). The model's switches have theirs in ModelSwitches.
LIMITS = {
    "seq_len": 2 ** 24, "batch_per_unit": 2 ** 24,
    "kv_local_div": 2 ** 12, "kv_global_div": 2 ** 12,
    "d": 2 ** 17, "n_layers": 2 ** 12, "batch_units": 2 ** 24,
    "tokens_per_active": 1e5, "lr_coef": 1e6, "eval_sequences": 2 ** 24, "eval_batch": 2 ** 24,
}
LR_EXPONENT_LIMIT = 10.0   # |lr_tokens_exp|, |lr_d_exp|: the real rule's are -0.5-ish
MIN_EVAL_EVERY = 1e-4      # at most 10,000 evals a run (the recipe: 20)
MAX_RUN_STEPS = 10 ** 12   # ~30,000 years at a step a second: any real run is far below


def _in_range(obj, name: str, lo: float, *, lo_open: bool = False) -> None:
    """ValueError naming ``name`` unless ``obj.name`` is a finite number in [lo, LIMITS[name]]
    (``lo`` excluded with ``lo_open``)."""
    v, hi = getattr(obj, name), LIMITS[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            v < lo or (lo_open and v == lo) or v > hi:
        raise ValueError(f"{name}: must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], "
                         f"got {v!r}")


@dataclass(frozen=True)
class Schedule:
    """Learning-rate shape over the planned steps, as fractions of the peak LR.

    ``linear`` (the real recipe): linear warmup over ``warmup`` of the run, then linear decay to
    ``min_lr_frac`` at the end. ``wsd``: warmup, constant, then linear decay over the last
    ``decay`` of the run. ``cosine``: warmup, then cosine to ``min_lr_frac``. ``constant``: warmup
    then flat. ``decay_end`` < 1 re-aims the decay to end at that fraction of the planned steps
    (the contingency "shorten the run and re-aim the LR decay").
    """

    kind: str = "linear"
    warmup: float = 0.01       # real recipe: 1% linear warmup
    min_lr_frac: float = 0.05  # real recipe: decay to 5% of peak
    decay: float = 0.2         # wsd only: fraction of the run spent decaying
    decay_end: float = 1.0

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule.kind: must be one of {SCHEDULES}, got {self.kind!r}")
        for name in ("warmup", "min_lr_frac", "decay"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"schedule.{name}: must be in [0, 1], got {getattr(self, name)!r}")
        if not 0.0 < self.decay_end <= 1.0:
            raise ValueError(f"schedule.decay_end: must be in (0, 1], got {self.decay_end!r}")

    def lr_frac(self, step: float, steps: int) -> float:
        """LR at ``step`` (0-based) of ``steps`` as a fraction of the peak."""
        end = max(1.0, self.decay_end * steps)
        warm = self.warmup * steps
        if warm > 0 and step < warm:  # capped: a warmup shorter than one step must not overshoot
            return min(1.0, (step + 1) / warm)
        if step >= end:
            return self.min_lr_frac
        lo = self.min_lr_frac
        if self.kind == "constant":
            return 1.0
        t = (step - warm) / max(end - warm, 1e-12)  # linear and cosine: through the decay
        if self.kind == "linear":
            return 1.0 - (1.0 - lo) * t
        if self.kind == "cosine":
            return lo + (1.0 - lo) * 0.5 * (1.0 + math.cos(math.pi * t))
        start = end - self.decay * steps  # wsd
        if step < start:
            return 1.0
        return 1.0 - (1.0 - lo) * (step - start) / max(end - start, 1e-12)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Rung:
    """One training run of a ladder: the model, the data budget, the batch and the schedule."""

    ladder: str
    name: str
    model: ModelConfig
    seq_len: int
    batch: int              # sequences per step
    steps: int
    peak_lr: float
    schedule: Schedule = field(default_factory=Schedule)
    eval_every: float = 0.05  # evals every 5% of the run (and at the end)
    eval_sequences: int = 96  # held-out windows per eval, the same for every rung of a ladder
    eval_batch: int | None = None  # sequences per eval call; None = one per device
    param_convention: str = "exact-v1"
    is_target: bool = False
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)

    def __post_init__(self):
        for name in ("seq_len", "batch", "steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.steps > MAX_RUN_STEPS:
            raise ValueError(f"steps: {self.steps:.3g} planned steps, more than any run can take "
                             f"(limit {MAX_RUN_STEPS:.0e}); check tokens_per_active and the "
                             f"batch")
        if not (isinstance(self.peak_lr, (int, float)) and math.isfinite(self.peak_lr)
                and self.peak_lr > 0):
            raise ValueError(f"peak_lr: must be a finite number > 0, got {self.peak_lr!r}")
        _check_evals(self)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def optimizer_settings(self) -> OptimizerSettings:
        """The optimizer's numbers for this rung (the Adam peak LR is ``peak_lr``)."""
        return self.optimizer.settings(self.peak_lr, self.tokens, self.tokens_per_step)

    @property
    def params(self):
        return count_params(self.model, self.param_convention)

    @property
    def params_exact(self):
        return count_params(self.model)

    @property
    def flops(self):
        return flops_per_token(self.model, self.seq_len)

    def compute(self, tokens: float | None = None, *, lm_head: bool = False) -> float:
        """Training FLOPs (flops-v1) for ``tokens`` (default: the planned total)."""
        return self.flops.training(self.tokens if tokens is None else tokens, lm_head=lm_head)

    def eval_steps(self) -> list[int]:
        """Steps (1-based counts of completed steps) after which an eval runs."""
        n = max(1, round(1 / self.eval_every))
        return sorted({max(1, round(self.steps * i / n)) for i in range(1, n + 1)})

    def summary(self) -> dict:
        p, pe, f = self.params, self.params_exact, self.flops
        return {
            "ladder": self.ladder, "name": self.name, "is_target": self.is_target,
            "params": p.total, "active_params": p.active, "param_convention": p.convention,
            "params_exact": pe.total, "active_params_exact": pe.active,
            "tokens": self.tokens, "steps": self.steps, "batch": self.batch,
            "seq_len": self.seq_len, "tokens_per_step": self.tokens_per_step,
            "peak_lr": self.peak_lr, "schedule": self.schedule.to_dict(),
            "optimizer": self.optimizer_settings.to_dict(),
            "d_model": self.model.d_model, "n_layers": self.model.n_layers,
            "n_experts": self.model.n_experts, "top_k": self.model.top_k,
            "forward_flops_per_token": f.forward,
            "forward_flops_per_token_no_lm_head": f.forward_no_lm_head,
            "compute": self.compute(lm_head=True),
            "compute_no_lm_head": self.compute(lm_head=False),
            # the recipe's GatedNorm/conv/XSA/head-gate FLOPs inside both computes (counting.py)
            "compute_extras": 3.0 * f.extras * self.tokens,
            "flop_convention": FLOP_CONVENTION,
        }

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "model": self.model.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Rung":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown rung key")
        d = dict(d)
        d["model"] = ModelConfig.from_dict(d["model"])
        d["schedule"] = Schedule(**d.get("schedule", {}))
        d["optimizer"] = OptimizerSpec.from_dict(d.get("optimizer", {}))
        return cls(**d)

    def replace(self, **kw) -> "Rung":
        return dataclasses.replace(self, **kw)


def _check_evals(obj) -> None:
    """The eval fields a rung and a recipe share: ``eval_every``, ``eval_sequences``,
    ``eval_batch``."""
    if not MIN_EVAL_EVERY <= obj.eval_every <= 1:
        raise ValueError(f"eval_every: must be in [{MIN_EVAL_EVERY:g}, 1], got "
                         f"{obj.eval_every!r}")
    for name, null in (("eval_sequences", ""), ("eval_batch", "null or ")):  # null: None allowed
        v, hi = getattr(obj, name), LIMITS[name]
        if v is None and null:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
            raise ValueError(f"{name}: must be {null}an integer in [1, {hi}], got {v!r}")


# ---------------------------------------------------------------------------------------- rules


def split_switches(table: dict) -> tuple[dict, dict]:
    """A recipe's flat keys -> (the model's switches, :data:`SWITCH_FIELDS`; the rest)."""
    names = {f.name for f in SWITCH_FIELDS}
    return ({k: v for k, v in table.items() if k in names},
            {k: v for k, v in table.items() if k not in names})


# What a ladder file's [recipe] table must name although the model has a default for it: the
# recipe's choices of experts and attention window (the model's defaults suit small test models).
REQUIRED_SWITCHES = ("n_experts", "top_k", "n_shared", "local_window")


@dataclass(frozen=True)
class Recipe:
    """A ladder's rules: everything about a rung except its dials (width, depth, batch units).

    ``switches``: the model's switches every rung shares (ladder/model/config.py's
    :class:`ModelSwitches`, defined there once); a ladder file's ``[recipe]`` table names them
    beside the fields below, flat (:func:`parse_ladder`).
    """

    switches: ModelSwitches
    seq_len: int
    tokens_per_active: float     # token budget = this x active params (sizing convention)
    batch_per_unit: int          # sequences per step per batch unit (the real ladder: per rack)
    lr_coef: float               # peak LR = lr_coef * tokens^lr_tokens_exp * d^lr_d_exp
    lr_tokens_exp: float         #           * sqrt(tokens per batch)
    lr_d_exp: float
    kv_local_div: int = 4        # KV heads = heads / 4 in local layers, floor 1
    kv_global_div: int = 8       # and heads / 8 in global layers, floor 1
    sizing_convention: str = "exact-v1"
    schedule: Schedule = field(default_factory=Schedule)
    eval_every: float = 0.05
    # The held-out set (trainer/data.py: fixed windows of the validation split), the same for
    # every rung so that their evals compare; short sequences need more windows.
    eval_sequences: int = 96
    eval_batch: int | None = None   # sequences per eval call; None = one per device
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)

    def __post_init__(self):
        if not isinstance(self.switches, ModelSwitches) or isinstance(self.switches, ModelConfig):
            raise ValueError(f"switches: must be a ModelSwitches, got {self.switches!r}")
        for name in ("seq_len", "batch_per_unit", "kv_local_div", "kv_global_div"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
            _in_range(self, name, 1)
        for name in ("tokens_per_active", "lr_coef"):
            _in_range(self, name, 0, lo_open=True)
        for name in ("lr_tokens_exp", "lr_d_exp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or abs(v) > LR_EXPONENT_LIMIT:
                raise ValueError(f"{name}: must be a number in [-{LR_EXPONENT_LIMIT:g}, "
                                 f"{LR_EXPONENT_LIMIT:g}], got {v!r}")
        _check_evals(self)
        if self.sizing_convention not in SIZING_CONVENTIONS:
            raise ValueError(f"sizing_convention: must be one of {SIZING_CONVENTIONS}, got "
                             f"{self.sizing_convention!r}")

    @classmethod
    def of(cls, **kw) -> "Recipe":
        """A recipe from one flat set of keywords, as a ladder file's table names them: the
        model's switches (:data:`SWITCH_FIELDS`) and the recipe's own fields."""
        switches, own = split_switches(kw)
        return cls(switches=ModelSwitches(**switches), **own)

    def model(self, d: int, n_layers: int) -> ModelConfig:
        heads = max(1, d // self.switches.head_dim)
        return ModelConfig.of(
            self.switches, d_model=d, n_layers=n_layers, n_heads=heads,
            n_kv_heads_local=max(1, heads // self.kv_local_div),
            n_kv_heads_global=max(1, heads // self.kv_global_div),
            # real recipe: expert width = latent width = d/2; shared experts full-width with
            # hidden d/2 (this reproduces the published parameter counts)
            expert_dim=d // 2, latent_dim=d // 2, shared_dim=d // 2,
            # a recipe's None is a cell of one sequence (one every layout holds whole); the
            # model's None would be one cell per MoE call
            capacity_tokens=self.switches.capacity_tokens or self.seq_len,
        )

    def peak_lr(self, tokens: float, d: int, tokens_per_step: int) -> float:
        # the real ladder's Adam LR heuristic (Marin hero-run tracking issue)
        return (self.lr_coef * tokens ** self.lr_tokens_exp * d ** self.lr_d_exp
                * math.sqrt(tokens_per_step))

    def rung(self, ladder: str, dials: "Dials") -> Rung:
        model = self.model(dials.d, dials.n_layers)
        active = count_params(model, self.sizing_convention).active
        batch = self.batch_per_unit * dials.batch_units
        tokens_per_step = batch * self.seq_len
        steps = max(1, round(self.tokens_per_active * active / tokens_per_step))
        tokens = steps * tokens_per_step
        name = dials.name or format_name(count_params(model, self.sizing_convention))
        return Rung(ladder=ladder, name=name, model=model, seq_len=self.seq_len, batch=batch,
                    steps=steps, peak_lr=self.peak_lr(tokens, dials.d, tokens_per_step),
                    schedule=self.schedule, eval_every=self.eval_every,
                    eval_sequences=self.eval_sequences, eval_batch=self.eval_batch,
                    param_convention=self.sizing_convention, is_target=dials.is_target,
                    optimizer=self.optimizer)


@dataclass(frozen=True)
class Dials:
    d: int
    n_layers: int
    batch_units: int = 1
    name: str | None = None
    is_target: bool = False

    def __post_init__(self):
        for name in ("d", "n_layers", "batch_units"):
            _in_range(self, name, 1)
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name}: must be an integer, got {getattr(self, name)!r}")
        if self.name is not None:
            _safe(self.name, "name")


@dataclass(frozen=True)
class Ladder:
    name: str
    description: str
    recipe: Recipe
    rungs: tuple[Rung, ...]
    target: Rung

    @property
    def all(self) -> tuple[Rung, ...]:
        return self.rungs + (self.target,)

    def get(self, name: str) -> Rung:
        for r in self.all:
            if r.name == name:
                return r
        raise KeyError(name)


def _safe(name: str, field_name: str) -> str:
    """A ladder or rung name (a folder of ``ladder run --out``): ``ladder.io.safe_name``, as a
    ValueError naming the field."""
    try:
        return safe_name(name, field=field_name)
    except InputError as e:
        raise ValueError(f"{field_name}: {str(e).partition(': ')[2]}") from None


def format_name(p) -> str:
    """'1.6B-A61M' style: total, then active, at two significant figures (three for >= 100)."""
    def fmt(n: float) -> str:
        for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if n >= scale:
                x = n / scale
                return (f"{x:.1f}" if x < 100 else f"{x:.0f}") + unit
        return str(int(n))
    return f"{fmt(p.total)}-A{fmt(p.active)}"


# ------------------------------------------------------------------------------ ladder files

LADDER_FILE_SCHEMA = "ladder/1"
BUILTIN_DIR = "ladders"   # package data: ladder/ladders/*.toml


# annotations a file gives as a string: str, and the model's BiasRule (a StrEnum parsed by name)
STRING_KINDS = {"str", "BiasRule"}


def _check_type(value, annotation: str, where: str):
    """Check a TOML/JSON value against a dataclass field annotation ('int', 'float | None'...)."""
    kinds = [a.strip() for a in annotation.split("|")]
    if value is None:
        if "None" in kinds:
            return value
        raise ValueError(f"{where}: must not be null")
    if isinstance(value, bool):
        if "bool" in kinds:
            return value
    elif isinstance(value, int) and ("int" in kinds or "float" in kinds):
        return value if "int" in kinds else float(value)
    elif isinstance(value, float) and "float" in kinds:
        return value
    elif isinstance(value, str) and STRING_KINDS & set(kinds):
        return value
    want = " or ".join("str" if k in STRING_KINDS else k for k in kinds if k != "None")
    raise ValueError(f"{where}: must be {want}, got {value!r}")


def _build(cls, table, where: str, skip: tuple[str, ...] = (), extra: dict | None = None):
    """``cls(**table, **extra)`` with unknown keys and wrong types reported as
    ``where.key: ...`` (``extra``: fields already built, e.g. nested tables)."""
    if not isinstance(table, dict):
        raise ValueError(f"{where}: must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    _refuse_unknown(table, fields, where + ".")
    missing = [n for n, f in fields.items() if n not in table
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}.{missing[0]}: missing")
    kw = {k: _check_type(v, fields[k].type, f"{where}.{k}") for k, v in table.items()}
    kw.update(extra or {})
    try:
        return cls(**kw)
    except ValueError as e:  # the dataclass names its field first: 'field: message'
        field_name, _, message = str(e).partition(": ")
        field_name = field_name.removeprefix(where.rpartition(".")[2] + ".")  # 'schedule.kind'
        raise ValueError(f"{where}.{field_name}: {message}") from None


def _refuse_unknown(table: dict, known, prefix: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{prefix}{unknown[0]}: unknown key (known: {', '.join(known)})")


def parse_ladder(obj: dict) -> Ladder:
    """A :class:`Ladder` from a ladder file's content (a dict). Raises ValueError whose message
    starts with the field ('recipe.top_k: ...', 'rungs[2].d: ...')."""
    if not isinstance(obj, dict):
        raise ValueError("(top level): must be a table")
    known = ("schema", "name", "description", "recipe", "rungs", "target")
    _refuse_unknown(obj, known, "")
    for key in known:
        if key not in obj:
            raise ValueError(f"{key}: missing")
    if obj["schema"] != LADDER_FILE_SCHEMA:
        raise ValueError(f"schema: must be {LADDER_FILE_SCHEMA!r}, got {obj['schema']!r}")
    for key in ("name", "description"):
        if not isinstance(obj[key], str) or not obj[key]:
            raise ValueError(f"{key}: must be a non-empty string, got {obj[key]!r}")
    if ":" in obj["name"]:
        raise ValueError(f"name: must not contain ':' (LADDER:RUNG), got {obj['name']!r}")
    _safe(obj["name"], "name")
    table = obj["recipe"]
    if not isinstance(table, dict):
        raise ValueError(f"recipe: must be a table, got {table!r}")
    nested = {key: _build(cls, table[key], f"recipe.{key}")
              for key, cls in (("schedule", Schedule), ("optimizer", OptimizerSpec))
              if key in table}
    # one flat table: the model's switches (ModelSwitches) beside the recipe's own fields
    switches, own = split_switches({k: v for k, v in table.items() if k not in nested})
    known = [f.name for f in dataclasses.fields(Recipe) if f.name != "switches"] + \
        [f.name for f in SWITCH_FIELDS]
    _refuse_unknown(own, known, "recipe.")
    for name in REQUIRED_SWITCHES:
        if name not in table:
            raise ValueError(f"recipe.{name}: missing")
    nested["switches"] = _build(ModelSwitches, switches, "recipe")
    recipe = _build(Recipe, own, "recipe", skip=("schedule", "optimizer", "switches"),
                    extra=nested)
    rungs = obj["rungs"]
    if not isinstance(rungs, list) or not rungs:
        raise ValueError("rungs: must be a non-empty array of tables")
    dials = [_build(Dials, r, f"rungs[{i}]", skip=("is_target",)) for i, r in enumerate(rungs)]
    target = _build(Dials, obj["target"], "target", skip=("is_target",))
    built = []
    for where, dial in [(f"rungs[{i}]", x) for i, x in enumerate(dials)] + [("target", target)]:
        try:
            built.append(recipe.rung(obj["name"], dataclasses.replace(
                dial, is_target=where == "target")))
        except ValueError as e:  # the model config refuses these dials with this recipe
            raise ValueError(f"{where}: {e}") from None
        _safe(built[-1].name, f"{where}.name")
    names = [r.name for r in built]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"rungs: two rungs are named {dup!r}")
    return Ladder(name=obj["name"], description=obj["description"], recipe=recipe,
                  rungs=tuple(built[:-1]), target=built[-1])


def load_ladder_file(path) -> Ladder:
    """A ladder from a TOML (``.toml``) or JSON file. Bad content is an InputError naming the
    file and the field."""
    path = Path(path)
    raw = read_bytes(path, field="--ladder-file", limit=1 << 20)  # a ladder file is ~2 KB
    if path.suffix == ".json":
        obj = loads(raw, path=path)
    else:
        try:
            obj = tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:  # TOMLDecodeError
            raise InputError(f"not valid TOML: {str(e).splitlines()[0][:160]}",
                             path=path) from None
        except RecursionError:
            raise InputError("TOML nested too deeply", path=path) from None
    try:
        return parse_ladder(obj)
    except ValueError as e:
        field_name, _, message = str(e).partition(": ")
        raise InputError(message, path=path, field=field_name) from None


def _builtin() -> dict[str, Ladder]:
    """The ladders shipped as package data (ladder/ladders/*.toml), in a fixed order."""
    ladders = {}
    for name in ("marin-535b", "cpu", "tiny"):
        lad = load_ladder_file(Path(str(files("ladder") / BUILTIN_DIR / f"{name}.toml")))
        ladders[lad.name] = lad
    return ladders


LADDERS: dict[str, Ladder] = _builtin()


def with_file(ladder_file=None) -> dict[str, Ladder]:
    """The built-in ladders plus the one in ``ladder_file`` (which replaces a built-in of the
    same name, so a team can run its own variant of a shipped recipe)."""
    if ladder_file is None:
        return LADDERS
    lad = load_ladder_file(ladder_file)
    return {**LADDERS, lad.name: lad}


def get_ladder(name: str, ladders: dict[str, Ladder] | None = None) -> Ladder:
    return (LADDERS if ladders is None else ladders)[name]   # KeyError(name) when unknown


def resolve(target: str, ladders: dict[str, Ladder] | None = None) -> tuple[Ladder, list[Rung]]:
    """One rung syntax everywhere: 'LADDER' -> all rungs and the target; 'LADDER:RUNG' (or
    'LADDER/RUNG', as run directories and W&B runs are named) -> that rung; a bare 'RUNG' -> the
    rung of that name when exactly one ladder has it. Unknown: KeyError(name); a bare rung name
    that several ladders share: :class:`AmbiguousRung` (a KeyError) naming them."""
    ladders = LADDERS if ladders is None else ladders
    for sep in (":", "/"):
        if sep in target:
            name, _, rung = target.partition(sep)
            ladder = get_ladder(name, ladders)
            return (ladder, [ladder.get(rung)]) if rung else (ladder, list(ladder.all))
    if target in ladders:
        return ladders[target], list(ladders[target].all)
    found = [(lad, r) for lad in ladders.values() for r in lad.all if r.name == target]
    if len(found) > 1:
        raise AmbiguousRung(target, [f"{lad.name}:{r.name}" for lad, r in found])
    if not found:
        raise KeyError(target)
    return found[0][0], [found[0][1]]


class AmbiguousRung(KeyError):
    """A bare rung name that more than one ladder has (``args``: the name, the candidates)."""

    def __str__(self) -> str:
        return f"rung {self.args[0]!r} is in several ladders ({', '.join(self.args[1])}): " \
               f"name one as LADDER:RUNG"


def is_one_rung(target: str, ladders: dict[str, Ladder] | None = None) -> bool:
    """``target`` names one rung (not a whole ladder) in the syntax of :func:`resolve`."""
    ladders = LADDERS if ladders is None else ladders
    if any(sep in target for sep in ":/"):
        return not target.endswith((":", "/"))
    return target not in ladders


def lookup_message(e: KeyError, ladders: dict[str, Ladder] | None = None) -> str:
    """The one-line message of :func:`resolve`'s KeyError: what is ambiguous, or what is known."""
    if isinstance(e, AmbiguousRung):
        return str(e)
    ladders = LADDERS if ladders is None else ladders
    known = ", ".join(f"{n} ({', '.join(r.name for r in lad.all)})" for n, lad in ladders.items())
    return f"unknown ladder or rung {e.args[0]!r}; known: {known} (as LADDER, LADDER:RUNG, " \
           f"LADDER/RUNG or a RUNG only one ladder has)"
