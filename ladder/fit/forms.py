"""Law forms: each is a sum of positive power-law terms, evaluated in log space.

Every form is ``log L = logsumexp_k z_k``, each term ``z_k`` a sum of ``multiplier *
value(param) * feature`` entries over logs of the inputs (or functions of the progress
fraction): one shape, so the solver evaluates thousands of starts in a few array operations.

Parameter kinds (the solver works on an unconstrained vector ``u``; names are in display space):
- ``coef``: a positive coefficient (E, A, B). ``u = log(value)``; enters a term as ``+u``.
  The Chinchilla paper's grid is defined on these logs (e = log E, a = log A, b = log B).
- ``exponent``: a power-law exponent (alpha, beta). ``u = value``; enters as ``-u * log(x)``.
  Unconstrained, as in the Chinchilla paper and Epoch's replication; negative values are flagged.
- ``positive``: a positive shape parameter (trajectory gamma, c1, c2). ``u = log(value)``; enters
  as ``+exp(u) * feature`` with a feature >= 0 that is non-increasing in the progress fraction, so
  the law is non-increasing in the fraction by construction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PARAM_KINDS = ("coef", "exponent", "positive")

# The range of the solver's vector u that law.json holds: up to |u| ~ 709, exp(u) is a finite
# non-zero float64.
U_LIMIT = 700.0


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    grid: tuple[float, ...]          # start values in u-space (see module docstring)
    bounds: tuple[float, float]      # plausible display-space range; a fit at either end is flagged

    def __post_init__(self):
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"kind: must be one of {PARAM_KINDS}, got {self.kind!r}")

    def to_u(self, value: float) -> float:
        if self.kind == "exponent":
            return float(value)
        if not value > 0:
            raise ValueError(f"{self.name}: must be > 0 to be fixed (it is a positive parameter)")
        return math.log(value)

    def to_display(self, u):
        return u if self.kind == "exponent" else np.exp(u)

    def estimate_flag(self, value: float) -> str | None:
        """Where an estimate sits at an end of the plausible range (a shape factor at 0 is
        legitimate), or None."""
        lo, hi = self.bounds
        if self.kind == "positive":
            return f"at or above its upper bound {hi:g}" if value >= hi else None
        if value <= lo * (1 + 1e-6) if lo > 0 else value <= lo + 1e-6:
            return f"at or below its lower bound {lo:g}"
        if value >= hi:
            return f"at or above its upper bound {hi:g}"
        return None

    def interval_flags(self, interval, level: float) -> list[str]:
        """Why an interval ``[lo, hi]`` does not pin this parameter: an end within 1% of the
        plausible range's."""
        lo, hi = interval if interval is not None else (math.nan, math.nan)
        if self.kind == "positive" or not (math.isfinite(lo) and math.isfinite(hi)):
            return []
        blo, bhi = self.bounds
        out = []
        if lo <= blo * 1.01 if blo > 0 else lo <= blo + 1e-6:
            out.append(f"its {level:.0%} interval reaches the lower bound {blo:g}")
        if hi >= bhi * 0.99:
            out.append(f"its {level:.0%} interval reaches the upper bound {bhi:g}")
        return out


@dataclass(frozen=True)
class Entry:
    """``multiplier * value(param) * feature`` inside one term; feature "one" is the constant 1."""
    param: str
    feature: str
    multiplier: float


@dataclass(frozen=True)
class Form:
    name: str
    expression: str
    params: tuple[Param, ...]
    terms: tuple[tuple[Entry, ...], ...]
    needs: tuple[str, ...]           # points-table columns the features are computed from
    shape_params: tuple[str, ...] = ()  # identified within runs (do not need more runs)
    note: str = ""
    # True: a coefficient's grid is the log of its term at the data's mean log inputs (the
    # solver's centred coordinates, fit.estimate._centering); False: natural logs (Chinchilla's)
    centered_grid: bool = False
    # True: a law of whole curves, fitted on every point; False: on each run's final point
    curves: bool = False
    # sets of non-shape parameters runs identify separately; None: all together
    across_sets: tuple[tuple[str, ...], ...] | None = None
    featurize: Callable[[dict], dict] | None = None  # the ``needs`` columns -> the features
    auto: bool = False  # --form auto tries it (fit.law.candidates)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def features(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.featurize(cols)


# ----------------------------------------------------------------------------- features

def _log(x):
    return np.log(np.asarray(x, dtype=float))


