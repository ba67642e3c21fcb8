"""The watcher: a pure function ``check(prereg, points, state) -> CheckResult(alerts, state)``.

Everything here is a function of its arguments: no file, clock or network access (the caller
passes ``now``). I/O lives around it (``predict.sources`` reads points, ``predict.sinks`` sends
alerts, :class:`Watcher` glues them with a persisted state).

Points arrive as a :class:`Batch`: columns of one logged row each (``step`` plus float columns,
NaN where a key is missing, and a mask of values that were *written* non-finite). Train-level rules
are vectorised over the batch so that a 1M-row file is judged in well under a second; the
loss-vs-forecast rule loops over eval rows only (a few hundred per run).

Rules (thresholds in :class:`WatchConfig`, stored in the pre-registration's ``decision_rule``):

1. **loss vs forecast**: the residual of the metric against the forecast, smoothed over evals
   (exponential moving average), outside the band for ``k_consecutive`` evals -> warn, named
   ``above_band`` (worse than forecast) or ``below_band`` (better); outside for ``k_critical``
   evals, or far outside (beyond the band by ``far_factor`` of its half-width) for ``k_far`` evals
   -> critical; back inside for ``k_clear`` evals -> ``cleared`` (info). Hysteresis: no new alert
   while the state does not change.
1b. **trend**: the smoothed residual (relative to the forecast) moving more than ``trend_rel`` from
   its own median over an earlier window of the run -> warn: a step or drift that stays inside the
   band (a healthy run keeps its offset to the forecast; a fault moves it).
1c. **rising**: the metric above its own running minimum by more than ``rise_rel`` (and
   ``rise_noise_k`` x the ladder's eval noise) for ``rise_k`` consecutive evals -> warn.
2. **token-drop fraction** (``moe/drop_frac``) against the ladder's value at the same fraction of
   the schedule (reference curves stored in the pre-registration), else absolute thresholds.
3. **numerical stability**: non-finite loss/grad-norm -> critical at once; grad-norm level against
   the ladder and its growth since warmup (the real team added logit z-loss when grad norm grew
   past 4: Marin hero-run tracking issue, see shared/DESIGN.md section 1); train-loss spikes
   against a trailing median; parameter-norm growth per group against the ladder's, with
   ``router_bias`` judged on its own (set by a balancing rule, not by gradients; spikes early).
4. **contingency**: a confirmed ``above_band`` deviation inside the first ``contingency_fraction``
   of the token budget -> an advisory with the projected final value if the run continues and the
   token budget at which the registered final value would still be reached.

Also ``stalled`` (no new point for ``stalled_seconds``) and ``not_applicable`` (an applicability
condition of the pre-registration is broken: from here on nothing is compared, exit status 3).

Each rule is a :class:`Rule` in ``RULES`` (end of this file): the metric keys it reads, its alert
kinds, the state it keeps, its slice of the decision rule in words and its judge. ``check`` runs
the registry in order; the watcher's key filter (:func:`watched_keys`), the pre-registration's
``decision_rule.words`` and the report's alert kinds (:func:`alert_kinds`) are derived from it.
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ladder.io import as_float, sha256_of

SEVERITIES = ("info", "warn", "critical")
# decision-rule parameters of earlier versions, ignored when reading an older pre-registration
# (entropy_drop: router entropy below (1 - x) of the ladder's median; replaced by the envelope;
# drop_warn_ratio / drop_crit_ratio: x the ladder's median; replaced by the envelope and
# drop_crit_factor)
RETIRED_PARAMETERS = frozenset({"entropy_drop", "drop_warn_ratio", "drop_crit_ratio"})
_SEV_RANK = {"info": 0, "warn": 1, "critical": 2}


# ------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class WatchConfig:
    """Thresholds of the decision rule. Stored in the pre-registration; validated here."""

    align: str = "auto"            # how a row maps to the forecast: auto | tokens | step | fraction
    # rule 1: loss vs forecast
    alert_level: float = 0.99      # band level the alerts use: the registered band (say 90%)
    #                                widened by z(alert_level)/z(band_level) (Gaussian). A healthy
    #                                run sits outside a calibrated 90% band 10% of the time, and its
    #                                offset persists over the run, so alerting at 90% would flag
    #                                ~1 healthy run in 10; bench/watch_quality.py measures both.
    ema_alpha: float = 0.5         # smoothing of the residual over evals (1.0 = none)
    k_consecutive: int = 3         # evals outside the band before a warning
    k_critical: int = 6            # evals outside before a warning becomes critical ("persisting")
    far_factor: float = 1.0        # "far outside": beyond the band by this x its half-width ...
    k_far: int = 2                 # ... for this many evals -> critical
    k_clear: int = 2               # evals back inside before "cleared"
    min_fraction: float = 0.01     # no comparison before 1% of the run (warmup, steep start)
    # rule 1b: a change against the run's own earlier level (catches a step or a drift inside the
    # band: a healthy run keeps its offset to the forecast, a fault moves it)
    trend_rel: float = 0.01        # smoothed residual moved by 1% of the forecast ...
    trend_window: float = 0.5      # ... from its median over the preceding 50% of the run ...
    #                                (0.3 missed a +3% drift over 70% of the run in 2 of 32 runs
    #                                and took ~50 evals; 0.5: all, ~29 evals; no false alarm in
    #                                either: bench/watch_quality.py)
    trend_gap: float = 0.03        # ... ending 3% of the run before the eval judged
    trend_after: float = 0.25      # not before 25% of the run: the early curve is least certain
    #                                (the cpu demo's healthy hero drifted 2.2% of the forecast
    #                                toward "better" between 10% and 30%)
    trend_band: float = 0.25       # the threshold is at least this x the registered band's
    #                                relative half-width at that fraction (a wide band = a curve
    #                                shape the law knows less well) ...
    trend_noise_k: float = 4.0     # ... and at least this x the sd of the smoothed residual's own
    #                                eval-to-eval noise (robust, from the run's history).
    #                                A move toward "better" than forecast is recorded as info.
    # rule 1c: the metric rising above its own running minimum. A healthy run's held-out loss does
    # not go up while it trains; a data or optimizer fault makes it, well before the offset to a
    # wide forecast band shows (cpu demo, loss-drift from 40%: +4.9% one eval after onset, +11.5%
    # two evals after; the band and trend rules needed 5 evals)
    rise_rel: float = 0.01         # above the running minimum by 1% of it ...
    rise_noise_k: float = 4.0      # ... and by at least this x the ladder's eval noise ...
    rise_k: int = 2                # ... for this many consecutive evals -> warn "rising"
    rise_after: float = 0.1        # judged from 10% of the run on
    # rule 4: contingency
    contingency_fraction: float = 0.25   # real plan: trouble in the first 25% of tokens
    # rule 2: token-drop fraction
    drop_window: int = 20          # rows in the trailing median
    drop_crit_factor: float = 2.5  # critical: this x the warning limit (the ladder's max at the
    #                                same fraction x exp(tolerance + margin), see envelope_*)
    drop_warn_abs: float = 0.08    # without a ladder reference (issue: hero ~2%, 8% plausible)
    drop_crit_abs: float = 0.40    # (at 65k context the real drops went 7% -> 40%)
    drop_floor: float = 0.01       # below this drop fraction never alert
    # rule 3: stability
    spike_window: int = 50         # rows in the trailing median (and MAD) of train loss
    spike_k: float = 7.0           # a spike: train loss > trailing median + k x 1.4826 x MAD
    #                                (a robust z-score above k). With ladder runs, preregister
    #                                raises k to spike_k_margin x the largest z of the ladder's
    #                                healthy runs (the cpu ladder: 1.5; its proxy hero: 2.7,
    #                                with 4k tokens a step); this value is the floor: 1M rows of
    #                                Gaussian noise on a loss curve reach z 6.8 (3 rows above 6),
    #                                and heavier tails show on the ladder and raise k.
    spike_k_margin: float = 1.5
    spike_rel: float = 0.02        # ... and at least this much above the median (a flat series
    #                                has MAD 0)
    grad_window: int = 20
    grad_after: float = 0.02       # ignore grad norm before this fraction (warmup transients)
    grad_growth_warn: float = 4.0  # growth of grad norm since its post-warmup minimum (real: 4)
    grad_ref_warn: float = 4.0     # x the ladder's grad norm at the same fraction
    grad_ref_crit: float = 16.0
    # router: entropy below / load max-over-mean above the envelope (min..max) of the ladder's
    # rungs at the same fraction, widened by the ladder's own leave-one-rung-out tolerance (how
    # far one rung strays outside the others' envelope; stored in health_reference) plus this
    # margin, in log units. Entropy and load differ with size and depth (cpu ladder, 30% of the
    # run: entropy 0.6 to 1.5 across rungs), so a fixed fraction of the ladder's mean is not a
    # rule. A collapse (entropy -> 0, load -> n_experts/top_k) leaves the widened envelope.
    # The same envelope rule judges the token-drop fraction (rule 2): it too differs between
    # rungs (cpu ladder at the end of the run: 1.5% to 9%).
    envelope_margin: float = 0.25  # exp(0.25) = 1.28x beyond the calibrated tolerance
    envelope_tol: float = 0.5      # floor of the tolerance (and its value when the ladder has
    #                                fewer than 3 rungs to measure it): a leave-one-rung-out max
    #                                over 3-4 rungs underestimates the spread of the next size
    #                                (cpu ladder: 0.27 over 3 rungs, while the 4th strays 0.7)
    envelope_tol_max: float = 1.1  # ... and its cap (x3): a ladder whose small rungs scatter
    #                                wildly (cpu ladder drop fraction: 1.8, x6) must not blind
    #                                the rule to a jump like 7% -> 40% (issue: 65k context)
    param_growth_ratio: float = 2.0  # per-group norm growth vs the ladder's, either way
    router_bias_after: float = 0.1   # router_bias spikes early by design: judge it after this
    router_bias_jump: float = 3.0    # |router_bias| norm > this x its trailing median
    k_health: int = 5              # rows a health condition must hold before an alert
    k_health_clear: int = 20       # rows it must be gone before "cleared"
    # stalled and applicability
    stalled_seconds: float = 1800.0
    steps_tolerance: float = 0.005  # planned steps implied by step/progress may differ this much
    nan_keys: tuple = ("train/loss", "grad/norm", "eval/loss")

    def __post_init__(self):
        if self.align not in ("auto", "tokens", "step", "fraction"):
            raise ValueError(f"align: must be auto, tokens, step or fraction, got {self.align!r}")
        if not 0.0 < self.alert_level < 1.0:
            raise ValueError(f"alert_level: must be in (0, 1), got {self.alert_level!r}")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha: must be in (0, 1], got {self.ema_alpha!r}")
        for name in ("k_consecutive", "k_critical", "k_far", "k_clear", "drop_window",
                     "spike_window", "grad_window", "k_health", "k_health_clear", "rise_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if self.k_critical < self.k_consecutive:
            raise ValueError("k_critical: must be >= k_consecutive")
        for name in ("trend_rel", "far_factor", "drop_crit_factor",
                     "drop_warn_abs", "drop_crit_abs", "spike_rel", "spike_k", "spike_k_margin",
                     "trend_noise_k", "envelope_tol", "envelope_tol_max", "grad_growth_warn",
                     "grad_ref_warn", "grad_ref_crit", "param_growth_ratio", "router_bias_jump",
                     "stalled_seconds", "steps_tolerance", "envelope_margin", "rise_rel",
                     "rise_noise_k"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{name}: must be a positive number, got {v!r}")
        for name in ("trend_window", "trend_gap", "trend_after", "min_fraction",
                     "contingency_fraction", "drop_floor", "grad_after",
                     "trend_band", "router_bias_after", "rise_after"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"{name}: must be in [0, 1], got {v!r}")
        object.__setattr__(self, "nan_keys", tuple(self.nan_keys))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["nan_keys"] = list(self.nan_keys)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> WatchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k not in RETIRED_PARAMETERS}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown decision-rule parameter")
        return cls(**dict(d))

    def words(self, level: float) -> str:
        """The decision rule in words (stored beside the parameters): each rule's own slice, in
        registry order (``RULES``)."""
        return " ".join(r.words(self, level) for r in RULES)


# ------------------------------------------------------------------------------------ alerts


@dataclass(frozen=True)
class Alert:
    """One alert (shared/DESIGN.md section 3, alerts.jsonl)."""

    time: str
    step: int | None
    tokens: float | None
    fraction: float | None
    kind: str
    severity: str
    value: float | None = None
    expected: float | None = None
    lo: float | None = None
    hi: float | None = None
    direction: str | None = None
    message: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity: must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("time", "step", "tokens", "fraction", "kind",
                                           "severity", "value", "expected", "lo", "hi",
                                           "direction", "message")}
        d.update(self.extra)
        return d

    def line(self) -> str:
        where = f"step {self.step}" if self.step is not None else "-"
        if self.fraction is not None:
            where += f" ({self.fraction:.1%})"
        return f"[{self.severity.upper():8}] {self.kind:<14} {where}: {self.message}"


def exit_code_for(worst: str | None, not_applicable: bool) -> int:
    """DESIGN.md section 4: 0 nothing above info, 1 warnings, 2 critical, 3 not applicable."""
    if not_applicable:
        return 3
    return {"warn": 1, "critical": 2}.get(worst or "info", 0)


# ------------------------------------------------------------------------------------ points


@dataclass
class Batch:
    """Rows of a metrics source as columns. ``cols[key]`` is float64 with NaN where the row lacks
    the key or its value is non-finite; ``nonfinite[key]`` marks values *written* as NaN/Inf.
    ``configs`` are run configurations seen in the source (checked for applicability); ``notes``
    are human-readable remarks on the input (skipped lines, non-numeric values)."""

    step: np.ndarray
    cols: dict[str, np.ndarray]
    nonfinite: dict[str, np.ndarray] = field(default_factory=dict)
    configs: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.step)

    def col(self, key: str) -> np.ndarray:
        c = self.cols.get(key)
        return c if c is not None else np.full(len(self.step), np.nan)

    @classmethod
    def empty(cls) -> Batch:
        return cls(step=np.zeros(0, dtype=np.int64), cols={})

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping], *, keys: Iterable[str] | None = None,
                  keep=None, nan_tokens: bool = True) -> Batch:
        """Columns from row dicts (as read from JSONL/CSV/W&B). A row with a ``config`` dict is a
        configuration; rows without a numeric ``step`` are skipped with a note. Within the batch
        a repeated step keeps its last row (a resumed run re-logs steps: last one wins).

        ``nan_tokens=False`` is the caller's guarantee that no value was *written* as NaN (the
        source text has no ``NaN`` token or string): then a NaN in a numeric column can only be a
        missing key, and large batches take a columnar path (pandas builds the columns in C;
        about twice as fast as per-key Python loops)."""
        rows_l = rows if isinstance(rows, list) else list(rows)
        if not nan_tokens and len(rows_l) >= 2000:
            b = cls._columns_fast(rows_l, keys, keep)
            if b is not None:
                return b
        configs = [r["config"] for r in rows_l if "config" in r and isinstance(r["config"], dict)]
        notes: list[str] = []
        steps_raw = [r.get("step") for r in rows_l]
        arr, _, _ = _to_float(steps_raw, nonfinite=False)
        ok = np.isfinite(arr)
        if not ok.all():
            is_cfg = np.array(["config" in r and "step" not in r for r in rows_l], dtype=bool)
            no_step = int((~ok & ~is_cfg).sum())
            if no_step:
                notes.append(f"{no_step} row(s) without a numeric 'step' skipped")
            rows_l = [r for r, k in zip(rows_l, ok, strict=True) if k]
        return cls._columns(rows_l, keys, configs, notes, keep)

    @classmethod
    def _columns(cls, rows: list[Mapping], keys, configs, notes, keep=None) -> Batch:
        n = len(rows)
        step = _to_float([r["step"] for r in rows], nonfinite=False)[0].astype(np.int64) if n \
            else np.zeros(0, dtype=np.int64)
        ks = cls._keys(rows, keys, keep) - {"step", "config"}
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in ks:
            _column(k, [r.get(k) for r in rows], cols, nonfinite, notes)
        b = cls(step=step, cols=cols, nonfinite=nonfinite, configs=configs, notes=notes)
        return b.last_wins()

    @classmethod
    def from_columns(cls, c, *, keys: Iterable[str] | None = None, keep=None) -> Batch:
        """:meth:`from_rows` of rows already read as columns (``predict.jsonl_columns.Columns``):
        the same steps, columns, non-finite masks, configurations and notes, except that the keys
        are found in every row rather than in a sample of a large batch."""
        n = c.n
        notes: list[str] = []
        nothing = [None] * n
        arr, _, _ = _to_float(c.values.get("step", nothing), nonfinite=False)
        ok = np.isfinite(arr)
        sel = None
        if not ok.all():
            absent = np.zeros(n, dtype=bool)
            is_cfg = c.present.get("config", absent) & ~c.present.get("step", absent)
            no_step = int((~ok & ~is_cfg).sum())
            if no_step:
                notes.append(f"{no_step} row(s) without a numeric 'step' skipped")
            sel = np.flatnonzero(ok)
        step = arr[ok].astype(np.int64)
        ks: set[str] = set(keys or ())
        if keys is None or keep is not None:
            found = {k for k, p in c.present.items() if (p if sel is None else p[sel]).any()}
            ks |= {k for k in found if keep is None or keep(k)}
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in ks - {"step", "config"}:
            vals = c.values.get(k, nothing)
            if sel is not None:
                vals = [vals[i] for i in sel.tolist()]
            _column(k, vals, cols, nonfinite, notes)
        b = cls(step=step, cols=cols, nonfinite=nonfinite, configs=list(c.configs), notes=notes)
        return b.last_wins()

    @classmethod
    def _columns_fast(cls, rows: list[Mapping], keys, keep) -> Batch | None:
        """The columnar path of :meth:`from_rows` (no written NaN in ``rows``); None when the rows
        need the general path (configuration rows, a non-numeric ``step``)."""
        import pandas as pd
        if any("config" in r for r in rows):
            return None
        ks = cls._keys(rows, keys, keep)
        names = ["step"] + sorted(ks - {"step", "config"})
        df = pd.DataFrame.from_records(rows, columns=names)
        st = df["step"]
        if st.dtype.kind not in "iuf":
            return None
        stepf = st.to_numpy(dtype=float)
        ok = np.isfinite(stepf)
        notes: list[str] = []
        if not ok.all():  # rare: the general path, on the rows with a step
            notes.append(f"{int((~ok).sum())} row(s) without a numeric 'step' skipped")
            kept = [r for r, k in zip(rows, ok, strict=True) if k]
            b = cls._columns_fast(kept, keys, keep) if kept else None
            if b is None:
                return None
            b.notes = notes + b.notes
            return b
        cols: dict[str, np.ndarray] = {}
        nonfinite: dict[str, np.ndarray] = {}
        for k in names[1:]:
            c = df[k]
            if c.dtype.kind in "iufb":
                arr = c.to_numpy(dtype=float)  # NaN here = key missing (no NaN was written)
                nf = np.isinf(arr)             # 1e999 parses to inf: written non-finite
            else:  # mixed types: the general conversion, with missing keys as None
                vals = [None if isinstance(v, float) and v != v else v for v in c.tolist()]
                arr, bad, nf = _to_float(vals)
                if bad:
                    notes.append(f"{bad} non-numeric value(s) of '{k}' ignored")
            if nf.any():
                nonfinite[k] = nf
                arr = np.where(np.isfinite(arr), arr, np.nan)
            cols[k] = arr
        return cls(step=stepf.astype(np.int64), cols=cols, nonfinite=nonfinite, configs=[],
                   notes=notes).last_wins()

    @staticmethod
    def _keys(rows: list[Mapping], keys, keep) -> set[str]:
        n = len(rows)
        ks: set[str] = set(keys or ())
        if keys is None or keep is not None:
            # discover keys: all rows when few, else a sample (key sets of a run barely change)
            sample = rows if n <= 5000 else rows[:1000] + rows[1000::97] + rows[-1000:]
            for r in sample:
                ks.update(r.keys())
            if keep is not None:
                ks = {k for k in ks if keep(k)} | set(keys or ())
        return ks

    def last_wins(self) -> Batch:
        """Keep the last row of each repeated step; rows in step order."""
        n = len(self.step)
        if n < 2 or (np.diff(self.step) > 0).all():
            return self
        # index of the last occurrence of each step
        rev = self.step[::-1]
        _, first_in_rev = np.unique(rev, return_index=True)
        keep = n - 1 - first_in_rev  # np.unique sorts by step
        return self.take(keep)

    def take(self, idx: np.ndarray) -> Batch:
        return Batch(step=self.step[idx], cols={k: v[idx] for k, v in self.cols.items()},
                     nonfinite={k: v[idx] for k, v in self.nonfinite.items()},
                     configs=self.configs, notes=self.notes)


@dataclass(frozen=True)
class KeyFilter:
    """Which row keys the rules read (picklable, for parallel parsing)."""

    fixed: frozenset
    prefixes: tuple = ("params/norm/",)

    def __call__(self, k: str) -> bool:
        return k in self.fixed or k.startswith(self.prefixes)


def concat_batches(batches: list[Batch]) -> Batch:
    """One batch from consecutive ones (missing columns NaN, missing masks False)."""
    batches = [b for b in batches if b is not None]
    if not batches:
        return Batch.empty()
    keys = sorted({k for b in batches for k in b.cols})
    nf_keys = sorted({k for b in batches for k in b.nonfinite})
    step = np.concatenate([b.step for b in batches])
    cols = {k: np.concatenate([b.cols.get(k, np.full(len(b), np.nan)) for b in batches])
            for k in keys}
    nonfinite = {k: np.concatenate([b.nonfinite.get(k, np.zeros(len(b), bool)) for b in batches])
                 for k in nf_keys}
    out = Batch(step=step, cols=cols, nonfinite=nonfinite,
                configs=[c for b in batches for c in b.configs],
                notes=[n for b in batches for n in b.notes])
    return out.last_wins()


def _column(k: str, vals: list, cols: dict, nonfinite: dict, notes: list) -> None:
    """Column ``k`` of a batch from its row values (None: missing), with its non-finite mask and
    a note on the values that are not numbers."""
    arr, bad, nf = _to_float(vals)
    if bad:
        notes.append(f"{bad} non-numeric value(s) of '{k}' ignored")
    if not np.isfinite(arr).all() or nf.any():
        arr = np.where(np.isfinite(arr), arr, np.nan)
    cols[k] = arr
    if nf.any():
        nonfinite[k] = nf


def _to_float(vals: list, *, nonfinite: bool = True) -> tuple[np.ndarray, int, np.ndarray]:
    """Float array (NaN: missing/invalid), count of non-numeric values, written-non-finite mask."""
    n = len(vals)
    try:
        arr = np.array(vals, dtype=np.float64)  # None -> NaN, "NaN"/"Infinity" strings parse
        bad = 0
    except (TypeError, ValueError):
        out = np.empty(n, dtype=np.float64)
        bad = 0
        for i, v in enumerate(vals):
            f = as_float(v)
            if f is None:
                out[i] = np.nan
                if v is not None:
                    bad += 1
            else:
                out[i] = f
        arr = out
    nf = ~np.isfinite(arr)
    if not nonfinite:
        return arr, bad, nf
    if nf.any():
        # written non-finite: not missing (None) and parsed to NaN/Inf
        idx = np.flatnonzero(nf)
        for i in idx:
            v = vals[i]
            if v is None or as_float(v) is None:
                nf[i] = False
    return arr, bad, nf


# ------------------------------------------------------------------------------------ prereg view


@dataclass(frozen=True)
class PreregView:
    """What the watcher needs from a pre-registration dict, as arrays."""

    metric: str
    steps: int
    tokens: float
    fraction: np.ndarray
    loss: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    final: float
    final_lo: float
    final_hi: float
    level: float
    config: WatchConfig
    applicability: dict
    health: dict
    budget: dict
    sha256: str
    eval_noise: float = 0.0

    @classmethod
    def of(cls, prereg: Mapping) -> PreregView:
        fc = prereg["forecast"]
        fr = np.array([as_float(p["fraction"]) for p in fc], dtype=float)
        order = np.argsort(fr, kind="stable")

        def arr(key):
            return np.array([np.nan if as_float(p.get(key)) is None else as_float(p.get(key))
                             for p in fc], dtype=float)[order]

        rule = prereg.get("decision_rule", {})
        params = rule.get("parameters", {}) if isinstance(rule, dict) else {}
        target = prereg["target"]
        final = prereg.get("final", {})
        return cls(metric=prereg["metric"], steps=int(target["steps"]),
                   tokens=float(target["tokens"]), fraction=fr[order], loss=arr("loss"),
                   lo=arr("lo"), hi=arr("hi"), final=_f(final.get("loss")),
                   final_lo=_f(final.get("lo")), final_hi=_f(final.get("hi")),
                   level=float(prereg.get("band_level", 0.9)),
                   config=WatchConfig.from_dict(params),
                   applicability=dict(prereg.get("applicability", {})),
                   health=dict(prereg.get("health_reference") or {}),
                   budget=dict(prereg.get("budget_curve") or {}),
                   sha256=str(prereg.get("sha256", sha256_of(prereg))),
                   eval_noise=_noise_sigma(prereg.get("eval_noise")))

    def expected(self, frac: np.ndarray, *, alert: bool = True):
        """Forecast and band at ``frac``; with ``alert``, the band widened to the alert level."""
        f0, f1 = self.fraction[0], self.fraction[-1]
        frac = np.where((frac < f0) & (frac > f0 - 1e-6), f0, frac)  # rounding at the ends
        frac = np.where((frac > f1) & (frac < f1 + 1e-6), f1, frac)
        e = np.interp(frac, self.fraction, self.loss, left=np.nan, right=np.nan)
        lo = np.interp(frac, self.fraction, self.lo, left=np.nan, right=np.nan)
        hi = np.interp(frac, self.fraction, self.hi, left=np.nan, right=np.nan)
        if alert and self.config.alert_level != self.level:
            from scipy.stats import norm
            k = norm.ppf(0.5 + self.config.alert_level / 2) / norm.ppf(0.5 + self.level / 2)
            lo, hi = e - (e - lo) * k, e + (hi - e) * k
        return e, lo, hi

    def reference(self, key: str, frac: np.ndarray) -> np.ndarray | None:
        """The ladder's median of ``key`` at fraction ``frac`` (NaN outside its range)."""
        sig = (self.health.get("signals") or {}).get(key)
        fr = self.health.get("fractions")
        if not sig or not fr:
            return None
        x = np.array([_f(v) for v in fr])
        y = np.array([_f(v) for v in sig.get("median", [])])
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < 2:
            return None
        return np.interp(frac, x[ok], y[ok], left=np.nan, right=np.nan)

    def envelope(self, key: str, frac: np.ndarray) -> Envelope | None:
        """The ladder's min and max of ``key`` across rungs at ``frac`` and the leave-one-rung-out
        tolerance (log units) stored with them; None without a reference for ``key``."""
        sig = (self.health.get("signals") or {}).get(key)
        lo = self._curve(sig, "min", frac)
        hi = self._curve(sig, "max", frac)
        if lo is None or hi is None:  # a reference with medians only: a zero-width envelope
            lo = hi = self._curve(sig, "median", frac)
        if lo is None:
            return None
        tol = sig.get("tolerance") or {}
        fallback = self.config.envelope_tol

        def t(side):  # the measured tolerance within the configured floor and cap
            v = as_float(tol.get(side))
            if v is None or not math.isfinite(v):
                return fallback
            return min(max(v, fallback), max(fallback, self.config.envelope_tol_max))
        return Envelope(lo=lo, hi=hi, tol_below=t("below"), tol_above=t("above"),
                        calibrated=tol.get("below") is not None)

    def _curve(self, sig, name, frac):
        fr = self.health.get("fractions")
        if not sig or not fr or not sig.get(name):
            return None
        x = np.array([_f(v) for v in fr])
        y = np.array([_f(v) for v in sig.get(name, [])])
        if x.size != y.size:
            return None
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.sum() < 2:
            return None
        # the bins cover [0, 1]: their outer halves take the edge values (the last 0.5% of the
        # run would otherwise go unjudged)
        out = np.interp(frac, x[ok], y[ok])
        return np.where((frac >= -1e-9) & (frac <= 1 + 1e-9), out, np.nan)

    def band_half_rel(self, frac: float) -> float:
        """The registered band's relative half-width (hi - lo) / 2 / forecast at ``frac``."""
        e, lo, hi = self.expected(np.array([frac]), alert=False)
        w = float((hi[0] - lo[0]) / 2 / e[0])
        return w if math.isfinite(w) else 0.0


