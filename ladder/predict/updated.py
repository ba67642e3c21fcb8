"""The updated forecast: where the run will land, given its own evals so far (issue 40 item 1).

The frozen pre-registration never changes; beside it the watcher keeps this forecast, always
labelled "updated": the frozen curve moved by a run-level offset learned from the run's evals.

Model (Gaussian, pinned at the end of the run): the log-ratio of the run's eval to the frozen
forecast at fraction ``x``, ``d(x) = log(y(x) / f(x))``, is the final offset ``s1`` plus a
departure ``u(x)`` that vanishes at the end, plus eval noise,

    d_i = s1 + u(x_i) + e_i,    e_i ~ N(0, sigma^2),   s1 ~ N(0, tau^2)
    Var u(x) = q t(x) + b^2 max(w(x)^2 - tau^2, 0),   t(x) = 1/x - 1

An early eval says less about the end than a late one (the clock t; the public curves chose
1/x - 1 over log 1/x and 1 - x), and may say less where the frozen band is wider than at the end
(``w(x)``, the frozen band's log half-width over z; on the OLMo ladder the band at 10% is 4x the
final's; the weight ``b`` is learned). ``tau``, the frozen final band's log half-width over
z(level), is the prior: with no evals the frozen final comes back, with its width.

The posterior comes from a forward Kalman filter: ``s(x) = s1 + u(x)`` is Gauss-Markov with
variance ``V(x) = tau^2 + Var u(x)``, non-increasing in ``x``, and for ``x' > x``,
``s(x') | s(x) ~ N(a s(x), V(x') - a V(x'))``, ``a = V(x') / V(x)``. The final loss is
``f(1) exp(s1)``, its band that normal's ``level`` interval widened by ``inflation``; the curve
ahead is predicted the same way. ``sigma`` is the run's own eval-to-eval noise (robust, over the
latest evals), floored at ``sigma_floor``. Two evals in a row far from the prediction on one
side let the level go (:meth:`FilterState.step`), so a fault is followed.

The clock, ``q``, ``b`` and ``inflation`` are chosen leave-one-ladder-out on the public full
curves (bench/live_forecast.py: the OLMo ladder, Gemstones, the MPL schedules, Schaipp's
schedules); the defaults are the values learned on all four (docs/live_forecast.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ladder.predict.band import z_of


# the departure's clocks t(x): 0 at the end of the run, growing toward its start
CLOCKS = {"inverse": lambda x: 1.0 / x - 1.0, "log": lambda x: -np.log(x),
          "linear": lambda x: 1.0 - x}


@dataclass(frozen=True)
class UpdateConfig:
    """The updated forecast's dials, learned on the 4 public curve groups (the module doc)."""

    q: float = 3.2e-5          # rate of the departure's variance per unit of its clock
    inflation: float = 0.8     # the band's half-width x this (1: the model's own)
    sigma_floor: float = 1e-3  # eval noise (log): a smooth eval set's is below it, and the floor
    #                            keeps one eval from pinning the level
    min_fraction: float = 0.02  # evals before are not used (warmup: a guess at a steep start)
    intervene: float = 3.0     # sd beyond which two innovations let the level go; 0: never
    clock: str = "inverse"     # the departure's clock t(x) (:func:`t_of`)
    band_weight: float = 0.0   # ``b``: the frozen band's excess width (:func:`offset_var`)

    def __post_init__(self):
        if not (isinstance(self.intervene, (int, float)) and self.intervene >= 0):
            raise ValueError(f"intervene: must be >= 0, got {self.intervene!r}")
        for name in ("q", "inflation", "sigma_floor", "band_weight"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0) or \
                    (v == 0 and name != "band_weight"):
                raise ValueError(f"{name}: must be a positive number, got {v!r}")
        if not (0.0 <= self.min_fraction < 1.0):
            raise ValueError(f"min_fraction: must be in [0, 1), got {self.min_fraction!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock: must be inverse, log or linear, got {self.clock!r}")


@dataclass(frozen=True)
class Updated:
    """The updated forecast after the evals up to fraction ``at``: the final loss and its band at
    ``level``, the log offset's mean and sd, and the curve ahead (the frozen grid's points after
    ``at``)."""

    at: float
    n_evals: int
    level: float
    final: float
    lo: float
    hi: float
    offset: float
    offset_sd: float
    fraction: np.ndarray
    loss: np.ndarray
    curve_lo: np.ndarray
    curve_hi: np.ndarray

    def to_json(self) -> dict:
        return {"label": "updated", "at_fraction": self.at, "n_evals": self.n_evals,
                "level": self.level, "final": {"loss": self.final, "lo": self.lo, "hi": self.hi},
                "offset": self.offset, "offset_sd": self.offset_sd,
                "curve": [{"fraction": float(f), "loss": float(v), "lo": float(a),
                           "hi": float(b)} for f, v, a, b in
                          zip(self.fraction, self.loss, self.curve_lo, self.curve_hi)]}