def _feat_chinchilla(c):
    return {"one": np.ones(len(c["N"])), "logN": _log(c["N"]), "logD": _log(c["tokens"])}


def _feat_compute(c):
    return {"one": np.ones(len(c["compute"])), "logC": _log(c["compute"])}


def _feat_trajectory(c):
    """Trajectory features of ``compute`` so far and the ``fraction`` g, in the planned total
    C_T = compute / g (one run: a function of g alone)."""
    g = np.asarray(c["fraction"], dtype=float)
    logCT = _log(c["compute"]) - np.log(g)
    one_minus = 1.0 - g
    # held below ``fraction_floor`` (the smallest fitted fraction): no data constrains 1/g there
    floor = c.get("fraction_floor")
    r1 = 1.0 / (g if floor is None else np.maximum(g, floor)) - 1.0
    return {"one": np.ones(len(g)), "logCT": logCT, "neglogg": -np.log(g), "r1": r1,
            "q1": one_minus, "q2": one_minus ** 2}


def _feat_moe(c):
    return {"one": np.ones(len(c["active_params"])), "logNa": _log(c["active_params"]),
            "logSparsity": _log(c["params"]) - _log(c["active_params"]),
            "logD": _log(c["tokens"])}


# ----------------------------------------------------------------------------- the forms

# The Chinchilla paper's grid of initialisations (Hoffmann et al. 2022, Appendix D.2), as used by
# Epoch's replication (Besiroglu et al. 2024): alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5,
# ..., 1}, a, b in {0, 5, ..., 25}: 5 x 5 x 5 x 6 x 6 = 4,500 starts.
_E_GRID = (-1.0, -0.5, 0.0, 0.5, 1.0)
_EXP_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)
_AB_GRID = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)

_E = Param("E", "coef", _E_GRID, (1e-3, 20.0))
_E_CENTRED = Param("E", "coef", (-0.5, 0.0, 0.5, 1.0), (1e-3, 20.0))

_CHINCHILLA = Form(
    name="chinchilla",
    expression="L = E + A / N^alpha + B / D^beta",
    params=(_E, Param("A", "coef", _AB_GRID, (1e-6, 1e15)),
            Param("B", "coef", _AB_GRID, (1e-6, 1e15)),
            Param("alpha", "exponent", _EXP_GRID, (0.0, 3.0)),
            Param("beta", "exponent", _EXP_GRID, (0.0, 3.0))),
    terms=((Entry("E", "one", 1.0),),
           (Entry("A", "one", 1.0), Entry("alpha", "logN", -1.0)),
           (Entry("B", "one", 1.0), Entry("beta", "logD", -1.0))),
    needs=("N", "tokens"), featurize=_feat_chinchilla, auto=True,
    note="N is the params column chosen with --params-column; D the tokens column.")

# Centred grids: the reducible loss L - E at the data's mean compute is ~0.02..3 (log -4..1).
_CENTRED_A_GRID = (-4.0, -2.5, -1.0, 0.0, 1.0)
_COMPUTE_ALPHA_GRID = (0.02, 0.05, 0.1, 0.2, 0.4)

_COMPUTE = Form(
    name="compute",
    expression="L = E + A * C^-alpha",
    params=(_E_CENTRED, Param("A", "coef", _CENTRED_A_GRID, (1e-6, 1e15)),
            Param("alpha", "exponent", _COMPUTE_ALPHA_GRID, (0.0, 3.0))),
    terms=((Entry("E", "one", 1.0),),
           (Entry("A", "one", 1.0), Entry("alpha", "logC", -1.0))),
    needs=("compute",), centered_grid=True, featurize=_feat_compute, auto=True,
    note="C is training compute so far (flops-v1, no LM head) at each point.")

# The trajectory forms' h(g) = g^-gamma exp(c0 (1/g - 1) + c1 (1-g) + c2 (1-g)^2): h(1) = 1 and
# non-increasing in g (shape parameters >= 0), so every curve is monotone. g^-gamma: the power law
# in tokens; c0: the early transient (on OLMo's 1xC curves, RMS log residual 2.4% -> 0.4%); the
# (1-g) polynomial: the annealing drop of a decaying schedule.
_POS_GRID = (math.log(0.02), math.log(0.3))
_H_PARAMS = (Param("gamma", "positive", _POS_GRID, (0.0, 5.0)),
             Param("c0", "positive", (math.log(0.003), math.log(0.03)), (0.0, 20.0)),
             Param("c1", "positive", _POS_GRID, (0.0, 20.0)),
             Param("c2", "positive", _POS_GRID, (0.0, 20.0)))