@dataclass(frozen=True)
class Envelope:
    lo: np.ndarray
    hi: np.ndarray
    tol_below: float
    tol_above: float
    calibrated: bool


def _noise_sigma(noise) -> float:
    sigma = as_float(noise.get("sigma")) if isinstance(noise, Mapping) else None
    return sigma if sigma is not None and math.isfinite(sigma) and sigma > 0 else 0.0


def _f(v) -> float:
    x = as_float(v)
    return math.nan if x is None else x


# ------------------------------------------------------------------------------------ check


@dataclass
class CheckResult:
    alerts: list[Alert]
    state: dict

    @property
    def worst(self) -> str | None:
        return self.state.get("worst")

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.state.get("worst"), bool(self.state.get("not_applicable")))


def new_state() -> dict:
    return {"schema": "watch-state/1", "last_step": None, "last_point_time": None,
            "n_points": 0, "n_evals": 0, "worst": None, "not_applicable": None,
            "band": {"ema": None, "run_dir": None, "run_len": 0, "far_len": 0, "in_len": 0,
                     "level": None, "direction": None, "contingency_sent": False},
            "trend": {"hist": [], "run_len": 0, "in_len": 0, "base": None, "dir": None},
            "rise": {"min": None, "run_len": 0, "in_len": 0, "active": False},
            "signals": {}, "tails": {}, "nan_reported": [], "stalled": False,
            "grad_min": None, "notes_seen": 0}


