"""What every watch rule is made of: the :class:`Rule` protocol, the frozen :class:`Thresholds`
a rule's config slice derives from, the :class:`RuleState` its typed state derives from (to and
from JSON, each field checked) and the :class:`Context` a judge is called with.

A rule is one class. It names its thresholds (``Config``, a frozen dataclass of
:class:`Thresholds` whose fields carry their own check), its state (``State``, a dataclass of
:class:`RuleState` whose fields carry their kind in the state file), the metric keys it reads,
its alert kinds, its slice of the decision rule in words and its judge. ``WatchConfig``
(``ladder.predict.watch.config``) is the union of the rules' ``Config`` fields and the state file
(``predict.watch.state``) the union of their ``State`` sections, so neither is edited by hand.
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


def positive_int(v) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else \
        "a positive integer"


def positive(v) -> str | None:
    return None if isinstance(v, (int, float)) and v > 0 and math.isfinite(v) else \
        "a positive number"


def unit(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0.0 <= v <= 1.0 else "in [0, 1]"


def open_unit(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0.0 < v < 1.0 else "in (0, 1)"


def alpha(v) -> str | None:
    return None if isinstance(v, (int, float)) and 0.0 < v <= 1.0 else "in (0, 1]"


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
# or from another version, and its fields feed the rules): "count" an int >= 0, "step?" an int in
# [0, 2**53] or null, "num?" a finite number or null, "bool", "str?", ("enum?", values),
# ("int", lo, hi), "label?" (a hysteresis run's label: null, a string, or 1 or 2), "strs" a list
# of strings, "nums" a list of finite numbers, "pairs" a list of [fraction, value] pairs,
# ("map", kind) an object of string keys to that kind, and a RuleState class (an object of its
# fields).
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
        if v is None and kind == "int?":
            return v
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            bad(f"an integer in [{lo}, {hi}]")
        return v
    if spec == "count":
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
            bad("an integer >= 0")
    elif spec == "step?":
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or
                              not 0 <= v <= MAX_COUNT):
            bad("a step (an integer >= 0) or null")
    elif spec == "num?":
        if v is not None and not _finite(v):
            bad("a finite number or null")
    elif spec == "bool":
        if not isinstance(v, bool):
            bad("true or false")
    elif spec == "str?":
        if v is not None and not isinstance(v, str):
            bad("a string or null")
    elif spec == "label?":
        if v is not None and not isinstance(v, str) and \
                (isinstance(v, bool) or not isinstance(v, int) or v not in (1, 2)):
            bad("a run's label (a string, 1, 2 or null)")
    elif spec == "strs":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            bad("a list of strings")
        return list(v)
    elif spec == "nums":
        if not isinstance(v, list) or not all(_finite(x) for x in v):
            bad("a list of finite numbers")
        return list(v)
    elif spec == "pairs":
        if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 2 and
                                              all(_finite(y) for y in x) for x in v):
            bad("a list of [fraction, value] pairs of finite numbers")
        return [list(x) for x in v]
    else:  # a spec this function does not know: a bug here, not in the file
        raise AssertionError(f"unknown state spec {spec!r} at {where}")
    return v


@dataclass
class Context:
    """What a judge sees of one call of ``check``: the pre-registration's view, the batch, each
    row's fraction of the run and tokens, the alerts' time stamp, ``emit`` (records an alert and
    the worst severity) and the watcher state (its shared fields; a rule's own state is
    ``state.of(rule)``). The view and the state are not imported here: both modules derive from
    the rules (the view holds the ``WatchConfig``, the state their sections)."""

    view: Any            # ladder.predict.watch.view.PreregView
    batch: Batch
    frac: np.ndarray
    tokens: np.ndarray
    stamp: str
    emit: Callable[[Alert], None]
    state: Any           # ladder.predict.watch.state.WatchState


class Rule:
    """One rule of the decision rule (the protocol every rule class follows).

    Class attributes: ``name``; ``scope``, how ``check`` calls it: "batch" rules see the whole
    batch (:meth:`judge` ``(ctx, cfg, st)``), "eval" rules one eval at a time (``(ctx, cfg, st,
    ev)``: the loss rules, which share the residual's EMA), "run" rules are called by ``check``
    at their own points (applicability first, the input's remarks, stalled); ``family``, the part
    of ``WatchConfig`` its thresholds join ("loss", "health", "run"); ``kinds``, the alert kinds
    it raises; ``description``; ``panel``, where the report draws its alerts ("watch": the loss
    plot, "health": the health panels of the keys it reads, None: listed only); the keys it reads
    (:meth:`keys`): the registered metric when ``reads_metric``, the ``fixed_keys``, and every key
    starting with one of ``prefixes``; ``Config``, its thresholds; ``State``, its typed state
    (None: it keeps none), kept in the state file under ``key`` (default its name).
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

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:  # an abstract helper class (shared by a few rules)
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
        raise NotImplementedError(self.name)

    def new_state(self) -> RuleState | None:
        return self.State() if self.State is not None else None