_H_ENTRIES = (Entry("gamma", "neglogg", 1.0), Entry("c0", "r1", 1.0), Entry("c1", "q1", 1.0),
              Entry("c2", "q2", 1.0))

_TRAJECTORY = Form(
    name="trajectory",
    expression="L = E + A * C_T^-alpha * g^-gamma * exp(c0 (1/g - 1) + c1 (1-g) + "
               "c2 (1-g)^2), C_T = compute / g (planned total compute), g = fraction",
    params=(_E_CENTRED, Param("A", "coef", (-4.0, -2.0, 0.0), (1e-6, 1e15)),
            Param("alpha", "exponent", (0.05, 0.1, 0.2, 0.4), (0.0, 3.0)), *_H_PARAMS),
    terms=((Entry("E", "one", 1.0),),
           (Entry("A", "one", 1.0), Entry("alpha", "logCT", -1.0), *_H_ENTRIES)),
    needs=("compute", "fraction"), centered_grid=True, curves=True,
    shape_params=("gamma", "c0", "c1", "c2"), featurize=_feat_trajectory, auto=True,
    note="compute is so far at the point (points-table convention); the law is written in "
         "the planned total C_T = compute / fraction, and is non-increasing in the fraction at "
         "fixed C_T by construction. Shape parameters at 0 mean that factor is unused.")

# The trajectory law with a capacity term A C_T^-alpha that training does not remove beside
# a training term B C_T^-beta h(g): the gap between sizes may grow along the run (small
# models plateau first), which the trajectory form's one product cannot follow (it missed
# the cpu ladder's early points by 5-6%; docs/LOG.md, issue 21).
_TRAJECTORY_CAPACITY = Form(
    name="trajectory-capacity",
    expression="L = E + A * C_T^-alpha + B * C_T^-beta * g^-gamma * exp(c0 (1/g - 1) + "
               "c1 (1-g) + c2 (1-g)^2), C_T = compute / g (planned total compute), "
               "g = fraction",
    params=(_E_CENTRED, Param("A", "coef", (-3.0, -1.0), (1e-6, 1e15)),
            Param("alpha", "exponent", (0.05, 0.2), (0.0, 3.0)),
            Param("B", "coef", (-3.0, -1.0), (1e-6, 1e15)),
            Param("beta", "exponent", (0.0, 0.1), (-1.0, 3.0)), *_H_PARAMS),
    terms=((Entry("E", "one", 1.0),),
           (Entry("A", "one", 1.0), Entry("alpha", "logCT", -1.0)),
           (Entry("B", "one", 1.0), Entry("beta", "logCT", -1.0), *_H_ENTRIES)),
    needs=("compute", "fraction"), centered_grid=True, curves=True,
    shape_params=("gamma", "c0", "c1", "c2"), featurize=_feat_trajectory,
    # a run's curve separates its constant part from its falling part's scale
    across_sets=(("E", "A", "alpha"), ("B", "beta")),
    note="as the trajectory form, with a capacity term A C_T^-alpha that does not fall along "
         "a run: the gap between sizes may grow (or shrink) along the run. beta near 0: the "
         "training term is the same for every size.")

# At fixed active parameters, loss falls as a power of the sparsity (total / active): Clark
# et al. 2022's power of the expert count; Ludziejewski et al. 2025's joint MoE law.
_MOE = Form(
    name="moe",
    expression="L = E + A * Na^-alpha * (N/Na)^-gamma + B / D^beta",
    params=(_E_CENTRED, Param("A", "coef", (-4.0, -2.0, 0.0), (1e-6, 1e15)),
            Param("B", "coef", (-4.0, -2.0, 0.0), (1e-6, 1e15)),
            Param("alpha", "exponent", (0.1, 0.3, 0.6), (0.0, 3.0)),
            Param("gamma", "exponent", (0.0, 0.3), (-1.0, 3.0)),
            Param("beta", "exponent", (0.1, 0.3, 0.6), (0.0, 3.0))),
    terms=((Entry("E", "one", 1.0),),
           (Entry("A", "one", 1.0), Entry("alpha", "logNa", -1.0),
            Entry("gamma", "logSparsity", -1.0)),
           (Entry("B", "one", 1.0), Entry("beta", "logD", -1.0))),
    needs=("params", "active_params", "tokens"), centered_grid=True, featurize=_feat_moe,
    auto=True, note="Na = active params, N = total params, D = tokens.")