def check(prereg: Mapping | PreregView, points: Batch | Iterable[Mapping], state: dict | None,
          *, now: float | None = None) -> CheckResult:
    """Judge new ``points`` against ``prereg``; returns the new alerts and the new state.

    Pure: ``state`` is not modified (a copy is returned), ``now`` (epoch seconds) is only used
    for alert times and the stalled rule. Passing the same points again after a restart with the
    returned state raises no alert twice: alerts fire on state changes only.
    """
    import copy

    view = prereg if isinstance(prereg, PreregView) else PreregView.of(prereg)
    st = copy.deepcopy(state) if state else new_state()
    now = _time.time() if now is None else float(now)
    stamp = _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime(now))
    batch = points if isinstance(points, Batch) else Batch.from_rows(points)
    alerts: list[Alert] = []

    def emit(a: Alert):
        alerts.append(a)
        if a.severity != "info" and (st["worst"] is None
                                     or _SEV_RANK[a.severity] > _SEV_RANK[st["worst"]]):
            st["worst"] = a.severity

    if st.get("not_applicable"):
        return CheckResult([], st)

    if _applicability_rule(view, batch, st, emit, stamp):
        return CheckResult(alerts, st)

    if not len(batch):
        _stalled_rule(view, st, emit, stamp, now)
        return CheckResult(alerts, st)

    # rewinds: a resumed run re-logs steps; rows are judged in arrival order, last one wins
    if st["last_step"] is not None and batch.step[0] <= st["last_step"]:
        emit(Alert(stamp, int(batch.step[0]), None, None, "rewind", "info",
                   message=f"steps from {int(batch.step[0])} logged again (resumed run?); the "
                           f"new rows replace the earlier ones (last one wins)"))

    frac = _fractions(view, batch)
    tokens = batch.col("tokens")

    eval_rules = [r for r in RULES if r.scope == "eval"]
    for rule in RULES:  # in registry order: the order their alerts are listed in
        if rule.scope == "batch":
            rule.judge(view, batch, frac, tokens, st, emit, stamp)
        elif rule is eval_rules[0]:
            _judge_evals(eval_rules, view, batch, frac, tokens, st, emit, stamp)

    st["last_step"] = int(batch.step[-1])
    st["n_points"] += len(batch)
    st["last_point_time"] = now
    if st["stalled"]:
        st["stalled"] = False
        emit(Alert(stamp, int(batch.step[-1]), None, None, "stalled", "info",
                   message="new points arrive again (stall cleared)"))
    return CheckResult(alerts, st)


