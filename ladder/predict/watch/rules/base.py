"""What every watch rule is made of: the :class:`Rule` protocol, the :class:`Thresholds` and
:class:`RuleState` its ``Config`` and ``State`` derive from, the :class:`Context` of a judge.
``WatchConfig`` and the state file are the unions of the rules' ``Config`` fields and ``State``
sections, so neither is edited by hand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # annotations only
    import numpy as np

    from ladder.predict.watch.alerts import Alert
    from ladder.sources.batch import Batch


def _check(ok: Callable[[Any], bool], want: str) -> Callable[[Any], str | None]:
    """A threshold's check: None when ``ok(v)``, else what the value must be."""
    return lambda v: None if ok(v) else want


def _num(v) -> bool:
    return isinstance(v, (int, float))


positive_int = _check(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                      "a positive integer")
positive = _check(lambda v: _num(v) and v > 0 and math.isfinite(v), "a positive number")
unit = _check(lambda v: _num(v) and 0.0 <= v <= 1.0, "in [0, 1]")
open_unit = _check(lambda v: _num(v) and 0.0 < v < 1.0, "in (0, 1)")
alpha = _check(lambda v: _num(v) and 0.0 < v <= 1.0, "in (0, 1]")


def one_of(*values):
    def test(v) -> str | None:
        return None if v in values else ", ".join(values[:-1]) + f" or {values[-1]}"
    return test


def threshold(default, check: Callable[[Any], str | None] | None = None, *,
              convert: Callable | None = None):
    """A field of a config slice: its default, its check (a function returning what the value
    must be, or None when it is fine) and a conversion applied first (a list -> a tuple)."""
    return dataclasses.field(default=default, metadata={"check": check, "convert": convert})


@dataclass(frozen=True)
class Thresholds:
    """Base of a rule's config slice: a frozen dataclass whose fields are made by :func:`threshold`.
    Construction converts and checks each field (a ValueError naming the first bad one), then
    :meth:`cross_check` (relations between fields)."""

    def __post_init__(self):
        check_thresholds(self)
        self.cross_check()

    def cross_check(self) -> None:
        """Relations between fields (a subclass's; none by default)."""


def check_thresholds(obj) -> None:
    """Convert and check every :func:`threshold` field of ``obj`` (a frozen dataclass), in field
    order; a ValueError "name: must be ..., got ..." for the first bad one."""
    for f in dataclasses.fields(obj):
        conv = f.metadata.get("convert")
        if conv is not None:
            object.__setattr__(obj, f.name, conv(getattr(obj, f.name)))
        test = f.metadata.get("check")
        v = getattr(obj, f.name)
        want = test(v) if test else None
        if want:
            raise ValueError(f"{f.name}: must be {want}, got {v!r}")


# The kinds of a state field (issue 26: a state file is ours, but it is a file, edited or damaged
# or from another version, and its fields feed the rules): those of _KINDS below, ("enum?",
# values), ("int", lo, hi) or ("int?", lo, hi), ("map", kind) an object of string keys to that
# kind, and a RuleState class (an object of its fields).
MAX_COUNT = 2 ** 53


