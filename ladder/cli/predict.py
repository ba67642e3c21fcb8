"""`ladder preregister`, `ladder verify` and `ladder watch` (arguments are parsed in cli/main)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import sys
from pathlib import Path

from ladder.io import (EX_DATAERR, EX_TERMINATED, EX_USAGE, InputError, as_float, check_writable,
                       inside, iter_jsonl, number, open_input, read_json, to_jsonable)
from ladder.predict import forecast as fc
from ladder.predict import prereg as pr
from ladder.predict.prereg import make_prereg
from ladder.predict.watch import WatchConfig
from ladder.stopflag import StopFlag

log = logging.getLogger("ladder")


def load_law_file(path: str, *, every_metric: bool = False):
    """The law of ``fit.load_law`` or, with ``every_metric``, ``{metric key: law}`` of
    ``fit.load_laws`` (one for a single-metric file)."""
    from ladder.fit import load_law, load_laws
    return load_laws(path) if every_metric else load_law(path)


def parse_requires(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {item!r}", field="--require",
                             exit_code=EX_USAGE)
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def target_rung(target: str):
    """The one rung ``--target`` names (LADDER:RUNG, LADDER/RUNG or a RUNG one ladder has)."""
    from ladder.specs import is_one_rung, lookup_message, resolve
    try:
        _, rungs = resolve(target)
    except KeyError as e:
        raise InputError(lookup_message(e), field="--target", exit_code=EX_USAGE) from None
    if not is_one_rung(target) or len(rungs) != 1:
        raise InputError(f"expected one rung (LADDER:RUNG), got the ladder {target!r}",
                         field="--target", exit_code=EX_USAGE)
    return rungs[0]


def resolve_target(args) -> fc.Target:
    if args.target:
        return fc.Target.from_rung(target_rung(args.target))
    return fc.Target.from_spec(read_json(args.target_spec), path=args.target_spec)


def preregister_main(args) -> int:
    if args.reason and not args.amend:
        raise InputError("--reason is only for --amend", field="--reason", exit_code=EX_USAGE)
    if args.level is None:   # an amendment at a step keeps the old level
        args.level = 0.9 if args.at_step is None else None
    number(args.level, field="--level", lo=0, hi=1, lo_open=True, hi_open=True, allow_none=True,
           exit_code=EX_USAGE)
    # an eval's sd above 10 nats is no measurement of a loss of a few nats (a typo'd unit)
    number(args.eval_noise, field="--eval-noise", lo=0, hi=10, allow_none=True,
           exit_code=EX_USAGE)
    out = Path(args.out)
    if out.exists() or out.is_symlink():  # fail before any work
        raise InputError("exists; a pre-registration is never overwritten", path=out,
                         exit_code=73)
    if args.wandb:  # before anything is written: wandb must be there
        from ladder.predict.wandb_home import require_wandb
        require_wandb()
    check_writable(out, field="--out")
    if args.amend and out.parent.resolve() != Path(args.amend).parent.resolve():
        # the chain file beside them records it: the watcher given the old file finds it there
        raise InputError(f"an amendment is written beside the file it amends "
                         f"({Path(args.amend).parent}/), where its chain file "
                         f"({pr.CHAIN_FILE}) records it", field="--out", exit_code=EX_USAGE)
    if args.at_step is not None:
        if not args.amend:
            raise InputError("--at-step amends a pre-registration: give it with --amend OLD.json",
                             field="--at-step", exit_code=EX_USAGE)
        amends = pr.amendment(args.amend, args.reason)
        return _write_and_say(args, out, at_step_prereg(args, amends), amends)
    at_step_only = [f"--{d.replace('_', '-')}" for d in ("source", "multiplier", "compare",
                    "seq_len", "transition", "transition_width") if getattr(args, d) is not None]
    if at_step_only:
        raise InputError(f"{at_step_only[0]} is only for an amendment at a step (--at-step S)",
                         field=at_step_only[0], exit_code=EX_USAGE)
    if args.law is None or not (args.target or args.target_spec):
        raise InputError("give LAW.json and --target (or --target-spec); only --at-step takes "
                         "them from the amended file", field="--target" if args.law else "law",
                         exit_code=EX_USAGE)
    amends = pr.amendment(args.amend, args.reason) if args.amend else None
    laws = load_law_file(args.law, every_metric=True)
    if len(laws) > 1 and args.wandb:
        raise InputError("--wandb logs one metric's forecast; a multi-metric law.json is "
                         "registered without it (or register each metric alone)",
                         field="--wandb", exit_code=EX_USAGE)
    if len(laws) > 1:
        return _write_and_say(args, out, multi_prereg(args, laws, amends), amends)
    doc = _forecast(args, next(iter(laws.values())), resolve_target(args), amends,
                    whose="the law", field="fit.u")
    return _write_and_say(args, out, doc, amends)


def _forecast(args, law, target: fc.Target, amends: dict | None, *, whose: str, field: str,
              config: WatchConfig | None = None) -> dict:
    """One law's pre-registration of ``target`` (a curve law on the --target rung's schedule),
    refused when a forecast loss is not finite (the law's terms overflow float64 there):
    nothing is registered."""
    run_config = target_rung(args.target).to_dict() if args.target else None
    doc = make_prereg(_scheduled(law, args), target, level=args.level, runs=args.runs,
                      eval_noise=args.eval_noise, data_tag=args.data_tag,
                      requires=parse_requires(args.require), amends=amends,
                      run_config=run_config, config=config, allow_no_band=args.allow_no_band)
    bad = [p for p in doc["forecast"] if not _finite(p.get("loss"))]
    if bad or not _finite(doc["final"].get("loss")):
        raise InputError(f"{whose} forecasts a non-finite loss at {len(bad)} of "
                         f"{len(doc['forecast'])} points (its terms overflow float64 at the "
                         f"target); nothing registered", path=args.law, field=field)
    return doc


def _scheduled(law, args, *, plan: str = "target", field: str = "--target-spec"):
    """A curve law (mpl, momentum) forecasts a run from its LR schedule: the rung's (``plan``
    and ``field``: what the refusal asks for when no rung is given)."""
    if getattr(law, "form", None) not in ("mpl", "momentum"):
        return law
    if not args.target:
        raise InputError(f"a {law.form} law forecasts a run from its LR schedule: give the "
                         f"{plan} as --target LADDER:RUNG", field=field,
                         exit_code=EX_USAGE)
    from ladder.fit.lr_schedules import NamedSchedule
    return law.on(NamedSchedule.of_rung(target_rung(args.target)))


def multi_prereg(args, laws: dict, amends: dict | None, *,
                 config: WatchConfig | None = None) -> dict:
    """The multi-metric pre-registration (prereg/3) of a law/2 file: a forecast per metric on
    the target's grid, one decision rule at the family's Sidak level
    (ladder.predict.watch.multi.family_config), one sha256 over the whole."""
    from ladder.predict.watch.multi import family_config
    target = resolve_target(args)
    cfg, family = family_config(config or WatchConfig(), len(laws))
    docs = {key: _forecast(args, law, target, amends, whose=f"the law of {key!r}",
                           field=f"laws.{key}", config=cfg) for key, law in laws.items()}
    # the spike threshold is calibrated once per run: every document carries the same rule
    return pr.build_multi(docs, family=family)


def _write_and_say(args, out: Path, doc: dict, amends: dict | None) -> int:
    from ladder.cli.output import tell  # the file is written: a closed pipe costs the lines
    pr.write_once(out, doc)
    tell(f"wrote {out} (read-only), sha256 {doc['sha256']}")
    if doc.get("schema") == pr.SCHEMA_V3:
        fam = doc["decision_rule"]["family"]
        tell(f"  {len(doc['metrics'])} metrics, one band each at {doc['band_level']:.0%}; "
             f"alerts at the Sidak level {fam['alert_level']:.5f} per metric (family-wise "
             f"{fam['family_alert_level']})")
        for k in doc["metrics"]:
            fin = doc["forecasts"][k]["final"]
            tell(f"  {k}: final {fin['loss']:.4f} [{fin['lo']:.4f}, {fin['hi']:.4f}]")
        if amends:
            tell(f"  amends {amends['path']}: {amends['reason']}")
        return 0
    fin = doc["final"]
    target = fc.Target.from_spec(doc["target"], path=out)

    def num(v):
        return f"{v:.4f}" if isinstance(v, float) else str(v)
    tell(f"  target {target.name}: final {doc['metric']} {num(fin['loss'])} "
         f"[{num(fin['lo'])}, {num(fin['hi'])}] at {doc['band_level']:.0%}; "
         f"{len(doc['forecast'])} forecast points; eval noise {doc['eval_noise']['sigma']:.4g} "
         f"({doc['eval_noise']['method']})")
    if amends:
        tell(f"  amends {amends['path']} (sha256 {amends['sha256'][:12]}...): {amends['reason']}"
             f"; recorded in {out.parent / pr.CHAIN_FILE}")
    ch = doc.get("change")
    if ch:
        m = ch["multiplier"]
        tell(f"  from step {ch['at_step']} ({ch['fraction']:.1%}): the old forecast before it "
             f"({ch['carried_rows']} rows carried), anchored on {len(ch['anchor']['steps'])} "
             f"evals (log ratio {ch['anchor']['log_ratio']:+.4f}); multiplier {m['value']:.4g} "
             f"[{m['lo']:.4g}, {m['hi']:.4g}]; transition {ch['transition']}; the change's "
             f"share of the final band's variance {ch['final_band_share_of_change']:.0%}")
    if args.wandb:
        from ladder.predict.wandb_home import log_forecast
        group = target_rung(args.target).ladder if args.target else None
        info = log_forecast(doc, out, entity=args.wandb_entity, project=args.wandb_project,
                            group=group)
        tell(f"  W&B: forecast run {info['id']} in {info['entity'] or '(default entity)'}/"
             f"{info['project']}, group {info['group']} ({info['dir']})")
    return 0


def at_step_prereg(args, amends: dict, *, law=None) -> dict:
    """The amendment at step ``args.at_step`` (ladder.predict.amend): the old file's law and target
    unless ``LAW.json``/``--target`` give the new plan's, the change from the options, the
    anchor from ``--source``. ``law``: a law object to use instead (library callers)."""
    from ladder.predict import amend as am
    old = pr.load(args.amend)
    if old.get("schema") == pr.SCHEMA_V3:
        raise InputError("an amendment at a step (--at-step) of a multi-metric pre-registration "
                         "is not supported; amend it without --at-step (a new law/2 file and "
                         "--target), or register the metric alone", path=args.amend,
                         field="--at-step", exit_code=EX_USAGE)
    metric = old["metric"]
    # the rows before S are the old file's, at its band level: the amendment keeps that level
    old_level = as_float(old.get("band_level")) or 0.9
    if args.level is not None and args.level != old_level:
        raise InputError(f"an amendment at a step keeps the band level of the forecast it "
                         f"carries ({old_level:g}); leave --level out", field="--level",
                         exit_code=EX_USAGE)
    args.level = old_level
    if args.target or args.target_spec:
        target = resolve_target(args)
    else:
        target = fc.Target.from_spec(old["target"], path=args.amend)
    # the step first: a bad one is refused before any law is read
    number(args.at_step, field="--at-step", lo=1, hi=target.steps - 1, integral=True,
           exit_code=EX_USAGE)
    if args.source is None:
        raise InputError("--at-step anchors on the run's own evals: give the run as --source",
                         field="--source", exit_code=EX_USAGE)
    mult, seq_len = _at_step_change(args, old)
    # the anchor before the law: a run with no eval up to S is refused before any law is read
    evals = am.read_evals(args.source, metric, upto=args.at_step)
    if not evals[0].size or not (evals[0] >= 1).any():
        raise InputError(f"the run has no eval of {metric!r} at or before step {args.at_step}: "
                         f"nothing to anchor the amended forecast on", path=args.source,
                         field="--source", exit_code=EX_DATAERR)
    if law is None and args.law is not None:
        law = load_law_file(args.law)
    elif law is None:
        from ladder.fit.law import law_from_json
        law = law_from_json(old["law"], path=args.amend)
    law = _scheduled(law, args, plan="plan from step S on", field="--target")
    noise = args.eval_noise
    if noise is None:
        noise = as_float((old.get("eval_noise") or {}).get("sigma")) or 0.0
    plan = am.Plan(at_step=args.at_step, multiplier=mult, data_tag=args.data_tag,
                   seq_len=seq_len)
    body = am.amended_forecast(old, law, target, plan, evals, level=args.level,
                               eval_noise=noise,
                               transition=args.transition or am.DEFAULT,
                               width=getattr(args, "transition_width", None) or am.DEFAULT_WIDTH)
    tdict, app, params = _amended_plan(args, old, target, body, seq_len)
    rule = dict(old.get("decision_rule") or {})
    rule["parameters"] = params
    return pr.build(target=tdict, applicability=app, metric=metric, law=law.to_json(),
                    forecast=body["forecast"], final=body["final"], band_level=args.level,
                    eval_noise={**(old.get("eval_noise") or {}), "sigma": noise},
                    extrapolation=old.get("extrapolation"), decision_rule=rule,
                    health_reference=old.get("health_reference"), budget_curve=None,
                    amends=amends, change=body["change"])


def _at_step_change(args, old: dict) -> tuple:
    """The change an amendment at a step declares: (multiplier or None, sequence length or
    None), each checked against the registered plan; refused when nothing changes."""
    from ladder.predict import amend as am
    metric = old["metric"]
    mult = None
    if args.multiplier is not None:
        mult = am.parse_multiplier(args.multiplier)
    elif args.compare is not None:
        mult = am.multiplier_from_compare(args.compare, metric)
    seq_len = args.seq_len
    if seq_len is not None:
        number(seq_len, field="--seq-len", lo=1, integral=True, exit_code=EX_USAGE)
        if seq_len == int(old["target"]["seq_len"]):
            raise InputError(f"is the registered one ({seq_len}): not a change",
                             field="--seq-len", exit_code=EX_USAGE)
    old_tag = (old.get("applicability") or {}).get("data_tag")
    if args.data_tag is not None and mult is None:
        raise InputError("a new data tag needs the evidence of what it is worth: "
                         "--multiplier M[:LO:HI] or --compare COMPARE.json",
                         field="--data-tag", exit_code=EX_USAGE)
    if args.data_tag is not None and args.data_tag == old_tag:
        raise InputError(f"is the registered tag ({old_tag!r}): not a change",
                         field="--data-tag", exit_code=EX_USAGE)
    new_plan = args.law is not None or args.target or args.target_spec
    if mult is None and seq_len is None and not new_plan:
        raise InputError("nothing changes at this step: give the change (--data-tag with "
                         "--multiplier/--compare, --seq-len, or the new plan's LAW.json and "
                         "--target)", field="--at-step", exit_code=EX_USAGE)
    return mult, seq_len


def _amended_plan(args, old: dict, target, body: dict, seq_len) -> tuple[dict, dict, dict]:
    """The amendment's target, applicability and decision-rule parameters: the new plan as
    registered, its sequence length and (with one) the tokens and compute it now spends. The
    applicability accepts the plan before S as well (a run's configuration written before the
    change), and the watcher judges steps before S against the old steps."""
    tdict = target.to_dict()
    old_app = {k: v for k, v in (old.get("applicability") or {}).items() if k != "before"}
    app = {**old_app, "steps": target.steps, "tokens": target.tokens,
           "config_hash": target.config_hash}
    if args.target:
        app["config"] = target_rung(args.target).to_dict()
    if args.data_tag is not None:
        app["data_tag"] = args.data_tag
    params = dict((old.get("decision_rule") or {}).get("parameters") or {})
    if seq_len is not None:
        f_s, k = body["change"]["fraction"], body["change"]["seq_len_ratio"]
        spent = f_s + k * (1 - f_s)  # of the planned tokens and compute
        tdict.update(seq_len=seq_len, tokens=target.tokens * spent,
                     compute=target.compute * spent, config_hash=None)
        # two sequence lengths: no one tokens-per-step to check
        app.update(seq_len=seq_len, tokens=None)
        if isinstance(app.get("config"), dict) and "seq_len" in app["config"]:
            app["config"] = {**app["config"], "seq_len": seq_len}
        # tokens no longer grow linearly in steps: rows map to the forecast by step
        params["align"] = "step"
    app["before"] = {**old_app, "at_step": args.at_step}
    return tdict, app, params



def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def verify_chain(path: str, *, expect: str | None = None, named=None) -> dict:
    """The verification of a pre-registration and of the one it amends (library entry of
    `ladder verify`): ``{ok, path, stored, computed, changed, problems, amends, chain, lines}``,
    ``lines`` being the human-readable report. ``expect``: the sha256 the file must have (kept
    outside it: a hash proves the file is whole, not who sealed it); ``named``: amendments or
    chain files the user trusts (``--amend-chain``)."""
    v = pr.verify(path)
    out = {"ok": v.ok, "path": str(path), "stored": v.stored, "computed": v.computed,
           "changed": list(v.changed), "problems": list(v.problems), "amends": None,
           "chain": None, "expected": expect, "lines": [v.report()]}
    if expect is not None:
        want = expect.strip().lower()
        if not pr.is_sha256(want):
            raise InputError("expected a sha256 (64 hex digits)", field="--expect",
                             exit_code=EX_USAGE)
        if v.stored != want:
            out["ok"] = False
            out["lines"].append(f"  sha256 {v.stored} is NOT the expected {want}: not the "
                                f"file that was registered (resealed by hand, or another one)")
            return out
        out["lines"].append("  sha256 is the expected one (--expect)")
    if not v.ok:
        return out
    doc = read_json(path)
    am = doc.get("amends")
    if isinstance(am, dict):
        old = inside(Path(path).parent, am.get("path"), field="amends.path", path=path)
        out["amends"] = {"path": str(old), "sha256": am.get("sha256"),
                         "reason": am.get("reason"), "verified": False, "found": old.exists()}
        if not old.exists():
            out["lines"].append(f"  amends {am.get('path')} (sha256 {am.get('sha256')}): not "
                                f"found beside it")
        else:
            vo = pr.verify(old)
            if not vo.ok or vo.stored != am.get("sha256"):
                out["lines"].append(f"  amends {old}: its sha256 is {vo.stored}, this file names "
                                    f"{am.get('sha256')}; the chain is broken")
                out["ok"] = False
                return out
            out["amends"]["verified"] = True
            out["lines"].append(f"  amends {old} (verified), reason: {am.get('reason')}")
    chain = pr.resolve_chain(path, named)
    if len(chain.links) > 1 or chain.skipped or chain.unrecorded:
        out["chain"] = {"description": chain.describe(), "newest": chain.newest.path,
                        "links": [lk.path for lk in chain.links], "skipped": chain.skipped,
                        "unrecorded": chain.unrecorded}
        out["lines"].append(f"  chain: {chain.describe()}")
    return out


def verify_main(args) -> int:
    res = verify_chain(args.prereg, expect=args.expect, named=args.amend_chain)
    if args.json:
        print(json.dumps({k: v for k, v in res.items() if k != "lines"}))
    else:
        print("\n".join(res["lines"]))
    return 0 if res["ok"] else EX_DATAERR


def source_keys(src: str, max_rows: int = 200) -> str:
    """The metric keys of a local JSONL/CSV source (its header, or its first ``max_rows`` rows
    read by :func:`ladder.io.iter_jsonl`), for error messages; "" when it cannot be read."""
    p = Path(src)
    if not p.is_file():
        return ""
    keys: list[str] = []
    try:
        if p.suffix.lower() == ".csv":
            with open_input(p) as fh:
                header = fh.readline().decode("utf-8", errors="replace")
            keys = [k.strip() for k in header.rstrip("\n").split(",")]
        else:
            for _, (_, row) in zip(range(max_rows), iter_jsonl(p), strict=False):
                keys += [k for k in row if k not in keys]
    except InputError:
        return ""
    return ", ".join(keys)


def watch_main(args) -> int:
    """`ladder watch`: judge a run against its pre-registration (``--follow``: as it grows;
    ``--serve``: with the live page of ladder.reports.live)."""
    from ladder.predict import sinks as sk
    from ladder.predict.live import FollowConfig, Watcher
    from ladder.sources import KeyMappedSource, open_source

    follow = FollowConfig(poll_seconds=args.poll, max_seconds=args.max_seconds)
    for flag, path in (("--alerts", args.alerts), ("--state", args.state)):
        if path:
            check_writable(path, field=flag)
    url = sk.webhook_url(args.webhook, args.webhook_file, warn=log.warning)
    if args.webhook:
        # W&B records the command line in a run's metadata: not the secret
        sys.argv = sk.redact_argv(sys.argv, url)
    webhook = sk.WebhookSink(url) if url else None
    source = open_source(args.source, follow=args.follow)
    from ladder.sources.keymap import load_keymap
    keymap = load_keymap(args.keys)
    sinks = _alert_sinks(args, source, webhook)
    if keymap is not None:  # another trainer's names
        source = KeyMappedSource(source, keymap)
    if args.wandb:  # the residuals and alerts go to the watcher's own run
        from ladder.predict.wandb_home import WatchRunSink
        doc = pr.load(pr.resolve_chain(args.prereg, args.amend_chain).newest.path)
        if doc.get("schema") == pr.SCHEMA_V3:
            raise InputError("--wandb logs one metric's residuals; a multi-metric "
                             "pre-registration is watched without it", field="--wandb",
                             exit_code=EX_USAGE)
        home = WatchRunSink(doc, entity=args.wandb_entity, project=args.wandb_project,
                            dir=str(Path(args.prereg).resolve().parent))
        sinks.append(home)
    w = Watcher(args.prereg, source, sinks, args.state, metric=args.metric, follow=follow,
                amend_chain=args.amend_chain)
    span = EvalSpan()  # where the evals fell: what to blame when none was judged
    w.listeners.append(span)
    if args.wandb:
        home.attach(w)
    if w.multi:
        with _served(args, w, keymap), StopFlag(signals=(signal.SIGTERM,)) as stop:
            return _watch_multi_finish(args, w, stop)
    registered = w.doc.get("metric") if not args.metric else pr.load(w.chain.newest.path)["metric"]
    if args.metric and args.metric != registered:
        log.warning(f"ladder watch: the source's '{args.metric}' is compared with the forecast "
                    f"of '{registered}' (--metric names the source key holding the registered "
                    f"metric)")
    log.info(f"ladder watch: {w.description}; metric {w.view.metric}; source {args.source}")
    # a supervisor's SIGTERM (kill, systemd, Kubernetes, Slurm) ends the watch after the poll
    # under way, so what it judged reaches every sink (the W&B run too) and the state is saved:
    # exit 143; a second one stops at once, as Ctrl-C does
    with _served(args, w, keymap), StopFlag(signals=(signal.SIGTERM,)) as stop:
        code = w.run(follow=args.follow, stop=stop.event)
    st = w.state
    log.info(f"ladder watch: {st.get('n_points', 0)} points, {st.get('n_evals', 0)} evals "
             f"judged, last step {st.get('last_step')}; worst {st.get('worst') or 'none'}"
             + (f"; NOT APPLICABLE: {st['not_applicable']}" if st.get("not_applicable") else "")
             + f"; exit {code}")
    if args.json:
        print(json.dumps(to_jsonable(watch_verdict(w, code))))
    if stop.set:
        log.warning("ladder watch: stopped by SIGTERM; the state is saved (a restart goes on)")
        return EX_TERMINATED
    if not st.get("n_evals") and not st.get("not_applicable"):
        # judging nothing is not "nothing above info": evals outside the registered run (a
        # target.tokens or steps that is not this run's), else most likely the wrong --metric
        outside = span.refusal(w.view, prereg=args.prereg, source=args.source)
        if outside is not None:
            raise outside
        raise InputError(f"0 evals of '{w.view.metric}' judged ({st.get('n_points', 0)} points "
                         f"read); keys seen: {source_keys(args.source) or 'none'}; name the "
                         "source key with --metric", field="--metric", exit_code=EX_DATAERR)
    return code


class EvalSpan:
    """A watcher listener: how many evals of the watched metric the judged batches held, and
    where they fell in the registered run (the smallest and largest fraction), and by what
    (``target.tokens``, ``target.steps`` or the source's ``progress``: the ``align`` rule)."""

    def __init__(self):
        self.n, self.lo, self.hi, self.by = 0, math.inf, -math.inf, set()

    def __call__(self, view, batch) -> None:
        import numpy as np

        from ladder.predict.watch import row_fractions
        y = batch.cols.get(view.metric)
        if y is None or not len(batch):
            return
        ok = np.isfinite(y)
        f = row_fractions(view, batch)[ok]
        f = f[np.isfinite(f)]
        if not f.size:
            return
        self.n += int(f.size)
        self.lo, self.hi = min(self.lo, float(f.min())), max(self.hi, float(f.max()))
        align = view.config.align
        tokens = np.isfinite(batch.col("tokens")[ok])
        if align == "tokens" or align == "auto" and tokens.any():
            self.by.add("target.tokens")
        if align == "step" or align == "auto" and not tokens.all():
            self.by.add("target.steps")
        if align == "fraction":
            self.by.add("progress")

    def refusal(self, view, *, prereg, source) -> InputError | None:
        """The one line when evals were there but none fell inside the forecast (None when there
        were none: then the key is what to blame): it names the field they were placed by."""
        if not self.n:
            return None
        by = sorted(self.by)
        field = by[0] if len(by) == 1 else "target"
        said = {"target.tokens": f"target.tokens {view.tokens:g}",
                "target.steps": f"target.steps {view.steps:g}",
                "progress": "the source's progress"}
        how = " and ".join(said[b] for b in by)
        where = f"{self.lo:.3g}" if self.lo == self.hi else f"{self.lo:.3g} to {self.hi:.3g}"
        # what the loss rules compare: the forecast's grid, from min_fraction on
        first = max(float(view.fraction[0]), float(view.config.min_fraction))
        return InputError(
            f"0 of {self.n} evals of '{view.metric}' judged: by {how} they fall at fractions "
            f"{where} of the registered run, outside what is compared ({first:.3g} to "
            f"{float(view.fraction[-1]):.3g}); the source is not the run this file registers, "
            f"or its {field} is wrong", path=source if field == "progress" else prereg,
            field=field, exit_code=EX_DATAERR)


def _alert_sinks(args, source, webhook) -> list:
    """Where `ladder watch`'s alerts go: stdout (not with ``--json``: the alerts are in its final
    object), ``--alerts``, the ``webhook`` sink, ``--wandb-alert`` (of a W&B API ``source``)."""
    from ladder.predict import sinks as sk
    from ladder.sources import WandbApiSource
    sinks: list = [] if args.json else [sk.StdoutSink()]
    if args.alerts:
        sinks.append(sk.JsonlSink(args.alerts))
    if webhook is not None:
        sinks.append(webhook)
    if args.wandb_alert:
        if not isinstance(source, WandbApiSource):
            raise InputError("--wandb-alert needs a wandb://ENTITY/PROJECT/RUN_ID source",
                             field="--wandb-alert", exit_code=EX_USAGE)
        u = source.uri
        sinks.append(sk.WandbAlertSink(u.entity, u.project, u.run_ids[-1]))
    return sinks


@contextlib.contextmanager
def _served(args, w, keymap):
    """With ``--serve``, the watch's live page, closed when the watch ends."""
    if not args.serve:
        yield
        return
    from ladder.reports.live import LivePage
    # a restarted watcher's page reads the run once more from its start (the --source again)
    server = LivePage.for_watcher(w, port=args.port, source=args.source, keymap=keymap)
    log.warning(f"ladder watch: live page on {server.url}")
    try:
        yield
    finally:
        server.close()


def _watch_multi_finish(args, w, stop) -> int:
    """`ladder watch` of a multi-metric pre-registration: judge, then the verdict per metric
    (text on stderr, ``--json`` one object); a registered metric the source lacks is said."""
    from ladder.predict.watch.multi import metric_summary
    log.info(f"ladder watch: {w.description}; {len(w.view.metrics)} metrics; source "
             f"{args.source}")
    code = w.run(follow=args.follow, stop=stop.event)
    st = w.state
    rows = metric_summary(w.view, st, w.all_alerts)
    for r in rows:
        if r["absent"]:
            line = "ABSENT from the source (not judged)"
        else:
            rel = r["residual_rel"]
            line = (f"{(r['worst'] or 'ok'):8} {r['evals']:5d} evals, residual "
                    f"{'-' if rel is None else f'{rel:+.2%}'}, {r['alerts']} alerts")
        log.warning(f"  {r['metric']}: {line}")
    log.info(f"ladder watch: {st.get('n_points', 0)} points, {st.get('n_evals', 0)} evals "
             f"judged over {len(rows)} metrics; worst {st.get('worst') or 'none'}; exit {code}")
    if args.json:
        v = {**watch_verdict(w, code), "schema": "watch-verdict/2", "metric": None,
             "metrics": rows, "absent": [r["metric"] for r in rows if r["absent"]]}
        print(json.dumps(to_jsonable(v)))
    if stop.set:
        log.warning("ladder watch: stopped by SIGTERM; the state is saved (a restart goes on)")
        return EX_TERMINATED
    if not st.get("n_evals") and not st.get("not_applicable"):
        raise InputError(f"0 evals of the {len(rows)} registered metrics judged "
                         f"({st.get('n_points', 0)} points read); keys seen: "
                         f"{source_keys(args.source) or 'none'}", field="--source",
                         exit_code=EX_DATAERR)
    return code


def watch_verdict(w, code: int) -> dict:
    """The outcome of a watch as one JSON-ready object (`ladder watch --json`); ``updated`` is
    the forecast conditioned on the run's evals (issue 40), beside the frozen one, never in its
    place (None before the first eval)."""
    from ladder.predict.watch.rules.heading import updated_forecast
    st = w.state
    return {"schema": "watch-verdict/1", "exit": code, "worst": st.get("worst"),
            "not_applicable": st.get("not_applicable"), "prereg": w.description,
            "prereg_sha256": w.doc.get("sha256"), "follows_from_step": w.from_step,
            "metric": w.view.metric,
            "points": st.get("n_points", 0), "evals": st.get("n_evals", 0),
            "last_step": st.get("last_step"), "alerts": [a.to_dict() for a in w.all_alerts],
            "updated": updated_forecast(w.view, st.get("heading"))}