FORMS = {f.name: f for f in (_CHINCHILLA, _COMPUTE, _TRAJECTORY, _TRAJECTORY_CAPACITY, _MOE)}
CURVES_FORMS = tuple(name for name, f in FORMS.items() if f.curves)


def get_form(name: str) -> Form:
    return FORMS[name]  # an unknown name: KeyError


# ----------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class FormEntry:
    """One ``--form`` value. ``kind``: "points" (this module's), "curve" (fit.curve_forms) or
    "task" (fit.task); ``columns``: what it reads (``N``: the --params-column); ``auto``: --form
    auto tries it."""

    name: str
    kind: str
    columns: tuple[str, ...]
    auto: bool
    expression: str


def _points_entry(f: Form) -> FormEntry:
    return FormEntry(f.name, "points", f.needs, f.auto, f.expression)


# The curve and task laws live above this module; tests/test_form_registry.py checks the names.
CURVE_LAW_COLUMNS = ("run", "step", "lr", "loss")
OTHER_FORMS = (
    FormEntry("mpl", "curve", CURVE_LAW_COLUMNS, True,
              "the multi-power law of the LR schedule (Luo et al. 2025)"),
    FormEntry("momentum", "curve", CURVE_LAW_COLUMNS, True,
              "the momentum law of the LR schedule (Tissue et al. 2024)"),
    FormEntry("task", "task", ("VIA", "ACC"), False,
              "accuracy from a task loss in two steps (Bhagia et al. 2024; needs --via)"),
)
REGISTRY: dict[str, FormEntry] = {**{n: _points_entry(m) for n, m in FORMS.items()},
                                  **{e.name: e for e in OTHER_FORMS}}


def form_choices() -> str:
    """Every --form value in one line, ``*`` where --form auto tries it."""
    return "auto, " + ", ".join(n + ("*" if e.auto else "") for n, e in REGISTRY.items())


# ----------------------------------------------------------------------------- constraints


@dataclass(frozen=True)
class Spec:
    """A form with some parameters fixed and some tied: maps free variables to the full u."""
    form: Form
    fix: dict = field(default_factory=dict)   # name -> display value
    tie: dict = field(default_factory=dict)   # name -> name it equals

    def __post_init__(self):
        names = self.form.names
        for k in list(self.fix) + list(self.tie) + list(self.tie.values()):
            if k not in names:
                raise ValueError(f"{k}: not a parameter of the {self.form.name} form "
                                 f"(parameters: {', '.join(names)})")
        for k, v in self.tie.items():
            if k == v or v in self.tie:
                raise ValueError(f"tie {k}={v}: ties must point at a free parameter")
            if self.form.param(k).kind != self.form.param(v).kind:
                raise ValueError(f"tie {k}={v}: parameters of different kinds")
            if k in self.fix or v in self.fix:
                raise ValueError(f"tie {k}={v}: cannot tie a fixed parameter")
        for k, v in self.fix.items():
            self.form.param(k).to_u(v)

    @property
    def free(self) -> tuple[str, ...]:
        return tuple(n for n in self.form.names if n not in self.fix and n not in self.tie)

    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def n_across(self) -> int:
        """Runs needed for the free parameters only differences between runs identify (the
        largest of ``across_sets``)."""
        across = [n for n in self.free if n not in self.form.shape_params]
        if self.form.across_sets is None:
            return len(across)
        return max(sum(1 for n in group if n in across) for group in self.form.across_sets)

    def mapping(self) -> tuple[np.ndarray, np.ndarray]:
        """``u = u0 + phi @ M.T``: M (P, F) of 0/1, u0 holding the fixed values."""
        names, free = self.form.names, self.free
        M = np.zeros((len(names), len(free)))
        u0 = np.zeros(len(names))
        for i, n in enumerate(names):
            if n in self.fix:
                u0[i] = self.form.param(n).to_u(self.fix[n])
            else:
                M[i, free.index(self.tie.get(n, n))] = 1.0
        return u0, M

    def to_u(self, phi: np.ndarray) -> np.ndarray:
        u0, M = self.mapping()
        return u0 + np.asarray(phi) @ M.T

    def grid(self) -> np.ndarray:
        """Cartesian product of the free parameters' start grids, (S, F)."""
        grids = [self.form.param(n).grid for n in self.free]
        return np.array(list(itertools.product(*grids)), dtype=float).reshape(-1, len(grids))

    def to_json(self) -> dict:
        return {"form": self.form.name, "fix": dict(self.fix), "tie": dict(self.tie)}