def prior_sd(final: float, lo: float, hi: float, level: float) -> float:
    """The frozen final band's wider log half-width over z(level): the offset's prior sd."""
    half = max(math.log(hi / final), math.log(final / lo))
    return max(half, 1e-6) / z_of(level)


def robust_noise(d: np.ndarray, floor: float) -> float:
    """Eval-to-eval noise of the log offset: 1.4826 x median |first difference| / sqrt(2) (a
    slow drift barely changes first differences), at least ``floor``."""
    if d.size < 4:
        return floor
    sd = 1.4826 * float(np.median(np.abs(np.diff(d)))) / math.sqrt(2.0)
    return max(sd, floor)


def t_of(x, kind: str = "inverse"):
    """The departure's clock ``kind`` (:data:`CLOCKS`) at fractions ``x``."""
    return CLOCKS[kind](np.clip(np.asarray(x, float), 1e-6, 1.0))


def offset_var(x, tau: float, cfg: UpdateConfig, w=None) -> np.ndarray:
    """``V(x)``, the log offset's prior variance at fractions ``x`` (the module doc; ``w`` the
    frozen band's log half-width / z there), made non-increasing in ``x`` as a process pinned at
    the end must be."""
    x = np.asarray(x, float)
    v = tau * tau + cfg.q * t_of(x, cfg.clock)
    if w is not None and cfg.band_weight > 0:
        w = np.asarray(w, float)
        excess = np.where(np.isfinite(w), np.maximum(w * w - tau * tau, 0.0), 0.0)
        v = v + cfg.band_weight ** 2 * excess
    if v.size > 1:  # non-increasing in x: a running max taken from the end (x sorted)
        o = np.argsort(x, kind="stable")
        vs = np.maximum.accumulate(v[o][::-1])[::-1]
        v = np.empty_like(vs)
        v[o] = vs
    return v