def stalled_check(prereg, state: dict, *, now: float) -> CheckResult:
    """The stalled rule alone (called by the follower between polls that brought nothing)."""
    import copy
    view = prereg if isinstance(prereg, PreregView) else PreregView.of(prereg)
    return check(view, Batch.empty(), copy.deepcopy(state), now=now)


def _not_applicable(st, emit, stamp, step, reasons: list[str]) -> None:
    st["not_applicable"] = "; ".join(reasons)
    emit(Alert(stamp, step, None, None, "not_applicable", "warn",
               message="the forecast no longer applies, nothing is compared from here on: "
                       + st["not_applicable"]))


def _applicability_rule(view: PreregView, batch: Batch, st, emit, stamp) -> bool:
    """Whether an applicability condition is broken (then nothing is compared from here on): a
    run configuration in the source that differs from the registered one, or planned steps
    (implied by step / progress) that differ from the registered steps."""
    cfg = view.config
    for c in batch.configs:
        broken = applicability_breaks(view.applicability, c)
        if broken:
            _not_applicable(st, emit, stamp, None, broken)
            return True
    if len(batch) and "progress" in batch.cols:
        prog = batch.cols["progress"]
        ok = np.isfinite(prog) & (prog > 0) & (batch.step >= 1)
        if ok.any():
            implied = batch.step[ok] / prog[ok]
            rel = np.abs(implied - view.steps) / view.steps
            bad = np.flatnonzero(rel > max(cfg.steps_tolerance, 1.0 / view.steps))
            if bad.size:
                i = np.flatnonzero(ok)[bad[0]]
                msg = (f"planned steps changed: step {int(batch.step[i])} at progress "
                       f"{prog[i]:.4f} implies {implied[bad[0]]:.0f} planned steps, the "
                       f"pre-registration is for {view.steps}")
                _not_applicable(st, emit, stamp, int(batch.step[i]), [msg])
                return True

    return False


def _stalled_rule(view, st, emit, stamp, now):
    last = st.get("last_point_time")
    if last is None or st.get("stalled"):
        return
    if now - last > view.config.stalled_seconds:
        st["stalled"] = True
        emit(Alert(stamp, st.get("last_step"), None, None, "stalled", "warn",
                   message=f"no new point for {now - last:.0f} s (limit "
                           f"{view.config.stalled_seconds:g} s); last step {st.get('last_step')}"))


def row_fractions(view: PreregView, b: Batch) -> np.ndarray:
    """Where each row of ``b`` falls in the registered run (0..1), by the ``align`` rule."""
    return _fractions(view, b)


def _fractions(view: PreregView, b: Batch) -> np.ndarray:
    align = view.config.align
    tok = b.col("tokens")
    prog = b.col("progress")
    by_step = b.step.astype(float) / view.steps
    if align == "tokens":
        return tok / view.tokens
    if align == "step":
        return by_step
    if align == "fraction":
        return prog
    out = np.where(np.isfinite(tok), tok / view.tokens, by_step)
    return out


def applicability_breaks(app: Mapping, config: Mapping) -> list[str]:
    """The applicability conditions that ``config`` (a run-config/1 dict, a flat dict of fields, or
    a W&B config) definitely breaks. A key the config does not carry is not a break."""
    out = []
    facts = config_facts(config)
    for key in ("seq_len", "steps", "tokens"):
        want = app.get(key)
        have = facts.get(key)
        if want is None or have is None:
            continue
        if abs(float(have) - float(want)) > 1e-9 * max(1.0, abs(float(want))):
            out.append(f"{key} is {have:g} in the run, {want:g} in the pre-registration")
    registered = app.get("config")
    run_rung = config.get("rung") if isinstance(config.get("rung"), Mapping) else None
    compare = ["data_tag"]
    if isinstance(registered, Mapping) and run_rung is not None:
        # values, not a hash: a config that went through W&B comes back with 1.0 as 1
        diff = config_difference(registered, run_rung)
        if diff:
            out.append(f"the run's configuration differs from the registered one at rung.{diff}")
    else:
        compare.append("config_hash")
    for key in compare:
        want, have = app.get(key), facts.get(key)
        if want is not None and have is not None and str(want) != str(have):
            out.append(f"{key} is {have!r} in the run, {want!r} in the pre-registration")
    for key, want in (app.get("require") or {}).items():
        have = lookup(config, key)
        if have is _MISSING:
            continue
        if not _same(have, want):
            out.append(f"{key} is {have!r} in the run, required {want!r}")
    return out


_MISSING = object()


