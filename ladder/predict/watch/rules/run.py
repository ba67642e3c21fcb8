"""The run-level rules, which ``check`` calls at their own points: applicability (the run is
still the one the forecast was made for) before anything else, the input's remarks (rewind,
missing metric) as rows arrive, stalled (no new point for a while) when a poll brought nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ladder.io import as_float, sha256_of
from ladder.predict.watch.alerts import Alert
from ladder.predict.watch.rules.base import (Context, Rule, RuleState, Thresholds, kept, one_of,
                                             positive, threshold)

# a column of the metric that is still empty by then means the key is missing: a rung has logged
# two evals by 10% of its run (every 5% by default: the trainer's TrainConfig.eval_every)
MISSING_METRIC_BY = 0.1


class ApplicabilityRule(Rule):
    """Whether an applicability condition is broken: a run configuration that differs from the
    registered one, or planned steps (implied by step / progress) that differ. Then nothing is
    compared from here on: the state's ``not_applicable`` (exit status 3)."""

    name = "applicability"
    scope = "run"
    family = "run"
    kinds = ("not_applicable",)
    description = ("the run is still the one the forecast was made for (configuration, planned "
                   "steps)")
    state = ("not_applicable",)
    template = ("A broken applicability condition (the run's configuration, compared value by "
                "value; planned steps from step/progress off by more than "
                "{c.steps_tolerance:.1%}) stops all comparison: not_applicable.")

    @dataclass(frozen=True)
    class Config(Thresholds):
        steps_tolerance: float = threshold(0.005, positive)  # of the planned steps step/progress
        #                                                      implies

    def keys(self, metric, cfg):
        return ("progress",)

    def judge(self, ctx: Context, cfg: Config) -> bool:
        """True when the forecast no longer applies (said in an alert, kept in the state)."""
        view, batch = ctx.view, ctx.batch
        for c in batch.configs:
            broken = applicability_breaks(view.applicability, c)
            if broken:
                self._stop(ctx, None, broken)
                return True
        if len(batch) and "progress" in batch.cols:
            prog = batch.cols["progress"]
            ok = np.isfinite(prog) & (prog > 0) & (batch.step >= 1)
            if ok.any():
                implied = batch.step[ok] / prog[ok]
                # an amendment at step S (predict.amend): the rows before S were logged under the
                # plan before it, with its planned steps
                planned = np.full(implied.shape, float(view.steps))
                before = view.applicability.get("before")
                if isinstance(before, Mapping) and as_float(before.get("steps")) and \
                        as_float(before.get("at_step")) is not None:
                    early = batch.step[ok] < as_float(before["at_step"])
                    planned[early] = as_float(before["steps"])
                rel = np.abs(implied - planned) / planned
                bad = np.flatnonzero(rel > max(cfg.steps_tolerance, 1.0 / view.steps))
                if bad.size:
                    i = np.flatnonzero(ok)[bad[0]]
                    msg = (f"planned steps changed: step {int(batch.step[i])} at progress "
                           f"{prog[i]:.4f} implies {implied[bad[0]]:.0f} planned steps, the "
                           f"pre-registration is for {planned[bad[0]]:.0f}")
                    self._stop(ctx, int(batch.step[i]), [msg])
                    return True
        return False

    @staticmethod
    def _stop(ctx: Context, step, reasons: list[str]) -> None:
        ctx.state.not_applicable = "; ".join(reasons)
        ctx.emit(Alert(ctx.stamp, step, None, None, "not_applicable", "warn",
                       message="the forecast no longer applies, nothing is compared from here on: "
                               + ctx.state.not_applicable))