def kept(spec, default=None, *, factory=None):
    """A field of a rule's state: its kind in the state file (above) and its default."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"spec": spec})
    return dataclasses.field(default=default, metadata={"spec": spec})


@dataclass
class RuleState:
    """Base of a rule's typed state: a dataclass whose fields are :func:`kept`. ``to_json`` gives
    its section of the state file; ``from_json`` reads one back, each field checked (a ValueError
    naming the first bad one, ``state.band.run_len: ...``), missing fields at their defaults."""

    def to_json(self) -> dict:
        return {f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, d, where: str):
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in d.items():
            f = known.get(k)
            if f is None:
                raise ValueError(f"{where}.{k}: unknown field of a watcher state")
            kw[k] = read_field(v, f.metadata["spec"], f"{where}.{k}")
        return cls(**kw)


def _to_json(v):
    if isinstance(v, RuleState):
        return v.to_json()
    if isinstance(v, dict):
        return {k: _to_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_to_json(x) for x in v]
    return v


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an integer beyond float range
        return False


def _int(v, lo: int = 0, hi: int = MAX_COUNT) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and lo <= v <= hi


# kind: (whether a value is one, what it must be)
_KINDS = {
    "count": (_int, "an integer >= 0"),
    "step?": (lambda v: v is None or _int(v), "a step (an integer >= 0) or null"),
    "num?": (lambda v: v is None or _finite(v), "a finite number or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str?": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "label?": (lambda v: v is None or isinstance(v, str) or _int(v, 1, 2),  # a hysteresis run's
               "a run's label (a string, 1, 2 or null)"),
    "strs": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
             "a list of strings"),
    "nums": (lambda v: isinstance(v, list) and all(_finite(x) for x in v),
             "a list of finite numbers"),
    "pairs": (lambda v: isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 and
                                                    all(_finite(y) for y in x) for x in v),
              "a list of [fraction, value] pairs of finite numbers"),
}


def read_field(v, spec, where: str):
    """``v`` as a state field of kind ``spec`` (a fresh copy of lists and objects: the reader
    never shares the caller's), or a ValueError "where: expected ..., got ..."."""
    def bad(want):
        raise ValueError(f"{where}: expected {want}, got {str(v)[:40]!r}")

    if isinstance(spec, type) and issubclass(spec, RuleState):
        return spec.from_json(v, where)
    if isinstance(spec, tuple) and spec[0] == "map":
        if not isinstance(v, dict):
            bad("an object")
        return {k: read_field(x, spec[1], f"{where}.{k}") for k, x in v.items()}
    if isinstance(spec, tuple) and spec[0] == "enum?":
        if v is not None and v not in spec[1]:
            bad(f"one of {', '.join(spec[1])} or null")
        return v
    if isinstance(spec, tuple):  # ("int", lo, hi) or ("int?", lo, hi)
        kind, lo, hi = spec
        if not (v is None and kind == "int?" or _int(v, lo, hi)):
            bad(f"an integer in [{lo}, {hi}]")
        return v
    if spec not in _KINDS:  # a bug here, not in the file
        raise AssertionError(f"unknown state spec {spec!r} at {where}")
    ok, want = _KINDS[spec]
    if not ok(v):
        bad(want)
    if spec == "pairs":
        return [list(x) for x in v]
    return list(v) if spec in ("strs", "nums") else v


@dataclass
class Context:
    """What a judge sees of one call of ``check``: ``emit`` records an alert and the worst
    severity; ``state`` is the watcher state (a rule's own is ``state.of(rule)``). The view and
    the state are not imported here: both modules derive from the rules."""

    view: Any            # ladder.predict.watch.view.PreregView
    batch: Batch
    frac: np.ndarray
    tokens: np.ndarray
    stamp: str
    emit: Callable[[Alert], None]
    state: Any           # ladder.predict.watch.state.WatchState


class Rule:
    """One rule of the decision rule (the protocol every rule class follows).

    ``scope``, how ``check`` calls it: "batch" rules see the whole batch (:meth:`judge` ``(ctx,
    cfg, st)``), "eval" rules one eval at a time (``(ctx, cfg, st, ev)``: the loss rules, which
    share the residual's EMA), "run" rules at their own points (applicability first, the input's
    remarks, stalled); ``family``, the part of ``WatchConfig`` its thresholds join; ``panel``,
    where the report draws its alerts ("watch": the loss plot, "health": the panels of the keys
    it reads, None: listed only); it reads the registered metric when ``reads_metric``, the
    ``fixed_keys`` and every key starting with one of ``prefixes``; ``State`` (None: it keeps
    none) is kept in the state file under ``key`` (default its name); ``template``, its words
    (``str.format`` of ``c`` its config slice, ``level`` the band level and ``rule`` itself),
    or its own :meth:`text`.
    """

    name: ClassVar[str]
    scope: ClassVar[str]
    family: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    description: ClassVar[str]
    panel: ClassVar[str | None] = None
    reads_metric: ClassVar[bool] = False
    fixed_keys: ClassVar[tuple[str, ...]] = ()
    prefixes: ClassVar[tuple[str, ...]] = ()
    Config: ClassVar[type] = Thresholds
    State: ClassVar[type | None] = None
    key: ClassVar[str | None] = None
    template: ClassVar[str]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:  # a helper class shared by a few rules
            return
        if cls.scope not in ("run", "batch", "eval"):
            raise ValueError(f"scope: must be run, batch or eval, got {cls.scope!r}")
        if cls.family not in ("loss", "health", "run"):
            raise ValueError(f"family: must be loss, health or run, got {cls.family!r}")
        if cls.panel not in (None, "watch", "health"):
            raise ValueError(f"panel: must be watch, health or null, got {cls.panel!r}")
        if cls.State is not None and cls.key is None:
            cls.key = cls.name

    @property
    def state(self) -> tuple[str, ...]:
        """The entries of the watcher state it owns (its section)."""
        return (self.key,) if self.State is not None else ()

    def config(self, cfg) -> Thresholds:
        """This rule's slice of ``cfg`` (a ``WatchConfig``, the slice itself, or None: the
        defaults)."""
        if cfg is None:
            return self.Config()
        if isinstance(cfg, self.Config):
            return cfg
        return cfg.slice_of(self.Config)

    def keys(self, metric: str, cfg) -> tuple[str, ...]:
        """The metric keys it reads (``cfg`` its config slice)."""
        return ((metric,) if self.reads_metric else ()) + self.fixed_keys

    def reads(self, metric: str, cfg) -> tuple[str, ...]:
        return tuple(self.keys(metric, self.config(cfg)))

    def words(self, cfg, level: float) -> str:
        """Its slice of the decision rule in words (``cfg`` a ``WatchConfig``; ``level`` the
        registered band level)."""
        return self.text(self.config(cfg), level)

    def text(self, c, level: float) -> str:
        return self.template.format(c=c, level=level, rule=self)