def config_difference(want, have, path: str = "") -> str | None:
    """The first key (dotted, in sorted order) where configuration ``have`` differs from ``want``
    in value, with both values; None when they agree. Numbers compare by value (1 == 1.0, as a
    round trip through W&B or YAML leaves them), booleans only with booleans; a registered
    "auto" matches whatever the run resolved it to."""
    if isinstance(want, Mapping) and isinstance(have, Mapping):
        for k in sorted(set(want) | set(have), key=str):
            where = f"{path}.{k}" if path else str(k)
            if k not in have:
                return f"{where} (absent in the run, {want[k]!r} registered)"
            if k not in want:
                return f"{where} ({have[k]!r} in the run, absent in the pre-registration)"
            d = config_difference(want[k], have[k], where)
            if d:
                return d
        return None
    if isinstance(want, (list, tuple)) and isinstance(have, (list, tuple)):
        if len(want) != len(have):
            return f"{path} ({len(have)} items in the run, {len(want)} registered)"
        for i, (a, b) in enumerate(zip(want, have)):
            d = config_difference(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    if want == "auto" and isinstance(have, str):
        # registered as "the backend's choice" (model.precision: bf16 on accelerators, f32 on
        # CPU); the trainer resolves it and the run's config.json says what ran
        return None
    num = (int, float)
    if isinstance(want, bool) or isinstance(have, bool):
        same = want is have or (isinstance(want, bool) and isinstance(have, bool)
                                and want == have)
    elif isinstance(want, num) and isinstance(have, num):
        same = want == have or abs(want - have) <= 1e-12 * max(abs(want), abs(have))
    else:
        same = want == have
    return None if same else f"{path} ({have!r} in the run, {want!r} registered)"


def lookup(d: Mapping, dotted: str):
    """``d['a']['b']`` for 'a.b'; also a flat key 'a.b', and 'rung.'/'train.' sections tried."""
    if dotted in d:
        return d[dotted]
    cur: Any = d
    for part in dotted.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            cur = _MISSING
            break
    if cur is not _MISSING:
        return cur
    for section in ("rung", "train"):
        sub = d.get(section)
        if isinstance(sub, Mapping):
            v = lookup(sub, dotted)
            if v is not _MISSING:
                return v
    return _MISSING


def _same(have, want) -> bool:
    if str(have) == str(want):
        return True
    a, b = as_float(have), as_float(want)
    if a is not None and b is not None:
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(have, bool):
        return str(have).lower() == str(want).lower()
    return False


def config_facts(config: Mapping) -> dict:
    """seq_len, steps, tokens, data_tag and config_hash of a run configuration, where known."""
    facts: dict[str, Any] = {}
    rung = config.get("rung") if isinstance(config.get("rung"), Mapping) else None
    src = rung if rung is not None else config
    for key in ("seq_len", "steps", "batch"):
        v = as_float(src.get(key))
        if v is not None:
            facts[key] = v
    if "tokens" in config and as_float(config["tokens"]) is not None:
        facts["tokens"] = as_float(config["tokens"])
    elif "steps" in facts and "batch" in facts and "seq_len" in facts:
        facts["tokens"] = facts["steps"] * facts["batch"] * facts["seq_len"]
    for holder in (config, config.get("train") if isinstance(config.get("train"), Mapping) else {}):
        if holder.get("data_tag") is not None:
            facts["data_tag"] = holder["data_tag"]
    if rung is not None:
        facts["config_hash"] = sha256_of(rung)
    elif config.get("config_hash") is not None:
        facts["config_hash"] = config["config_hash"]
    return facts


# ------------------------------------------------------------------------------------ rule 3a


def _nan_rule(view, b: Batch, frac, tokens, st, emit, stamp):
    keys = list(dict.fromkeys((view.metric,) + tuple(view.config.nan_keys)))
    for k in keys:
        nf = b.nonfinite.get(k)
        if nf is None or not nf.any() or k in st["nan_reported"]:
            continue
        i = int(np.flatnonzero(nf)[0])
        st["nan_reported"].append(k)
        emit(Alert(stamp, int(b.step[i]), _opt(tokens[i]), _opt(frac[i]), "nan", "critical",
                   value=None, message=f"{k} is not finite at step {int(b.step[i])}"))


def _opt(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------------------------ rules 1, 4


# A source that reads the metric's key as a column (the watcher's key filter names it) yields an
# empty column when the key is never logged; by 10% of the run a rung has logged two evals (it
# evaluates every 5% by default: ladder.train.TrainConfig.eval_every), so an empty column then
# means the key is missing.
_MISSING_METRIC_BY = 0.1


@dataclass
class EvalPoint:
    """One eval row as the loss rules see it: the metric ``y``, the forecast ``e`` and the alert
    band ``lo``..``hi`` at fraction ``f``, the raw residual ``r = y - e`` and its EMA ``ema`` (the
    smoothed value is ``e + ema``). ``raised`` is set by the band rule to the direction of an
    above/below-band alert it raised at this eval (the contingency rule follows it)."""

    step: int
    tokens: float | None
    f: float
    y: float
    e: float
    lo: float
    hi: float
    r: float
    ema: float
    raised: str | None = None


def _judge_evals(rules, view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """The loss rules, eval by eval in arrival order: the residual's EMA is updated once per eval
    and every rule of ``rules`` (scope "eval") sees the same :class:`EvalPoint`."""
    cfg = view.config
    y_all = b.cols.get(view.metric)
    if y_all is not None and not st.get("metric_seen"):
        if np.isfinite(y_all).any() or b.nonfinite.get(view.metric, np.zeros(0, bool)).any():
            st["metric_seen"] = True
        elif np.nanmax(frac, initial=0.0) >= _MISSING_METRIC_BY:
            y_all = None  # a source's column of the key, empty: as good as missing
    if y_all is None:
        if "missing_metric" not in st:
            st["missing_metric"] = True
            emit(Alert(stamp, int(b.step[-1]), None, None, "missing_metric", "info",
                       message=f"no '{view.metric}' in the rows read so far; loss is not compared "
                               f"until it appears (wrong --metric?)"))
        return
    idx = np.flatnonzero(np.isfinite(y_all) & np.isfinite(frac)
                         & (frac >= cfg.min_fraction - 1e-9))
    if not idx.size:
        return
    exp_all, lo_all, hi_all = view.expected(frac[idx])
    bs = st["band"]
    for j, i in enumerate(idx):
        y, f = float(y_all[i]), float(frac[i])
        e, lo, hi = float(exp_all[j]), float(lo_all[j]), float(hi_all[j])
        if not (math.isfinite(e) and math.isfinite(lo) and math.isfinite(hi)):
            continue
        st["n_evals"] += 1
        r = y - e
        bs["ema"] = r if bs["ema"] is None else cfg.ema_alpha * r + (1 - cfg.ema_alpha) * bs["ema"]
        ev = EvalPoint(step=int(b.step[i]), tokens=_opt(tokens[i]), f=f, y=y, e=e, lo=lo, hi=hi,
                       r=r, ema=bs["ema"])
        for rule in rules:
            rule.judge(view, st, ev, emit, stamp)


def _band_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1: the smoothed metric outside the alert band, with hysteresis."""
    cfg = view.config
    bs = st["band"]
    f, e, lo, hi, y = ev.f, ev.e, ev.lo, ev.hi, ev.y
    ys = e + ev.ema
    direction = "above" if ys > hi else "below" if ys < lo else None
    if direction:
        half = (hi - e) if direction == "above" else (e - lo)
        excess = (ys - hi) if direction == "above" else (lo - ys)
        far = excess > cfg.far_factor * half
        if bs["run_dir"] == direction:
            bs["run_len"] += 1
        else:
            bs["run_dir"], bs["run_len"], bs["far_len"] = direction, 1, 0
        bs["far_len"] = bs["far_len"] + 1 if far else 0
        bs["in_len"] = 0
        want = None
        if bs["run_len"] >= cfg.k_consecutive:
            want = "warn"
        if bs["run_len"] >= cfg.k_critical or (bs["far_len"] >= cfg.k_far
                                                and bs["run_len"] >= min(cfg.k_far,
                                                                         cfg.k_consecutive)):
            want = "critical"
        cur = bs["level"] if bs["direction"] == direction else None
        if want and (cur is None or _SEV_RANK[want] > _SEV_RANK[cur]):
            bs["level"], bs["direction"] = want, direction
            why = (f"{bs['run_len']} consecutive evals" if want == "warn" else
                   "far outside the band" if bs["far_len"] >= cfg.k_far and
                   bs["run_len"] < cfg.k_critical else f"{bs['run_len']} consecutive evals")
            worse = "worse" if direction == "above" else "better"
            emit(Alert(stamp, ev.step, ev.tokens, f, f"{direction}_band", want,
                       value=ys, expected=e, lo=lo, hi=hi, direction=worse,
                       message=f"{view.metric} {ys:.4f} (smoothed; raw {y:.4f}) is {worse} "
                               f"than forecast {e:.4f} [{lo:.4f}, {hi:.4f}] at "
                               f"{cfg.alert_level:.0%}: {why}"))
            ev.raised = direction
    else:
        bs["run_dir"], bs["run_len"], bs["far_len"] = None, 0, 0
        bs["in_len"] += 1
        if bs["level"] is not None and bs["in_len"] >= cfg.k_clear:
            emit(Alert(stamp, ev.step, ev.tokens, f, "cleared", "info",
                       value=ys, expected=e, lo=lo, hi=hi, direction=None,
                       message=f"{view.metric} back inside the band for {bs['in_len']} evals "
                               f"(was {bs['direction']}_band, {bs['level']})"))
            bs["level"], bs["direction"] = None, None


def _contingency_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 4: an above_band alert raised inside the first ``contingency_fraction`` of the run
    (once per run): the contingency advisory."""
    bs = st["band"]
    if ev.raised == "above" and ev.f <= view.config.contingency_fraction \
            and not bs["contingency_sent"]:
        bs["contingency_sent"] = True
        emit(_contingency(view, ev.step, ev.tokens, ev.f, ev.e + ev.ema, ev.e, stamp))


def _rise_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1c: the metric above its own running minimum for ``rise_k`` consecutive evals."""
    cfg = view.config
    f, y, step, tokens = ev.f, ev.y, ev.step, ev.tokens
    rs = st.setdefault("rise", {"min": None, "run_len": 0, "in_len": 0, "active": False})
    low = rs["min"]
    rs["min"] = y if low is None else min(low, y)
    if low is None or f < cfg.rise_after:
        return
    thr = max(cfg.rise_rel * low, cfg.rise_noise_k * view.eval_noise)
    if y - low > thr:
        rs["run_len"] += 1
        rs["in_len"] = 0
        if rs["run_len"] >= cfg.rise_k and not rs["active"]:
            rs["active"] = True
            emit(Alert(stamp, step, tokens, f, "rising", "warn", value=y, expected=low,
                       direction="worse",
                       message=f"{view.metric} {y:.4f} is {y / low - 1:+.2%} above its lowest "
                               f"value so far ({low:.4f}; threshold {thr:.4f}) for "
                               f"{rs['run_len']} consecutive evals: a healthy run's held-out "
                               f"loss does not rise", extra={"threshold": thr}))
    else:
        rs["run_len"] = 0
        if rs["active"]:
            rs["in_len"] += 1
            if rs["in_len"] >= cfg.k_clear:
                rs.update(active=False, in_len=0)
                emit(Alert(stamp, step, tokens, f, "cleared", "info", value=y, expected=low,
                           message=f"{view.metric} back within {thr:.4f} of its lowest value "
                                   f"(was rising)"))


def _trend_rule(view: PreregView, st, ev: EvalPoint, emit, stamp):
    """Rule 1b: the smoothed relative residual against its own median over an earlier window."""
    cfg = view.config
    f, rel, rel_smooth, step, tokens, e = ev.f, ev.r / ev.e, ev.ema / ev.e, ev.step, ev.tokens, ev.e
    ts = st.setdefault("trend", {"hist": [], "run_len": 0, "in_len": 0, "base": None,
                                 "dir": None})
    hist = ts["hist"]
    hist.append([f, rel])
    lo_f = f - cfg.trend_window - cfg.trend_gap
    while hist and hist[0][0] < lo_f - 1e-9:
        hist.pop(0)
    if f < cfg.trend_after:
        return
    if ts["dir"] is not None:  # alert active: clear when back near the level it left
        if abs(rel_smooth - ts["base"]) <= _trend_threshold(view, hist, f) / 2:
            ts["in_len"] += 1
            if ts["in_len"] >= cfg.k_clear:
                emit(Alert(stamp, step, tokens, f, "cleared", "info", value=e * (1 + rel_smooth),
                           expected=e, direction=None,
                           message=f"{view.metric} back within half the threshold of its "
                                   f"earlier level relative to the forecast (was trend, "
                                   f"{ts['dir']})"))
                ts.update(dir=None, base=None, in_len=0, run_len=0)
        else:
            ts["in_len"] = 0
        return
    base_vals = [v for g, v in hist if lo_f - 1e-9 <= g <= f - cfg.trend_gap + 1e-9]
    if len(base_vals) < 3:
        return
    base = float(np.median(base_vals))
    d = rel_smooth - base
    thr = _trend_threshold(view, hist, f)
    if abs(d) > thr:
        ts["run_len"] += 1
        if ts["run_len"] >= cfg.k_consecutive:
            worse = "worse" if d > 0 else "better"
            ts.update(dir=worse, base=base, in_len=0)
            # better than forecast is no risk to the run: recorded, not raised
            emit(Alert(stamp, step, tokens, f, "trend", "warn" if worse == "worse" else "info",
                       value=e * (1 + rel_smooth), expected=e * (1 + base), direction=worse,
                       message=f"{view.metric} moved {d:+.2%} of the forecast away from its own "
                               f"level over the preceding {cfg.trend_window:.0%} of the run "
                               f"({base:+.2%} -> {rel_smooth:+.2%} vs forecast; threshold "
                               f"{thr:.2%}): {worse}, for {ts['run_len']} evals",
                       extra={"threshold": thr}))
    else:
        ts["run_len"] = 0


def _trend_threshold(view: PreregView, hist: list, f: float) -> float:
    """The trend rule's threshold (relative to the forecast) at fraction ``f``: the largest of the
    configured floor, a share of the registered band's relative half-width, and a multiple of
    the smoothed residual's own noise. The noise is robust: 1.4826 x the median absolute first
    difference of the raw relative residuals / sqrt(2) (a slow drift barely changes first
    differences), scaled by the EMA's sd factor sqrt(alpha / (2 - alpha))."""
    cfg = view.config
    thr = max(cfg.trend_rel, cfg.trend_band * view.band_half_rel(f))
    if len(hist) >= 8:
        r = np.array([v for _, v in hist])
        sd = 1.4826 * float(np.median(np.abs(np.diff(r)))) / math.sqrt(2)
        a = cfg.ema_alpha
        thr = max(thr, cfg.trend_noise_k * sd * math.sqrt(a / (2 - a)))
    return thr


def _contingency(view: PreregView, step: int, tok: float | None, f, ys, e, stamp) -> Alert:
    """Projected final value if the run continues, and the token budget that would still reach the
    registered final value. The deviation is taken as a constant ratio of the loss to the
    forecast (the same relative offset to the end of the run); the budget comes from the
    pre-registration's ``budget_curve`` (the law's final loss against token budget)."""
    ratio = ys / e
    projected = view.final * ratio
    bc = view.budget
    budget_msg = "no budget curve in the pre-registration"
    needed = None
    mult = np.array([_f(v) for v in bc.get("multiplier", [])])
    fl = np.array([_f(v) for v in bc.get("loss", [])])
    if mult.size >= 2 and np.isfinite(fl).all():
        scaled = fl * ratio
        # final loss falls with the budget: the smallest budget whose scaled loss <= registered
        ok = np.flatnonzero(scaled <= view.final)
        if ok.size == 0:
            budget_msg = (f"not reached within {mult.max():g}x the planned tokens "
                          f"({mult.max() * view.tokens:.3g})")
        else:
            k = int(ok[0])
            if k == 0:
                needed = float(mult[0])
            else:  # linear interpolation between the bracketing budgets
                x0, x1, y0, y1 = mult[k - 1], mult[k], scaled[k - 1], scaled[k]
                needed = float(x0 + (view.final - y0) * (x1 - x0) / (y1 - y0))
            budget_msg = (f"the registered final {view.final:.4f} would still be reached at about "
                          f"{needed:.2f}x the planned tokens ({needed * view.tokens:.3g} tokens)")
    if mult.size >= 2 and np.isfinite(fl).all():  # the law's finals for shorter plans
        short = [(m, x * ratio) for m, x in zip(mult, fl) if m < 1 and m in (0.5, 0.6, 0.7, 0.85)]
        if short:
            budget_msg += ("; shortened with the LR decay re-aimed to the new end: " + ", ".join(
                f"{m:g}x -> {x:.4f}" for m, x in short) + f" (as planned: {projected:.4f})")
    return Alert(stamp, step, tok, f, "contingency", "info", value=projected,
                 expected=view.final, lo=view.final_lo, hi=view.final_hi, direction="worse",
                 message=f"deviation confirmed at {f:.1%} of the token budget (inside the first "
                         f"{view.config.contingency_fraction:.0%}): if the run continues, final "
                         f"{view.metric} ~ {projected:.4f} vs registered {view.final:.4f}; "
                         f"{budget_msg}. Consider shortening and re-aiming the LR decay, then "
                         f"`ladder preregister --amend`.",
                 extra={"projected_final": projected, "budget_multiplier": needed})


# ------------------------------------------------------------------------------------ rules 2, 3


def _trailing(st, key: str, x: np.ndarray, window: int) -> np.ndarray:
    """x with the previous batch's last ``window`` finite values prepended (state carries them)."""
    tail = np.array(st["tails"].get(key, []), dtype=float)
    both = np.concatenate([tail, x])
    fin = both[np.isfinite(both)]
    st["tails"][key] = fin[-window:].tolist()
    return both, tail.size


def _rolling_median(x: np.ndarray, window: int, *, shift: bool) -> np.ndarray:
    """Trailing median over the finite values (NaN rows skipped); ``shift`` excludes the row."""
    import pandas as pd
    s = pd.Series(x)
    fin = s.dropna()
    med = fin.rolling(window, min_periods=max(1, window // 4)).median()
    if shift:
        med = med.shift(1)
    return med.reindex(s.index).to_numpy(dtype=float)


def _spike_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Train-loss spikes: train loss vs trailing median + k x robust sd of the rows before it."""
    cfg = view.config
    if "train/loss" not in b.cols:
        return
    from predict.forecast import spike_scores
    x = b.cols["train/loss"]
    both, off = _trailing(st, "train/loss", x, 2 * cfg.spike_window)
    with np.errstate(all="ignore"):
        sc = spike_scores(both, cfg.spike_window)
    z, med = sc.z[off:], sc.median[off:]
    spike = (np.isfinite(x) & np.isfinite(med) & (x > med * (1 + cfg.spike_rel))
             & ((z > cfg.spike_k) | (np.isinf(z) & (z > 0))))
    _spikes(spike, x, med, z, b, frac, tokens, st, emit, stamp, cfg)


def _grad_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Grad norm: level vs the ladder's, growth since its post-warmup minimum."""
    cfg = view.config
    if "grad/norm" not in b.cols:
        return
    n = len(b)
    x = b.cols["grad/norm"]
    both, off = _trailing(st, "grad/norm", x, cfg.grad_window)
    med = _rolling_median(both, cfg.grad_window, shift=False)[off:]
    after = np.isfinite(med) & (frac >= cfg.grad_after)
    gmin = st.get("grad_min")
    run_min = np.fmin.accumulate(np.where(after, med, np.inf)) if n else np.zeros(0)
    if gmin is not None:
        run_min = np.minimum(run_min, gmin)
    if n and np.isfinite(run_min[-1]):
        st["grad_min"] = float(run_min[-1])
    growth = np.where(after & np.isfinite(run_min), med / run_min, np.nan)
    sev = np.where(growth > cfg.grad_growth_warn, 1, 0)
    ref = view.reference("grad/norm", frac)
    ratio = None
    if ref is not None:
        ratio = med / ref
        sev = np.maximum(sev, np.where(after & (ratio > cfg.grad_ref_warn), 1, 0))
        sev = np.maximum(sev, np.where(after & (ratio > cfg.grad_ref_crit), 2, 0))
    sev = np.where(np.isfinite(med) & after, sev, -1)

    def describe(i, level):
        parts = [f"grad norm (median of {cfg.grad_window}) {med[i]:.3g}"]
        if math.isfinite(growth[i]):
            parts.append(f"{growth[i]:.1f}x its post-warmup minimum")
        if ratio is not None and math.isfinite(ratio[i]):
            parts.append(f"{ratio[i]:.1f}x the ladder's {ref[i]:.3g} at this fraction")
        return ", ".join(parts)
    _level_signal("grad_norm", "grad/norm", sev, med, ref, b, frac, tokens, st, emit, stamp, cfg,
                  describe)


def _drop_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Token-drop fraction vs the ladder's widened envelope at the same fraction."""
    cfg = view.config
    if "moe/drop_frac" not in b.cols:
        return
    n = len(b)
    x = b.cols["moe/drop_frac"]
    both, off = _trailing(st, "moe/drop_frac", x, cfg.drop_window)
    med = _rolling_median(both, cfg.drop_window, shift=False)[off:]
    env = view.envelope("moe/drop_frac", frac)
    ref = None
    if env is not None:
        ref = env.hi
        warn_t = np.fmax(env.hi * math.exp(env.tol_above + cfg.envelope_margin), cfg.drop_floor)
        crit_t = cfg.drop_crit_factor * warn_t
        warn_t = np.where(np.isfinite(ref), warn_t, cfg.drop_warn_abs)
        crit_t = np.where(np.isfinite(ref), crit_t, cfg.drop_crit_abs)
    else:
        warn_t = np.full(n, cfg.drop_warn_abs)
        crit_t = np.full(n, cfg.drop_crit_abs)
    sev = np.where(med > crit_t, 2, np.where(med > warn_t, 1, 0))
    sev = np.where(np.isfinite(med), sev, -1)

    def describe(i, level):
        against = (f"the ladder's max {ref[i]:.2%} at this fraction, widened" if ref is
                   not None and math.isfinite(ref[i])
                   else "the absolute limits (no ladder reference)")
        return (f"token-drop fraction (median of {cfg.drop_window}) {med[i]:.2%}: above "
                f"{(crit_t if level == 2 else warn_t)[i]:.2%}, against {against}")
    _level_signal("drop_frac", "moe/drop_frac", sev, med, ref, b, frac, tokens, st, emit, stamp,
                  cfg, describe)


def _envelope_signal(view: PreregView, b: Batch, frac, tokens, st, emit, stamp, key: str,
                     side: str, name: str):
    """A router signal below (``side`` "below") or above its envelope: the ladder's range at the
    same fraction widened by the ladder's own tolerance plus ``envelope_margin``."""
    cfg = view.config
    if key not in b.cols:
        return
    env = view.envelope(key, frac)
    if env is None:
        return
    x = b.cols[key]
    both, off = _trailing(st, key, x, cfg.drop_window)
    med = _rolling_median(both, cfg.drop_window, shift=False)[off:]
    if side == "below":
        tol = env.tol_below + cfg.envelope_margin
        limit = env.lo * math.exp(-tol)
        bad = med < limit
    else:
        tol = env.tol_above + cfg.envelope_margin
        limit = env.hi * math.exp(tol)
        bad = med > limit
    sev = np.where(np.isfinite(med) & np.isfinite(limit), np.where(bad, 1, 0), -1)
    edge = env.lo if side == "below" else env.hi

    def describe(i, lv):
        return (f"{name} {med[i]:.3g} (median of {cfg.drop_window}) {side} {limit[i]:.3g}: the "
                f"ladder's range {env.lo[i]:.3g}..{env.hi[i]:.3g} at this fraction widened by "
                f"x{math.exp(tol):.2f} (tolerance "
                f"{'measured leave-one-rung-out' if env.calibrated else 'by default'} + margin)")
    _level_signal("router", key, sev, med, edge, b, frac, tokens, st, emit, stamp, cfg, describe)


def _entropy_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Router entropy below the ladder's widened envelope (a collapse: entropy -> 0)."""
    _envelope_signal(view, b, frac, tokens, st, emit, stamp, "moe/router_entropy", "below",
                     "router entropy")


def _load_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Expert load max/mean above the ladder's widened envelope (a collapse: -> n_experts/top_k)."""
    _envelope_signal(view, b, frac, tokens, st, emit, stamp, "moe/load_max_over_mean", "above",
                     "expert load max/mean")


def _router_bias_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """``router_bias`` judged on its own: set by a balancing rule, not by gradients, it spikes
    early by design; after ``router_bias_after`` a jump over its trailing median warns."""
    cfg = view.config
    key = "params/norm/router_bias"
    if key not in b.cols:
        return
    both, off = _trailing(st, key, b.cols[key], cfg.grad_window)
    med = _rolling_median(both, cfg.grad_window, shift=False)[off:]
    prev = _rolling_median(both, cfg.spike_window, shift=True)[off:]
    jump = np.abs(med) / np.abs(prev)
    sev = np.where(np.isfinite(jump) & (frac >= cfg.router_bias_after),
                   np.where(jump > cfg.router_bias_jump, 1, 0), -1)
    _level_signal("router", key, sev, med, None, b, frac, tokens, st, emit, stamp, cfg,
                  lambda i, lv: f"router_bias norm {med[i]:.3g} is {jump[i]:.1f}x its trailing "
                                f"median (judged on its own: not gradient-trained)")


def _param_norm_rule(view: PreregView, b: Batch, frac, tokens, st, emit, stamp):
    """Parameter norms per group (``router_bias`` aside) against the ladder's growth."""
    cfg = view.config
    for key in sorted(k for k in b.cols if k.startswith("params/norm/")):
        if key == "params/norm/router_bias":
            continue
        x = b.cols[key]
        both, off = _trailing(st, key, x, cfg.grad_window)
        med = _rolling_median(both, cfg.grad_window, shift=False)[off:]
        ref = view.reference(key, frac)  # the ladder's norm relative to its value at grad_after
        base_key = f"param_base/{key}"
        base = st.get(base_key)
        if base is None:
            ok = np.flatnonzero(np.isfinite(med) & (frac >= cfg.grad_after))
            if ok.size:
                base = float(med[ok[0]])
                st[base_key] = base
        if ref is None or base is None or not base:
            continue
        growth = med / base
        rel = growth / ref
        bad = (rel > cfg.param_growth_ratio) | (rel < 1 / cfg.param_growth_ratio)
        sev = np.where(np.isfinite(rel) & (frac >= cfg.grad_after), np.where(bad, 1, 0), -1)
        _level_signal("param_norm", key, sev, med, None, b, frac, tokens, st, emit, stamp, cfg,
                      lambda i, lv, key=key, growth=growth, ref=ref:
                      f"{key} grew {growth[i]:.2f}x since {cfg.grad_after:.0%} of the run; "
                      f"the ladder's grew {ref[i]:.2f}x by this fraction")


def _spikes(spike, x, med, z, b, frac, tokens, st, emit, stamp, cfg):
    idx = np.flatnonzero(spike)
    if not idx.size:
        return
    last = st.get("last_spike_step")
    for i in idx:
        s = int(b.step[i])
        if last is not None and 0 <= s - last <= cfg.spike_window:
            continue  # one alert per burst of spikes
        last = s
        emit(Alert(stamp, s, _opt(tokens[i]), _opt(frac[i]), "spike", "warn", value=float(x[i]),
                   expected=float(med[i]), direction="worse",
                   message=f"train/loss {x[i]:.4f} is {x[i] / med[i] - 1:.1%} above its trailing "
                           f"median {med[i]:.4f} ({z[i]:.1f} robust sd; limit {cfg.spike_k:g})",
                   extra={"z": _opt(z[i])}))
    st["last_spike_step"] = last


def _level_signal(kind, key, sev, value, ref, b: Batch, frac, tokens, st, emit, stamp, cfg,
                  describe):
    """A health signal with hysteresis. ``sev`` per row: -1 unknown (skipped), 0 fine, 1 warn,
    2 critical. A level must hold for ``k_health`` judged rows to be raised (escalations alert),
    and be gone for ``k_health_clear`` rows to clear. Loops over runs of equal ``sev`` only."""
    s = st["signals"].setdefault(key, {"level": 0, "run_sev": None, "run_len": 0})
    judged = np.flatnonzero(sev >= 0)
    if not judged.size:
        return
    sv = sev[judged]
    starts = np.flatnonzero(np.concatenate([[True], sv[1:] != sv[:-1]]))
    ends = np.concatenate([starts[1:], [sv.size]])
    for a, e in zip(starts, ends, strict=True):
        level = int(sv[a])
        length = int(e - a)
        if s["run_sev"] == level:
            prior = s["run_len"]
        else:
            prior = 0
        total = prior + length
        s["run_sev"], s["run_len"] = level, total
        if level > s["level"]:
            if total >= cfg.k_health:
                at = judged[a + max(0, cfg.k_health - prior - 1)]
                s["level"] = level
                sev_name = "critical" if level == 2 else "warn"
                emit(Alert(stamp, int(b.step[at]), _opt(tokens[at]), _opt(frac[at]), kind,
                           sev_name, value=_opt(value[at]),
                           expected=None if ref is None else _opt(ref[at]),
                           direction="above" if kind != "router" else None,
                           message=describe(at, level) + f" ({key})", extra={"key": key}))
        elif level < s["level"]:
            need = cfg.k_health_clear if level == 0 else cfg.k_health
            if total >= need:
                at = judged[a + max(0, need - prior - 1)]
                old = s["level"]
                s["level"] = level
                if level == 0:
                    emit(Alert(stamp, int(b.step[at]), _opt(tokens[at]), _opt(frac[at]),
                               "cleared", "info", value=_opt(value[at]),
                               message=f"{key} back to normal for {need} rows (was {kind}, "
                                       f"{'critical' if old == 2 else 'warn'})"))


# ------------------------------------------------------------------------------------ the rules
#
# Each rule declares what it reads, what it raises, the state it keeps and its slice of the
# decision rule in words; the watcher's key filter (``watched_keys``), the pre-registration's
# ``decision_rule.words`` (``WatchConfig.words``) and the report's alert kinds (``alert_kinds``)
# are all derived from this registry, so a rule cannot be added without being read, described
# and drawn.


@dataclass(frozen=True)
class Rule:
    """One rule of the decision rule.

    ``scope`` says how :func:`check` calls ``judge``: "batch" rules see the whole batch
    ``judge(view, batch, frac, tokens, st, emit, stamp)``; "eval" rules see one eval at a time
    ``judge(view, st, EvalPoint, emit, stamp)`` (the loss rules, which share the residual's EMA);
    "run" rules are judged by :func:`check` itself before anything else (applicability, stalled,
    the input's own remarks). ``keys(metric, config)`` names the metric keys it reads, plus every
    key starting with one of ``prefixes``; ``state`` the entries of the watcher state it owns;
    ``panel`` where the report draws its alerts ("watch": the loss plot, "health": the health
    panels of the keys it reads, None: listed only)."""

    name: str
    scope: str
    kinds: tuple[str, ...]
    state: tuple[str, ...]
    description: str
    words: Callable[[WatchConfig, float], str]                  # (config, band level) -> text
    keys: Callable[[str, WatchConfig], tuple] | None = None      # (metric, config) -> keys
    prefixes: tuple[str, ...] = ()
    judge: Callable[..., None] | None = None
    panel: str | None = None

    def __post_init__(self):
        if self.scope not in ("run", "batch", "eval"):
            raise ValueError(f"scope: must be run, batch or eval, got {self.scope!r}")
        if self.scope != "run" and self.judge is None:
            raise ValueError(f"judge: a {self.scope} rule needs a judge ({self.name})")
        if self.panel not in (None, "watch", "health"):
            raise ValueError(f"panel: must be watch, health or null, got {self.panel!r}")

    def reads(self, metric: str, config: WatchConfig) -> tuple[str, ...]:
        return tuple(self.keys(metric, config)) if self.keys else ()


def _metric_key(metric, cfg):
    return (metric,)


def _words_band(c: WatchConfig, level: float) -> str:
    return (f"Loss: the eval metric's residual against the forecast, smoothed by an EMA "
            f"(alpha {c.ema_alpha}), outside the band widened from {level:.0%} to "
            f"{c.alert_level:.0%} (half-widths x z({c.alert_level})/z({level}), Gaussian) "
            f"for {c.k_consecutive} consecutive evals is a warning (above_band = worse than "
            f"forecast, below_band = better); outside for {c.k_critical} evals, or beyond the "
            f"band by {c.far_factor}x its half-width for {c.k_far} evals, is critical; inside "
            f"again for {c.k_clear} evals clears it. Evals before {c.min_fraction:.0%} of "
            f"the run are not compared.")


def _words_trend(c: WatchConfig, level: float) -> str:
    return (f"After {c.trend_after:.0%} of the run, the smoothed residual moving from its own "
            f"median over the preceding {c.trend_window:.0%} of the run (ending "
            f"{c.trend_gap:.0%} before) by more than the largest of {c.trend_rel:.0%} of the "
            f"forecast, {c.trend_band}x the band's relative half-width there and "
            f"{c.trend_noise_k}x the smoothed residual's own noise, for {c.k_consecutive} "
            f"evals, is a 'trend' warning when worse than forecast (info when better), cleared "
            f"when it is back within half that of the earlier level for {c.k_clear} evals.")


def _words_rise(c: WatchConfig, level: float) -> str:
    return (f"From {c.rise_after:.0%} of the run, the metric above its lowest value so far by "
            f"more than {c.rise_rel:.0%} of it (and {c.rise_noise_k}x the ladder's eval noise) "
            f"for {c.rise_k} consecutive evals is a 'rising' warning.")


def _words_contingency(c: WatchConfig, level: float) -> str:
    return (f"A confirmed above_band deviation inside the first {c.contingency_fraction:.0%} of "
            f"the token budget adds a contingency advisory.")


def _words_drop(c: WatchConfig, level: float) -> str:
    return (f"Token-drop fraction (trailing median of {c.drop_window} rows) above the ladder's "
            f"max at the same fraction widened as below for the router warns, above "
            f"{c.drop_crit_factor}x that is critical (without a ladder reference: "
            f"{c.drop_warn_abs} / {c.drop_crit_abs}); never below {c.drop_floor}.")


def _words_nan(c: WatchConfig, level: float) -> str:
    return f"A non-finite {', '.join(c.nan_keys)} or metric is critical at once."


def _words_grad(c: WatchConfig, level: float) -> str:
    return (f"Grad norm (median of {c.grad_window} rows, after {c.grad_after:.0%} of the run) "
            f"grown {c.grad_growth_warn}x since its post-warmup minimum, or {c.grad_ref_warn}x "
            f"the ladder's, warns; {c.grad_ref_crit}x the ladder's is critical.")


def _words_spike(c: WatchConfig, level: float) -> str:
    return (f"Train loss above its trailing median of {c.spike_window} rows by more than "
            f"{c.spike_k:g}x the robust sd (1.4826 x MAD; k = {c.spike_k_margin}x the largest "
            f"such z-score of the ladder's healthy runs, at least the default) and more than "
            f"{c.spike_rel:.0%} is a spike.")


def _words_envelope(what: str):
    def words(c: WatchConfig, level: float) -> str:
        return (f"{what} the range of the ladder's rungs at the same fraction widened by the "
                f"ladder's own leave-one-rung-out tolerance (within "
                f"{c.envelope_tol}..{c.envelope_tol_max}; {c.envelope_tol} without one) plus "
                f"{c.envelope_margin} (log units) warns.")
    return words


def _words_router_bias(c: WatchConfig, level: float) -> str:
    return (f"router_bias is judged on its own after {c.router_bias_after:.0%} of the run "
            f"(> {c.router_bias_jump}x its trailing median).")


def _words_param_norm(c: WatchConfig, level: float) -> str:
    return (f"A parameter-norm group whose growth differs from the ladder's by more than "
            f"{c.param_growth_ratio}x warns. Health conditions must hold for {c.k_health} rows "
            f"and be gone for {c.k_health_clear} rows to clear.")


def _words_stalled(c: WatchConfig, level: float) -> str:
    return f"No new point for {c.stalled_seconds:g} s is 'stalled'."


def _words_applicability(c: WatchConfig, level: float) -> str:
    return (f"A broken applicability condition (the run's configuration, compared value by "
            f"value; planned steps from step/progress off by more than "
            f"{c.steps_tolerance:.1%}) stops all comparison: not_applicable.")


def _words_input(c: WatchConfig, level: float) -> str:
    return ("Steps logged again (a resumed run) replace the earlier rows (last one wins): "
            "'rewind' (info); no registered metric in the rows: 'missing_metric' (info).")


# Registry order is the order the rules judge a batch (and list their alerts).
RULES: tuple[Rule, ...] = (
    Rule("applicability", "run", ("not_applicable",), ("not_applicable",),
         "the run is still the one the forecast was made for (configuration, planned steps)",
         _words_applicability, keys=lambda m, c: ("progress",)),
    Rule("input", "run", ("rewind", "missing_metric"), ("last_step", "missing_metric"),
         "remarks on the rows themselves: steps logged again, the metric missing",
         _words_input),
    Rule("nan", "batch", ("nan",), ("nan_reported",),
         "a non-finite metric, train loss, grad norm or eval loss (critical at once)",
         _words_nan, keys=lambda m, c: (m, *c.nan_keys), judge=_nan_rule, panel="watch"),
    Rule("rising", "eval", ("rising", "cleared"), ("rise",),
         "the held-out metric rising above its own running minimum",
         _words_rise, keys=_metric_key, judge=_rise_rule, panel="watch"),
    Rule("trend", "eval", ("trend", "cleared"), ("trend",),
         "the residual to the forecast moving away from its own earlier level (inside the band)",
         _words_trend, keys=_metric_key, judge=_trend_rule, panel="watch"),
    Rule("band", "eval", ("above_band", "below_band", "cleared"), ("band", "n_evals"),
         "the smoothed metric outside the forecast band, with hysteresis",
         _words_band, keys=_metric_key, judge=_band_rule, panel="watch"),
    Rule("contingency", "eval", ("contingency",), ("band.contingency_sent",),
         "a confirmed deviation early in the run: projected final value and the budget to reach "
         "the registered one", _words_contingency, keys=_metric_key, judge=_contingency_rule,
         panel="watch"),
    Rule("spike", "batch", ("spike",), ("tails.train/loss", "last_spike_step"),
         "train-loss spikes against a robust trailing median",
         _words_spike, keys=lambda m, c: ("train/loss",), judge=_spike_rule),
    Rule("grad_norm", "batch", ("grad_norm", "cleared"), ("signals.grad/norm", "grad_min"),
         "grad norm against the ladder's and its growth since warmup",
         _words_grad, keys=lambda m, c: ("grad/norm",), judge=_grad_rule, panel="health"),
    Rule("drop_frac", "batch", ("drop_frac", "cleared"), ("signals.moe/drop_frac",),
         "the token-drop fraction against the ladder's envelope at the same fraction",
         _words_drop, keys=lambda m, c: ("moe/drop_frac",), judge=_drop_rule, panel="health"),
    Rule("router_entropy", "batch", ("router", "cleared"), ("signals.moe/router_entropy",),
         "router entropy below the ladder's envelope (a collapse)",
         _words_envelope("Router entropy below"), keys=lambda m, c: ("moe/router_entropy",),
         judge=_entropy_rule, panel="health"),
    Rule("expert_load", "batch", ("router", "cleared"), ("signals.moe/load_max_over_mean",),
         "expert load max/mean above the ladder's envelope (a collapse onto few experts)",
         _words_envelope("Expert load max/mean above"),
         keys=lambda m, c: ("moe/load_max_over_mean",), judge=_load_rule, panel="health"),
    Rule("router_bias", "batch", ("router", "cleared"), ("signals.params/norm/router_bias",),
         "the router-bias norm jumping over its trailing median (it is not gradient-trained)",
         _words_router_bias, keys=lambda m, c: ("params/norm/router_bias",),
         judge=_router_bias_rule, panel="health"),
    Rule("param_norm", "batch", ("param_norm", "cleared"), ("signals.params/norm/*",
                                                            "param_base/*"),
         "parameter-norm growth per group against the ladder's",
         _words_param_norm, prefixes=("params/norm/",), judge=_param_norm_rule, panel="health"),
    Rule("stalled", "run", ("stalled",), ("stalled", "last_point_time"),
         "no new point for a while", _words_stalled, panel="watch"),
)
# keys every rule needs to place a row on the forecast (DESIGN.md section 3: metrics.jsonl)
ALIGN_KEYS = ("tokens", "progress")


def rule(name: str) -> Rule:
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(name)


def watched_keys(metric: str, config: WatchConfig | None = None) -> tuple[KeyFilter, list[str]]:
    """The key filter of a source (which keys the rules read) and its fixed keys, sorted."""
    cfg = config or WatchConfig()
    fixed = set(ALIGN_KEYS)
    prefixes: list[str] = []
    for r in RULES:
        fixed.update(r.reads(metric, cfg))
        prefixes += [p for p in r.prefixes if p not in prefixes]
    return KeyFilter(frozenset(fixed), tuple(prefixes)), sorted(fixed)


def alert_kinds(panel: str | None = None) -> frozenset[str]:
    """Alert kinds the rules raise (of rules drawn on ``panel``, when given); "cleared" is shared
    by several rules and left out of a panel's set (its message says what cleared)."""
    out = {k for r in RULES if panel is None or r.panel == panel for k in r.kinds}
    return frozenset(out if panel is None else out - {"cleared"})


def health_alert_kinds(config: WatchConfig | None = None) -> dict[str, tuple]:
    """For each fixed key a health-panel rule reads (and the non-finite rule's keys, the
    registered metric aside), the alert kinds raised about it."""
    cfg = config or WatchConfig()
    out: dict[str, list] = {}
    for r in RULES:
        if r.panel != "health" and r.name != "nan":
            continue
        for k in r.reads("", cfg):
            if not k:  # the registered metric's place: not a health key
                continue
            out.setdefault(k, [])
            out[k] += [x for x in r.kinds if x != "cleared" and x not in out[k]]
    return {k: tuple(v) for k, v in out.items()}