class InputRule(Rule):
    name = "input"
    scope = "run"
    family = "run"
    kinds = ("rewind", "missing_metric")
    description = "remarks on the rows themselves: steps logged again, the metric missing"
    template = ("Steps logged again (a resumed run) replace the earlier rows (last one wins): "
                "'rewind' (info); no registered metric in the rows: 'missing_metric' (info).")

    @dataclass(frozen=True)
    class Config(Thresholds):
        # how a row is placed on the forecast (its fraction of the run)
        align: str = threshold("auto", one_of("auto", "tokens", "step", "fraction"))

    @dataclass
    class State(RuleState):
        metric_seen: bool = kept("bool", False)     # the metric's key held a value
        missing_metric: bool = kept("bool", False)  # its absence was said

    def rewind(self, ctx: Context) -> None:
        """Rows are judged in arrival order, last one wins: say when steps are logged again."""
        first, last = int(ctx.batch.step[0]), ctx.state.last_step
        if last is not None and first <= last:
            ctx.emit(Alert(ctx.stamp, first, None, None, "rewind", "info",
                           message=f"steps from {first} logged again (resumed run?); the new "
                                   f"rows replace the earlier ones (last one wins)"))

    def metric(self, ctx: Context, st: State) -> np.ndarray | None:
        """The metric's column of the batch; None (said once) while the rows do not hold it."""
        b, key = ctx.batch, ctx.view.metric
        y_all = b.cols.get(key)
        if y_all is not None and not st.metric_seen:
            if np.isfinite(y_all).any() or b.nonfinite.get(key, np.zeros(0, bool)).any():
                st.metric_seen = True
            elif np.nanmax(ctx.frac, initial=0.0) >= MISSING_METRIC_BY:
                y_all = None  # a source's column of the key, empty: as good as missing
        if y_all is None and not st.missing_metric and \
                int(b.step[-1]) >= ctx.view.first_eval_step:  # no eval is due before it
            st.missing_metric = True
            ctx.emit(Alert(ctx.stamp, int(b.step[-1]), None, None, "missing_metric", "info",
                           message=f"no '{key}' in the rows read so far; loss is not compared "
                                   f"until it appears (wrong --metric?)"))
        return y_all


class StalledRule(Rule):
    name = "stalled"
    scope = "run"
    family = "run"
    kinds = ("stalled",)
    description = "no new point for a while"
    panel = "watch"
    template = "No new point for {c.stalled_seconds:g} s is 'stalled'."

    @dataclass(frozen=True)
    class Config(Thresholds):
        stalled_seconds: float = threshold(1800.0, positive)

    @dataclass
    class State(RuleState):
        active: bool = kept("bool", False)  # said, and no point since

    def idle(self, ctx: Context, cfg: Config, st: State, now: float) -> None:
        """A poll that brought nothing, at ``now``."""
        last = ctx.state.last_point_time
        if last is None or st.active:
            return
        if now - last > cfg.stalled_seconds:
            st.active = True
            ctx.emit(Alert(ctx.stamp, ctx.state.last_step, None, None, "stalled", "warn",
                           message=f"no new point for {now - last:.0f} s (limit "
                                   f"{cfg.stalled_seconds:g} s); last step "
                                   f"{ctx.state.last_step}"))

    def arrived(self, ctx: Context, st: State) -> None:
        """Points arrived (after the batch was judged)."""
        if st.active:
            st.active = False
            ctx.emit(Alert(ctx.stamp, int(ctx.batch.step[-1]), None, None, "stalled", "info",
                           message="new points arrive again (stall cleared)"))


def applicability_breaks(app: Mapping, config: Mapping) -> list[str]:
    """The applicability conditions that ``config`` (run-config/1, a flat dict, or a W&B config)
    definitely breaks; a key it does not carry is no break. An amendment at a step
    (``app["before"]``: the plan before it) accepts either plan's configuration; one that fits
    neither is reported against the plan now followed."""
    out = _breaks(app, config)
    before = app.get("before")
    if out and isinstance(before, Mapping) and not _breaks(before, config):
        return []
    return out


def _breaks(app: Mapping, config: Mapping) -> list[str]:
    out = []
    facts = config_facts(config)
    for key in ("seq_len", "steps", "tokens"):
        want, have = app.get(key), facts.get(key)
        if want is not None and have is not None and \
                abs(float(have) - float(want)) > 1e-9 * max(1.0, abs(float(want))):
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
    """The first key (dotted, sorted) where configuration ``have`` differs from ``want``, with
    both values; None when they agree. Numbers compare by value (1 == 1.0 after a round trip
    through W&B or YAML), booleans only with booleans; a registered "auto" matches anything."""
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
        same = want is have  # True and False are singletons
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
        if not (isinstance(cur, Mapping) and part in cur):
            break
        cur = cur[part]
    else:
        return cur
    for section in ("rung", "train"):
        v = lookup(d[section], dotted) if isinstance(d.get(section), Mapping) else _MISSING
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
