"""Pre-registration files (shared/DESIGN.md section 3): made (:func:`make_prereg`: a law's forecast
on the target's grid, the eval noise, the decision rule and its calibration), sealed
(:func:`build`), written once (:func:`write_once`), verified, and amended as a chain.

``sha256`` is the SHA-256 of :func:`ladder.io.canonical_json` of the document without it;
``section_sha256`` holds one digest per top-level section, so :func:`verify` names the section
edited, and ``law_sha256`` the embedded law's. A file is written atomically, read-only, and never
replaces one (the last step is a hard link, which fails if the name is taken).

An amendment (``--amend OLD.json --reason ...``) is a new pre-registration whose ``amends`` names
the old one's sha256, path and the reason; writing it also appends a line to the append-only
chain file ``amendments.jsonl`` beside it. What the watcher follows is trusted by name (issue
26), never found: :func:`resolve_chain` follows the amendments recorded there or named by the
user (``--amend-chain``), each checked against its recorded sha256; a file that merely claims to
amend one (hand-sealed, dated 9999) is reported, not followed. A hash is not a signature:
``ladder verify --expect SHA256`` checks a file against a digest kept elsewhere.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ladder import git_state
from ladder.io import (
    EX_CANTCREAT,
    EX_DATAERR,
    EX_USAGE,
    PREREG_MODE,
    InputError,
    as_float,
    atomic_write_bytes,
    inside,
    loads,
    number,
    read_bytes,
    read_json,
    safe_name,
    schema_version,
    sha256_of,
    to_jsonable,
    write_with_record,
)
from ladder.predict import forecast as fc
from ladder.predict.band import extrapolation_error
from ladder.predict.watch import WatchConfig, decision_rule_words

SCHEMA = "prereg/1"
# an amendment at a step (``change``: predict.amend), and only it: a ladder that reads prereg/1
# refuses it (a newer file) instead of judging the whole run against a forecast from step S on
SCHEMA_V2 = "prereg/2"
# several metrics under one sha256 (issue 23): ``metrics`` (the keys) and ``forecasts: {key:
# watch.multi.PER_METRIC}`` beside the shared sections; a single-metric file stays prereg/1
SCHEMA_V3 = "prereg/3"
SCHEMAS = (SCHEMA, SCHEMA_V2, SCHEMA_V3)
HASHED_OUT = ("sha256",)
CHAIN_FILE = "amendments.jsonl"   # beside the pre-registrations, append-only
CHAIN_SCHEMA = "prereg-chain/1"
# a pre-registration is a few MB at most: the scan for unrecorded amendments reads nothing larger
SCAN_LIMIT = 64 << 20


def content_hash(doc: Mapping) -> str:
    return sha256_of({k: v for k, v in doc.items() if k not in HASHED_OUT})


def section_digests(doc: Mapping) -> dict:
    return {k: sha256_of(v) for k, v in sorted(doc.items())
            if k not in HASHED_OUT and k != "section_sha256"}


def _git_sha() -> str | None:
    """HEAD's sha, "-dirty" appended when the checkout has changes (:func:`ladder.git_state`)."""
    git = git_state()
    return git["sha"] and git["sha"] + ("-dirty" if git["dirty"] else "")