# ----------------------------------------------------------------------------- evaluation


class Model:
    """A form evaluated on fixed features, batched over rows of parameter vectors."""

    def __init__(self, form: Form, feats: dict[str, np.ndarray]):
        self.form = form
        self.feats = feats
        self.n = len(next(iter(feats.values())))
        idx = {p.name: i for i, p in enumerate(form.params)}
        self.positive = np.array([p.kind == "positive" for p in form.params])
        self._ones = feats["one"]
        # per term: list of (param index, feature vector, multiplier)
        self.terms = [[(idx[e.param], feats[e.feature], e.multiplier) for e in t]
                      for t in form.terms]
        # per term: its entries and the (n, entries) matrix of their features
        self._term_mats = [(t, np.stack([x for _, x, _ in t], axis=1)) for t in self.terms]

    def _values(self, U):
        V = U.copy()
        if self.positive.any():
            V[:, self.positive] = np.exp(U[:, self.positive])
        return V

    def log_predict(self, U: np.ndarray) -> np.ndarray:
        """log L for each row of U (S, P): (S, n)."""
        U = np.atleast_2d(U)
        V = self._values(U)
        Z = np.stack([np.broadcast_to(self._term(V, t), (V.shape[0], self.n))
                      for t in self.terms])  # (K, S, n)
        return _logsumexp0(Z)

    def _term(self, V, entries):
        """(S, n), or (S, 1) for a term made of constants only."""
        const = np.zeros((V.shape[0], 1))
        z = None
        for p, x, m in entries:
            if x is self._ones:
                const += m * V[:, p:p + 1]
            elif z is None:
                z = np.multiply.outer(m * V[:, p], x)
            else:
                z += np.multiply.outer(m * V[:, p], x)
        if z is None:
            return const
        z += const
        return z

    def jacobian(self, u: np.ndarray) -> np.ndarray:
        """d log L / d u at one parameter vector: (n, P)."""
        U = np.atleast_2d(u)
        V = self._values(U)
        Z = np.stack([np.broadcast_to(self._term(V, t), (1, self.n))
                      for t in self.terms])[:, 0]  # (K, n)
        soft = np.exp(Z - _logsumexp0(Z[:, None])[0][None])
        J = np.zeros((self.n, U.shape[1]))
        dv = np.where(self.positive, V[0], 1.0)
        for k, entries in enumerate(self.terms):
            for p, x, m in entries:
                J[:, p] += soft[k] * m * x * dv[p]
        return J

    def objective(self, U, logy, W, delta):
        """Summed Huber of log residuals and its gradient wrt U: f (S,), G (S, P); ``W``: None
        or (S, n) point weights. Not max-shifted (3x cheaper): an overflowing term gives a
        non-finite f, which the line search rejects."""
        V = self._values(U)
        ek = [self._term(V, t) for t in self.terms]
        for e in ek:
            np.exp(e, out=e)
        total = ek[0] + ek[1]
        for e in ek[2:]:
            total += e
        r = np.log(total)
        r -= logy[None, :]
        a = np.abs(r)
        m = np.minimum(a, delta)          # Huber: rho = m (|r| - m/2), psi = sign(r) m
        if W is None:
            f = np.einsum("ij,ij->i", m, a) - 0.5 * np.einsum("ij,ij->i", m, m)
        else:
            a -= 0.5 * m
            a *= m
            a *= W
            f = a.sum(axis=1)
        scaled = np.copysign(m, r, out=m)
        scaled /= total                    # psi / sum_k exp(z_k)
        if W is not None:
            scaled *= W
        ssum = None
        G = np.zeros_like(U)
        for e, (entries, X) in zip(ek, self._term_mats, strict=True):
            if e.shape[1] == 1:            # constant term: sum_i scaled_i * e
                if ssum is None:
                    ssum = scaled.sum(axis=1)
                sums = (e[:, 0] * ssum)[:, None]
            else:                          # all of this term's sums in one matmul
                e *= scaled
                sums = e @ X
            for col, (p, _x, mult) in enumerate(entries):
                G[:, p] += mult * sums[:, col]
        if self.positive.any():
            G[:, self.positive] *= V[:, self.positive]
        return f, G


def _logsumexp0(Z):
    zmax = Z.max(axis=0)
    zmax = np.where(np.isfinite(zmax), zmax, 0.0)
    with np.errstate(over="ignore", under="ignore"):
        return zmax + np.log(np.exp(Z - zmax[None]).sum(axis=0))