@dataclass(frozen=True)
class Level:
    """The run's offset after ``n`` evals: the filtered ``s`` at the last one used (fraction
    ``at``, prior variance ``v_at``)."""

    mean_at: float
    var_at: float
    v_at: float
    at: float
    n: int
    jump: float = 0.0  # variance let in by interventions (:meth:`FilterState.step`)

    def predict(self, v_x) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance of the offset at fractions after ``at`` of prior variance ``v_x``
        (at the end ``tau^2``: the final's offset ``s1``)."""
        v_x = np.minimum(np.asarray(v_x, float) + self.jump, self.v_at)
        if self.n == 0:
            return np.zeros_like(v_x), v_x
        a = v_x / self.v_at
        return a * self.mean_at, a * a * self.var_at + v_x - v_x * v_x / self.v_at


NOISE_WINDOW = 32  # the latest evals the noise is read from (it changes as the loss falls; 32
#                   first differences give the median to ~20%)


@dataclass
class FilterState:
    """The filter's running state (the heading rule keeps it): as :class:`Level` (``var`` None
    before the first eval), the latest log offsets (the noise) and the last innovation's z."""

    mean: float = 0.0
    var: float | None = None
    v_at: float | None = None
    at: float = 0.0
    n: int = 0
    recent: list = field(default_factory=list)
    last_z: float = 0.0
    jump: float = 0.0

    def step(self, x: float, d: float, v_x: float, cfg: UpdateConfig) -> None:
        """Take one eval: fraction ``x``, log offset ``d``, prior variance ``v_x`` there (kept
        non-increasing along the run)."""
        v_x += self.jump
        if self.var is not None:
            v_x = min(v_x, self.v_at)
            a = v_x / self.v_at
            self.mean, self.var = a * self.mean, a * a * self.var + v_x - v_x * v_x / self.v_at
        else:
            self.var = v_x
        self.recent = (self.recent + [float(d)])[-NOISE_WINDOW:]
        r = robust_noise(np.array(self.recent), cfg.sigma_floor) ** 2
        z = (float(d) - self.mean) / math.sqrt(self.var + r)
        h = cfg.intervene
        if h and abs(z) > h and abs(self.last_z) > h and z * self.last_z > 0:
            # two evals in a row beyond h sd on one side: the run moved, so the level is let go
            # (West & Harrison 1997, "Bayesian forecasting and dynamic models", ch. 11:
            # intervention by a larger prior variance); the jump stays to the end (``jump``):
            # a change of the run is no early departure that fades
            j = (float(d) - self.mean) ** 2
            self.var += j
            self.jump += j
            v_x += j
        self.last_z = z
        k = self.var / (self.var + r)
        self.mean += k * (float(d) - self.mean)
        self.var *= 1.0 - k
        self.v_at, self.at, self.n = v_x, float(x), self.n + 1

    def level(self, tau: float) -> Level:
        if self.var is None:
            return Level(0.0, tau * tau, tau * tau, 0.0, 0)
        return Level(self.mean, self.var, self.v_at, self.at, self.n, self.jump)


def usable(x: float, d: float, cfg: UpdateConfig) -> bool:
    return math.isfinite(x) and math.isfinite(d) and cfg.min_fraction - 1e-9 <= x <= 1.0


def filter_offset(x: np.ndarray, d: np.ndarray, tau: float, cfg: UpdateConfig,
                  w=None) -> Level:
    """The model filtered over the log offsets ``d`` at sorted fractions ``x`` (``w``: the frozen
    band's log sd there, or None), skipping unusable evals, as the heading rule does."""
    x, d = np.asarray(x, float), np.asarray(d, float)
    st = FilterState()
    for i in range(x.size):
        if not usable(float(x[i]), float(d[i]), cfg):
            continue
        wi = None if w is None else np.asarray([w[i]], float)
        st.step(float(x[i]), float(d[i]), float(offset_var(np.array([x[i]]), tau, cfg, wi)[0]),
                cfg)
    return st.level(tau)


def curve_ahead(lv: Level, tau: float, fraction, lo, hi, level: float, cfg: UpdateConfig):
    """(mask, mean, variance) of the offset at the frozen grid's points after the last eval used
    (``fraction > lv.at``), ``lo``/``hi`` the frozen band there."""
    ahead = fraction > lv.at
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.log(hi[ahead] / lo[ahead]) / (2 * z_of(level))
    m, v = lv.predict(np.minimum(offset_var(fraction[ahead], tau, cfg, w), lv.v_at))
    return ahead, m, v


def final_band(lv: Level, tau: float, level: float, cfg: UpdateConfig) -> tuple[float, float]:
    """The final log offset's mean and the half-width of its band at ``level`` (inflated)."""
    m, v = lv.predict(np.array([tau * tau]))
    return float(m[0]), z_of(level) * cfg.inflation * math.sqrt(float(v[0]))


def update(forecast_fraction, forecast_loss, forecast_lo, forecast_hi, final: float,
           final_lo: float, final_hi: float, level: float, eval_fraction, eval_loss,
           cfg: UpdateConfig | None = None) -> Updated:
    """The updated forecast from the frozen curve and band on its grid, its final band at
    ``level`` and the run's evals so far."""
    cfg = cfg or UpdateConfig()
    order = np.argsort(np.asarray(forecast_fraction, float))
    gx, gy, glo, ghi = (np.asarray(a, float)[order] for a in
                        (forecast_fraction, forecast_loss, forecast_lo, forecast_hi))
    order = np.argsort(np.asarray(eval_fraction, float), kind="stable")
    ex, ey = (np.asarray(a, float)[order] for a in (eval_fraction, eval_loss))
    with np.errstate(divide="ignore", invalid="ignore"):  # as the watcher reads the band
        fe = np.interp(ex, gx, gy)
        d = np.log(ey / fe)
        we = np.log(np.interp(ex, gx, ghi) / np.interp(ex, gx, glo)) / (2 * z_of(level))
    tau = prior_sd(final, final_lo, final_hi, level)
    lv = filter_offset(ex, d, tau, cfg, we)
    z = z_of(level) * cfg.inflation
    m1, v1 = lv.predict(np.array([tau * tau]))
    m1, sd1 = float(m1[0]), math.sqrt(float(v1[0]))
    ahead, mx, vx = curve_ahead(lv, tau, gx, glo, ghi, level, cfg)
    fx = gx[ahead]
    cy = gy[ahead] * np.exp(mx)
    sdx = np.sqrt(vx)
    return Updated(at=lv.at, n_evals=lv.n, level=level, final=final * math.exp(m1),
                   lo=final * math.exp(m1 - z * sd1), hi=final * math.exp(m1 + z * sd1),
                   offset=m1, offset_sd=sd1, fraction=fx, loss=cy,
                   curve_lo=cy * np.exp(-z * sdx), curve_hi=cy * np.exp(z * sdx))