def build(*, target: dict, applicability: dict, metric: str, law: dict, forecast: list[dict],
          final: dict, band_level: float, decision_rule: dict, eval_noise: dict | None = None,
          extrapolation: dict | None = None, health_reference: dict | None = None,
          budget_curve: dict | None = None, amends: dict | None = None,
          created: str | None = None, change: dict | None = None) -> dict:
    """The pre-registration document, sealed. ``change``: the plan's change at a step that this
    amendment forecasts from (ladder.predict.amend; schema prereg/2)."""
    from ladder import __version__
    doc: dict[str, Any] = {  # in the order the file lists them
        "schema": SCHEMA_V2 if change is not None else SCHEMA, "target": target,
        "applicability": applicability, "metric": metric, "law": law,
        "law_sha256": sha256_of(law), "forecast": forecast, "final": final,
        "band_level": band_level, "eval_noise": eval_noise, "extrapolation": extrapolation,
        "decision_rule": decision_rule, "health_reference": health_reference,
        "budget_curve": budget_curve, "amends": amends,
        "created": created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": _git_sha(), "tool_version": f"ladder {__version__}"}
    if change is not None:
        doc["change"] = change
    return seal(doc)


def make_prereg(law, target: fc.Target, *, level: float = 0.9, runs: str | None = None,
                eval_noise: float | None = None, data_tag: str | None = None,
                requires: dict | None = None, config: WatchConfig | None = None,
                amends: dict | None = None, created: str | None = None,
                run_config: dict | None = None, allow_no_band: bool = False) -> dict:
    """The sealed pre-registration of ``target`` from ``law`` (`ladder preregister`; write it
    with :func:`write_once`). ``run_config``: the target rung's ``Rung.to_dict()``, registered
    by value so the watcher names the first key of a run's configuration that differs."""
    metric = getattr(law, "metric", None) or "eval_dropless/loss"
    noise_info = {"sigma": 0.0, "n": 0, "method": "none (no --runs, no --eval-noise)"}
    health = None
    cfg = config or WatchConfig()
    calibration: dict = {}
    if runs:
        ladder_runs = _under_law_keys(fc.read_ladder_runs(runs), law)
        if not ladder_runs:
            raise InputError("no run directories (metrics.jsonl) found", path=runs,
                             field="--runs")
        health = fc.health_reference(ladder_runs)
        # the spike threshold above the largest robust z-score of the ladder's healthy runs
        spk = fc.calibrate_spike_k(ladder_runs, cfg.spike_window)
        if spk["max_z"] is not None and math.isfinite(spk["max_z"]):
            k = max(cfg.spike_k, cfg.spike_k_margin * spk["max_z"])
            spk["spike_k"] = k
            cfg = dataclasses.replace(cfg, spike_k=round(k, 3))
        calibration["spike_k"] = spk
        calibration["envelope_tolerance"] = {
            k: v.get("tolerance") for k, v in health["signals"].items()
            if k in ("moe/router_entropy", "moe/load_max_over_mean", "moe/drop_frac",
                     "moe/router_z_loss")}
        est = fc.eval_noise_from_runs(ladder_runs, metric)
        if eval_noise is None:
            if math.isfinite(est.sigma):
                noise_info = est.to_dict()
            elif not np.isfinite(np.array([as_float(r.get(metric)) for run in ladder_runs
                                           for r in run.rows], dtype=float)).any():  # None: NaN
                # a band frozen without the eval noise alerts on a healthy run (issue 39)
                raise InputError(f"no run here logs {metric!r}, the law's metric, so its eval "
                                 "noise cannot be estimated; give the runs the law was fitted "
                                 "on (or `ladder fit --keys` for another trainer's names), or "
                                 "--eval-noise SD", path=runs, field="--runs")
            else:
                print(f"ladder preregister: too few {metric} evals in {runs} to estimate eval "
                      f"noise; the band leaves it out", file=sys.stderr)
                noise_info = {"sigma": 0.0, "n": 0,
                              "method": f"none (too few {metric} evals in --runs)"}
    if eval_noise is not None:
        if not (math.isfinite(eval_noise) and eval_noise >= 0):
            raise InputError(f"must be >= 0, got {eval_noise!r}", field="--eval-noise",
                             exit_code=EX_USAGE)
        noise_info = {"sigma": float(eval_noise), "n": 0, "method": "given (--eval-noise)"}
    extrapolation = extrapolation_error(law, target)  # recorded: the law's band holds it
    f = fc.forecast(law, target, level=level, eval_noise=noise_info["sigma"])
    if not allow_no_band and not (np.isfinite(f.lo).any() and np.isfinite(f.hi).any()):
        # a frozen, never-overwritable file whose band is all NaN can never judge anything
        raise InputError("the law gives no band at any forecast point (all lo/hi NaN: e.g. no "
                         "residual degrees of freedom); nothing written; refit with more runs "
                         "or a --prior, or pass --allow-no-band", field="forecast.lo",
                         exit_code=EX_DATAERR)
    low = np.flatnonzero(np.isfinite(f.lo) & (f.lo <= 0))
    if low.size:
        # the eval noise is an sd in metric units added in quadrature (band.combine_band); one
        # that reaches below 0 from the forecast makes a band no loss can fill, which the
        # watcher reads in log (prior_sd: a math domain error) and prereg's reader refuses
        i = int(low[-1])
        raise InputError(f"the band's lower end at fraction {f.fraction[i]:.4g} is "
                         f"{float(f.lo[i]):.4g}, not above 0: the eval noise (sd "
                         f"{noise_info['sigma']:.4g}) is as large as the forecast loss "
                         f"{float(f.loss[i]):.4g} at level {level:g}; a loss is never below 0, "
                         "so give a smaller --eval-noise or a law whose loss is larger than its "
                         "evals' noise; nothing written",
                         field="--eval-noise" if eval_noise is not None else "eval_noise.sigma",
                         exit_code=EX_DATAERR)
    if not (np.isfinite(f.lo).all() and np.isfinite(f.hi).all()):
        print("ladder preregister: WARNING the law could not compute a band for some points; "
              "they are registered with lo/hi missing (NaN), and never judged as inside",
              file=sys.stderr)
    app = {"seq_len": target.seq_len, "steps": target.steps, "tokens": target.tokens,
           "data_tag": data_tag, "config_hash": target.config_hash,
           "require": dict(requires or {})}
    if run_config is not None:
        app["config"] = run_config
    return build(target=target.to_dict(), applicability=app, metric=metric, law=law.to_json(),
                 forecast=f.points(), final=f.final, band_level=level,
                 eval_noise=noise_info, extrapolation=extrapolation.to_dict(),
                 decision_rule={"words": decision_rule_words(cfg, level),
                                "parameters": cfg.to_dict(),
                                "calibration": calibration or None},
                 health_reference=health, budget_curve=fc.budget_curve(law, target),
                 amends=amends, created=created)


def build_multi(docs: Mapping[str, Mapping], *, family: dict) -> dict:
    """One pre-registration of several metrics from ``docs`` ({metric key: :func:`build`'s
    document}, one target, one decision rule): the shared sections from the first, each
    metric's under ``forecasts``; ``family`` (watch.multi.family_config) joins the rule."""
    from ladder.predict.watch.multi import PER_METRIC
    keys = list(docs)
    if not keys:
        raise ValueError("docs: no metric")
    first = docs[keys[0]]
    doc = {"schema": SCHEMA_V3, "target": first["target"],
           "applicability": first["applicability"], "metrics": keys,
           "forecasts": {k: {f: d.get(f) for f in PER_METRIC} for k, d in docs.items()},
           **{k: first.get(k) for k in ("band_level", "decision_rule", "health_reference",
                                        "amends", "created", "git_sha", "tool_version")}}
    doc["decision_rule"] = {**dict(first["decision_rule"]), "family": family}
    return seal(doc)


def write_once(path: str | os.PathLike, doc: Mapping) -> Path:
    """Write ``doc`` to ``path`` atomically and read-only, never replacing a file; an amendment
    with its line in the chain file beside it (:func:`chain_line`: what makes the watcher
    follow it), both or neither (ladder.io.write_with_record, issue 39)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise InputError("exists; a pre-registration is never overwritten (choose another --out, "
                         "or amend it with --amend)", path=path, exit_code=EX_CANTCREAT)
    am = doc.get("amends")
    if isinstance(am, Mapping):  # its name goes into the chain file: check it before writing
        safe_name(path.name, field="--out", path=path)
    data = (json.dumps(to_jsonable(doc), indent=2, allow_nan=False) + "\n").encode("utf-8")
    try:
        if isinstance(am, Mapping):
            return write_with_record(path, data, path.parent / CHAIN_FILE,
                                     chain_line(path, doc), mode=PREREG_MODE)
        return atomic_write_bytes(path, data, mode=PREREG_MODE, exclusive=True)
    except FileExistsError:
        raise InputError("exists; a pre-registration is never overwritten", path=path,
                         exit_code=EX_CANTCREAT) from None


def chain_line(path: Path, doc: Mapping) -> str:
    """The chain file's line for the amendment ``doc`` written at ``path``."""
    rec = {"schema": CHAIN_SCHEMA, "amends": doc["amends"].get("sha256"),
           "sha256": doc["sha256"], "file": path.name, "reason": doc["amends"].get("reason"),
           "created": doc.get("created")}
    return json.dumps(to_jsonable(rec), allow_nan=False) + "\n"


@dataclass
class Verification:
    """Result of :func:`verify`."""

    path: str
    ok: bool
    stored: str | None
    computed: str
    changed: list[str] = field(default_factory=list)   # sections whose content changed
    problems: list[str] = field(default_factory=list)  # other findings (law hash, schema, ...)

    def report(self) -> str:
        if self.ok:
            return f"{self.path}: OK (sha256 {self.computed})"
        lines = [f"{self.path}: MODIFIED (stored sha256 {self.stored}, computed {self.computed})"]
        if self.changed:
            lines.append("  changed: " + ", ".join(self.changed))
        lines += [f"  {p}" for p in self.problems]
        if not self.changed and not self.problems:
            lines.append("  the edited section cannot be named (the per-section digests were "
                         "edited consistently, or are missing)")
        return "\n".join(lines)


def verify_doc(doc: Mapping, path: str = "<prereg>") -> Verification:
    stored = doc.get("sha256")
    computed = content_hash(doc)
    v = Verification(path=path, ok=False, stored=stored if isinstance(stored, str) else None,
                     computed=computed)
    if doc.get("schema") not in SCHEMAS:
        v.problems.append(f"schema is {doc.get('schema')!r}, expected one of {SCHEMAS}")
    elif (doc.get("schema") == SCHEMA_V2) != isinstance(doc.get("change"), Mapping):
        v.problems.append(f"schema {doc.get('schema')!r} with{'out' if 'change' not in doc else ''}"
                          f" a change section (prereg/2 is an amendment at a step, and only it)")
    digests = doc.get("section_sha256")
    if isinstance(digests, Mapping):
        now = section_digests(doc)
        for k in sorted(set(now) | set(digests)):
            if k not in digests:
                v.changed.append(f"{k} (added)")
            elif k not in now:
                v.changed.append(f"{k} (removed)")
            elif digests[k] != now[k]:
                v.changed.append(_name_change(doc, k))
    else:
        v.problems.append("section_sha256 is missing or not an object")
    law = doc.get("law")
    if law is not None and doc.get("law_sha256") != sha256_of(law):
        v.problems.append("the embedded law does not match law_sha256 (the law was edited)")
    fcs = doc.get("forecasts")
    if doc.get("schema") == SCHEMA_V3:
        if not isinstance(fcs, Mapping) or not isinstance(doc.get("metrics"), list):
            v.problems.append("prereg/3 without metrics and forecasts")
        else:
            for k, f in fcs.items():
                if not isinstance(f, Mapping) or f.get("law_sha256") != sha256_of(f.get("law")):
                    v.problems.append(f"forecasts.{k}: the embedded law does not match its "
                                      f"law_sha256 (the law was edited)")
    if stored is None:
        v.problems.append("no sha256 field")
    v.ok = (stored == computed) and not v.problems and not v.changed
    return v


def _name_change(doc, key) -> str:
    if key == "forecast" and isinstance(doc.get("forecast"), list):
        return "forecast (a forecast point was edited)"
    if key == "forecasts" and isinstance(doc.get("forecasts"), Mapping):
        return "forecasts (a metric's law or forecast was edited)"
    return key


def verify(path: str | os.PathLike) -> Verification:
    return verify_doc(_read(path), str(path))


def _read(path) -> dict:
    """The document at ``path``; a newer schema version is not "MODIFIED": it is a file this
    tool cannot judge."""
    doc = read_json(path, schema="prereg")
    v = schema_version(dict(doc))
    if v is not None and v > int(SCHEMA_V3.split("/")[1]):
        raise InputError(f"written by a newer ladder ({doc.get('schema')}); this one reads "
                         f"{' and '.join(SCHEMAS)}: upgrade ladder to verify it", path=path,
                         field="schema", exit_code=EX_DATAERR)
    return doc


def seal(doc: Mapping) -> dict:
    """``doc`` with its ``section_sha256`` and ``sha256`` (re)computed."""
    out = to_jsonable(dict(doc))
    out.pop("sha256", None)
    out["section_sha256"] = section_digests(out)
    out["sha256"] = content_hash(out)
    return out


def load(path: str | os.PathLike, *, check: bool = True) -> dict:
    """Read a pre-registration; with ``check``, a modified file is an InputError."""
    doc = _read(path)
    if doc.get("schema") == SCHEMA_V3:
        _check_multi(doc, path)
    else:
        for key in ("target", "forecast", "metric", "final"):
            if key not in doc:
                raise InputError("missing", path=path, field=key)
        if not isinstance(doc["forecast"], list) or not doc["forecast"]:
            raise InputError("expected a non-empty list", path=path, field="forecast")
    if check:
        v = verify_doc(doc, str(path))
        if not v.ok:
            raise InputError("fails verification (edited after it was written): "
                             + v.report().replace("\n", "; "), path=path, field="sha256")
        _check_registered(doc, path)  # unchecked: the caller verifies, then checks
    return doc


def _check_registered(doc: Mapping, path) -> None:
    """The registered numbers the watcher reads, checked for type and range (a file resealed
    after an edit passes its sha256, not this; issue 39)."""
    tgt = doc.get("target")
    if not isinstance(tgt, Mapping):
        raise InputError("expected an object", path=path, field="target")
    number(tgt.get("steps"), field="target.steps", path=path, lo=1, hi=2 ** 53, integral=True)
    number(tgt.get("tokens"), field="target.tokens", path=path, lo=0, lo_open=True)
    if doc.get("band_level") is not None:
        number(doc["band_level"], field="band_level", path=path, lo=0, hi=1, lo_open=True,
               hi_open=True)
    if doc.get("schema") == SCHEMA_V3:
        for k in doc["metrics"]:
            _check_metric(doc["forecasts"][k], path, f"forecasts.{k}.")
    else:
        _check_metric(doc, path, "")


def _check_metric(d: Mapping, path, prefix: str) -> None:
    noise = d.get("eval_noise")
    if isinstance(noise, Mapping):  # an eval's sd: the --eval-noise range (0..10)
        number(noise.get("sigma"), field=f"{prefix}eval_noise.sigma", path=path, lo=0, hi=10)
    elif noise is not None:
        raise InputError("expected an object {sigma, n, method}", path=path,
                         field=f"{prefix}eval_noise")
    last = -math.inf
    for i, pt in enumerate(d["forecast"]):
        field = f"{prefix}forecast[{i}]"
        if not isinstance(pt, Mapping):
            raise InputError("expected a point {fraction, step, tokens, loss, lo, hi}",
                             path=path, field=field)
        fr = as_float(pt.get("fraction"))
        # a fraction of the planned run, in order (the band is interpolated along it)
        if fr is None or not (0 <= fr <= 10) or fr < last:
            raise InputError(f"expected fractions in [0, 10], in order; got "
                             f"{str(pt.get('fraction'))[:40]!r}", path=path,
                             field=field + ".fraction")
        last = fr
        _check_band(pt, path, field)
    if not isinstance(d.get("final"), Mapping):
        raise InputError("expected an object {loss, lo, hi}", path=path, field=f"{prefix}final")
    _check_band(d["final"], path, f"{prefix}final")
    # the final band is read in log (ladder.predict.updated's prior): a law's is positive
    for name in ("loss", "lo", "hi"):
        x = as_float(d["final"].get(name))
        if x is not None and x <= 0:
            raise InputError(f"expected a positive number, got {x!r}", path=path,
                             field=f"{prefix}final.{name}")


def _check_band(pt: Mapping, path, field: str) -> None:
    """A finite ``loss`` and its ``lo``/``hi``: finite around it, or missing (null/NaN: no band
    there, never judged inside)."""
    loss = as_float(pt.get("loss"))
    if loss is None or not math.isfinite(loss):
        raise InputError(f"expected a finite number, got {str(pt.get('loss'))[:40]!r}",
                         path=path, field=field + ".loss")
    for name in ("lo", "hi"):
        v = pt.get(name)
        x = as_float(v)
        if v is not None and (x is None or math.isinf(x)):
            raise InputError(f"expected a finite number or null (no band), got "
                             f"{str(v)[:40]!r}", path=path, field=f"{field}.{name}")
    lo, hi = as_float(pt.get("lo")), as_float(pt.get("hi"))
    tol = 1e-9 * max(1.0, abs(loss))
    if lo is not None and math.isfinite(lo) and lo > loss + tol:
        raise InputError(f"lo {lo!r} above the loss {loss!r}", path=path, field=field + ".lo")
    if hi is not None and math.isfinite(hi) and hi < loss - tol:
        raise InputError(f"hi {hi!r} below the loss {loss!r}", path=path, field=field + ".hi")


def _check_multi(doc: Mapping, path) -> None:
    for key in ("target", "metrics", "forecasts"):
        if key not in doc:
            raise InputError("missing", path=path, field=key)
    keys, fcs = doc["metrics"], doc["forecasts"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise InputError("expected a non-empty list of metric keys", path=path, field="metrics")
    if not isinstance(fcs, Mapping):
        raise InputError("expected an object {metric key: forecast}", path=path,
                         field="forecasts")
    for k in keys:
        f = fcs.get(k)
        if not isinstance(f, Mapping):
            raise InputError("missing", path=path, field=f"forecasts.{k}")
        if not isinstance(f.get("forecast"), list) or not f["forecast"]:
            raise InputError("expected a non-empty list", path=path,
                             field=f"forecasts.{k}.forecast")
        if not isinstance(f.get("final"), Mapping):
            raise InputError("missing", path=path, field=f"forecasts.{k}.final")
    _check_family(doc, len(keys), path)


def _under_law_keys(ladder_runs: list, law) -> list:
    """The ladder runs' rows under the law's own metric names (a law fitted through `ladder fit
    --keys` records its key map in ``conventions.metric_keys``)."""
    keys = (getattr(law, "conventions", None) or {}).get("metric_keys")
    if not keys:
        return ladder_runs
    from ladder.sources.keymap import parse_keymap
    try:
        km = parse_keymap(keys)
    except ValueError as e:
        field, _, why = str(e).partition(": ")
        raise InputError(why, field=f"law.conventions.metric_keys.{field}") from None
    return [dataclasses.replace(r, rows=[km.row(x) for x in r.rows]) for r in ladder_runs]


def _check_family(doc: Mapping, m: int, path) -> None:
    """The multiple-comparison record (``decision_rule.family``, watch.multi.family_config):
    both levels in (0, 1), the file's metric count, the per-metric level the family's Sidak."""
    rule = doc.get("decision_rule")
    if not isinstance(rule, Mapping):
        raise InputError("expected an object", path=path, field="decision_rule")
    fam = rule.get("family")
    f = "decision_rule.family"
    if not isinstance(fam, Mapping):
        raise InputError("expected the multiple-comparison record (an object)", path=path,
                         field=f)
    if fam.get("method") != "sidak":
        raise InputError(f"expected 'sidak', got {str(fam.get('method'))[:40]!r}", path=path,
                         field=f + ".method")
    if fam.get("metrics") != m or isinstance(fam.get("metrics"), bool):
        raise InputError(f"expected {m} (the metrics registered), got "
                         f"{str(fam.get('metrics'))[:40]!r}", path=path, field=f + ".metrics")
    levels = {name: number(fam.get(name), field=f"{f}.{name}", path=path, lo=0, hi=1,
                           lo_open=True, hi_open=True)
              for name in ("family_alert_level", "alert_level")}
    p = 1.0 - levels["family_alert_level"]
    sidak = 1.0 + math.expm1(math.log1p(-p) / m)   # 1 - p_m, p_m = 1 - (1 - p)^(1/m)
    if not math.isclose(levels["alert_level"], sidak, rel_tol=1e-9, abs_tol=1e-12):
        raise InputError(f"{levels['alert_level']!r} is not the Sidak level {sidak:.12g} of "
                         f"family_alert_level {levels['family_alert_level']!r} over {m} "
                         f"metrics", path=path, field=f + ".alert_level")
    params = rule.get("parameters")
    got = params.get("alert_level") if isinstance(params, Mapping) else None
    if got is not None and not (isinstance(got, (int, float)) and not isinstance(got, bool)
                                and math.isclose(got, sidak, rel_tol=1e-9, abs_tol=1e-12)):
        raise InputError(f"{str(got)[:40]!r} differs from the family's per-metric level "
                         f"{sidak:.12g}", path=path, field="decision_rule.parameters.alert_level")


def amendment(old_path: str | os.PathLike, reason: str | None) -> dict:
    """The ``amends`` section of a new pre-registration that replaces ``old_path``."""
    if not reason or not reason.strip():
        raise InputError("--amend needs --reason (why the plan changed)", field="--reason",
                         exit_code=64)
    old = load(old_path)  # refuse to amend a tampered file
    chain = list((old.get("amends") or {}).get("chain", []))
    return {"sha256": old["sha256"], "path": os.path.basename(str(old_path)), "reason": reason,
            "created": old.get("created"), "chain": chain + [old["sha256"]]}


@dataclass
class ChainLink:
    path: str
    sha256: str
    reason: str | None
    created: str | None


@dataclass
class Chain:
    """The amendment chain from a pre-registration to the newest trusted amendment;
    ``skipped``: trusted amendments not followed (and why); ``unrecorded``: files beside it that
    claim to amend a link but are neither recorded nor named (reported, never followed)."""

    links: list[ChainLink]
    skipped: list[str]
    unrecorded: list[str] = field(default_factory=list)

    @property
    def newest(self) -> ChainLink:
        return self.links[-1]

    def describe(self) -> str:
        if len(self.links) == 1:
            s = f"following {self.newest.path} (no amendment)"
        else:
            s = (f"following {self.newest.path}, amendment {len(self.links) - 1} of "
                 f"{self.links[0].path} (reason: {self.newest.reason})")
        if self.skipped:
            s += "; ignored: " + "; ".join(self.skipped)
        if self.unrecorded:
            s += "; not followed: " + "; ".join(self.unrecorded)
        return s


_HEX = frozenset("0123456789abcdef")


def is_sha256(v) -> bool:
    """``v`` is a sha256 as this module writes it (64 lowercase hex digits)."""
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


def read_chain_file(path: str | os.PathLike) -> list[dict]:
    """The records of a chain file, each checked: a torn last line (a writer killed midway) is
    left out, any other bad line an InputError naming it."""
    path = Path(path)
    data = read_bytes(path, field="--amend-chain", limit=16 << 20)
    recs = []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip() or (i == len(lines) and not data.endswith(b"\n")):
            continue
        rec = loads(raw, path=path, field=f"line {i}")
        if not isinstance(rec, dict) or rec.get("schema") != CHAIN_SCHEMA:
            raise InputError(f"line {i} is not a {CHAIN_SCHEMA} record", path=path,
                             field=f"line {i}")
        for key in ("amends", "sha256"):
            if not is_sha256(rec.get(key)):
                raise InputError("expected a sha256 (64 hex digits)", path=path,
                                 field=f"line {i}.{key}")
        safe_name(rec.get("file"), field=f"line {i}.file", path=path, what="file name")
        recs.append({**rec, "where": path.parent})
    return recs


def _trusted(path: Path, named) -> list[dict]:
    """The amendment records trusted for ``path``: the chain file beside it, then what the user
    named (chain files, ``.jsonl``; or amendment files, whose own hashes are taken), in order."""
    recs = []
    beside = path.parent / CHAIN_FILE
    if beside.exists() or beside.is_symlink():
        recs += read_chain_file(beside)
    for n in named or ():
        n = Path(n)
        if n.suffix == ".jsonl":
            recs += read_chain_file(n)
            continue
        doc = load(n)
        am = doc.get("amends")
        if not isinstance(am, Mapping) or not is_sha256(am.get("sha256")):
            raise InputError("not an amendment (no amends.sha256)", path=n,
                             field="--amend-chain", exit_code=EX_USAGE)
        recs.append({"amends": am["sha256"], "sha256": doc["sha256"], "file": n.name,
                     "reason": am.get("reason"), "where": n.parent, "named": True})
    return recs


def resolve_chain(path: str | os.PathLike, named=None) -> Chain:
    """From ``path``, follow the trusted amendments (:func:`_trusted`) to the newest: for each
    link, its amendment recorded last whose file is there, verifies and has the recorded
    sha256."""
    path = Path(path)
    start = load(path)
    links = [ChainLink(str(path), start["sha256"], None, start.get("created"))]
    skipped: list[str] = []
    recs = _trusted(path, named)
    seen = {start["sha256"]}
    cur = start["sha256"]
    while True:
        nxt = None
        for rec in reversed([r for r in recs if r["amends"] == cur]):
            f = inside(rec["where"], rec["file"], field="file")
            try:
                doc = load(f, check=False)
                if not verify_doc(doc, str(f)).ok:
                    skipped.append(f"{f.name} fails verification")
                    continue
                _check_registered(doc, f)
            except InputError as e:
                skipped.append(f"{rec['file']} recorded but not readable ({str(e)[:120]})")
                continue
            if doc.get("sha256") != rec["sha256"] or \
                    (doc.get("amends") or {}).get("sha256") != cur:
                skipped.append(f"{f.name}: its sha256 is not the one recorded for it (edited "
                               f"and resealed after it was recorded?)")
                continue
            nxt = (f, doc)
            break
        if nxt is None or nxt[1]["sha256"] in seen:
            break
        f, doc = nxt
        seen.add(doc["sha256"])
        links.append(ChainLink(str(f), doc["sha256"], doc["amends"].get("reason"),
                               doc.get("created")))
        cur = doc["sha256"]
    known = {(Path(r["where"]).resolve(), r["file"]) for r in recs}
    return Chain(links=links, skipped=skipped, unrecorded=_unrecorded(path, seen, known))


def _unrecorded(path: Path, followed: set[str], known: set) -> list[str]:
    """Files beside ``path`` that claim to amend a followed link but are neither followed nor
    ``known`` ((directory, name) of the trusted records); a FIFO or huge file is passed over."""
    out = []
    for p in sorted(path.parent.glob("*.json")):
        if (p.parent.resolve(), p.name) in known:
            continue
        try:
            doc = loads(read_bytes(p, limit=SCAN_LIMIT), path=p)
        except InputError:
            continue
        if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("prereg/"):
            continue
        am = doc.get("amends")
        if isinstance(am, Mapping) and am.get("sha256") in followed and \
                doc.get("sha256") not in followed:
            out.append(f"{p.name} claims to amend it but is not recorded in {CHAIN_FILE} nor "
                       f"named with --amend-chain")
    return out
