"""Rendering: the self-contained ``index.html`` (PNG figures embedded as base64 data URIs, inline
CSS, no script and no network) and the short ``summary.md``."""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone

from ladder.reports.inputs import ReportInputs
from ladder.reports.style import FORECAST_COLOR, SEVERITY_COLORS, loss_fmt, num
from ladder.reports.tables import (alert_counts, alert_rows, decision_rule, forecast_rows, law_rows,
                                   run_rows, shown_alerts)

CSS = f"""
body {{ font: 15px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: #1a1a1a; background: #fafafa; margin: 0; }}
main {{ max-width: 1280px; margin: 0 auto; padding: 24px 32px 64px; }}
h1 {{ font-size: 26px; margin: 8px 0 4px; }}
h2 {{ font-size: 19px; margin: 36px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }}
.sub {{ color: #666; margin: 0 0 16px; }}
.verdict {{ background: #fff; border-left: 5px solid {FORECAST_COLOR}; padding: 10px 16px;
           margin: 12px 0; box-shadow: 0 1px 2px rgba(0,0,0,.06); }}
.verdict.bad {{ border-left-color: {SEVERITY_COLORS['critical']}; }}
.verdict.warn {{ border-left-color: {SEVERITY_COLORS['warn']}; }}
.verdict ul {{ margin: 4px 0; padding-left: 20px; }}
figure {{ margin: 12px 0 20px; background: #fff; padding: 8px; border: 1px solid #e4e4e4;
         border-radius: 4px; }}
figure img {{ max-width: 100%; height: auto; display: block; margin: 0 auto; }}
figcaption {{ color: #555; font-size: 13px; margin-top: 6px; }}
table {{ border-collapse: collapse; background: #fff; font-size: 13.5px; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #e0e0e0; padding: 4px 10px; text-align: left; vertical-align: top; }}
th {{ background: #f1f3f5; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.sev-critical {{ color: {SEVERITY_COLORS['critical']}; font-weight: 600; }}
.sev-warn {{ color: {SEVERITY_COLORS['warn']}; font-weight: 600; }}
.sev-info {{ color: {SEVERITY_COLORS['info']}; }}
.missing {{ color: #a61e4d; }}
.rule {{ font-size: 13px; color: #333; max-width: 1000px; }}
code {{ background: #f1f3f5; padding: 1px 4px; border-radius: 3px; }}
"""


def _esc(x) -> str:
    return html.escape(str(x))


def _table(rows: list[dict], empty: str) -> str:
    if not rows:
        return f'<p class="missing">{_esc(empty)}</p>'
    cols = list(rows[0])
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cls = f' class="sev-{_esc(v)}"' if c == "severity" else ""
            numeric = isinstance(v, str) and v[:1] in "+-0123456789["
            if not cls and numeric and c not in ("message", "run"):
                cls = ' class="num"'
            cells.append(f"<td{cls}>{_esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def verdict_lines(inp: ReportInputs) -> tuple[list[str], str]:
    """Up to five lines that say what happened, and a tone: ok | warn | bad."""
    lines, tone = [], "ok"
    v = inp.verdict
    name = inp.target_name or "target"
    if inp.target is not None and inp.target.status in ("diverged", "failed"):
        tone = "bad"
        step = inp.target.summary.get("step")
        lines.append(f"{name} {inp.target.status} at step {step} of {inp.target.steps or '?'}"
                     " (summary.json).")
    where = ("final" if v["complete"] else f"latest (at {v['fraction']:.0%} of the run)") \
        if "actual" in v else ""
    if "not_applicable_since" in v:
        tone = "warn"
        lines.append(f"{name}: the forecast no longer applies since {v['not_applicable_since']:.0%}"
                     f" of the run ({v['not_applicable_reason']}); the last value "
                     f"{loss_fmt(v['actual'])} is not judged against it.")
    elif "inside" in v:
        lines.append(f"{name} {where} {inp.metric}: {loss_fmt(v['actual'])}; forecast "
                     f"{loss_fmt(v['forecast'])} [{loss_fmt(v['lo'])}, {loss_fmt(v['hi'])}] "
                     f"({inp.level:.0%} band).")
        if v["inside"]:
            lines.append("Inside the pre-registered band.")
        else:
            tone = "bad"
            side = "above" if v["actual"] > v["hi"] else "below"
            lines.append(f"OUTSIDE the pre-registered band ({side}).")
    elif v.get("band_missing"):
        lines.append(f"{name} {where} {inp.metric}: {loss_fmt(v['actual'])}; forecast "
                     f"{loss_fmt(v['forecast'])} ({v['actual'] / v['forecast'] - 1:+.2%}).")
        tone = "warn"
        lines.append("The pre-registered band is missing (the law could not compute it): "
                     "inside/outside cannot be judged.")
    elif inp.prereg and isinstance(inp.prereg.get("final"), dict):
        f = inp.prereg["final"]
        lines.append(f"{name} pre-registered final {inp.metric}: {loss_fmt(f.get('loss'))} "
                     f"[{loss_fmt(f.get('lo'))}, {loss_fmt(f.get('hi'))}]; "
                     "no live points to compare.")
    if inp.alerts is not None:
        c = alert_counts(inp)
        if c.get("critical"):
            tone = "bad"
        elif c.get("warn") and tone == "ok":
            tone = "warn"
        kinds = sorted({str(a.get("kind")) for a in inp.alerts
                        if a.get("severity") in ("warn", "critical")})
        lines.append(f"Alerts: {c.get('critical', 0)} critical, {c.get('warn', 0)} warning, "
                     f"{c.get('info', 0)} info" + (f" ({', '.join(kinds)})." if kinds else "."))
    if inp.law is not None:
        n = len(inp.law.params)
        shown = ", ".join(f"{k}={num(v)}" for k, v in inp.law.params.items()) if n <= 4 else \
            f"{n} parameters (table below)"
        lines.append(f"Law: {inp.law.form} fitted on {inp.metric}; {shown}.")
    if inp.rungs:
        done = sum(r.status == "complete" for r in inp.rungs)
        lines.append(f"Ladder: {len(inp.rungs)} rungs, {done} complete.")
    return lines[:5], tone


SECTIONS = (
    ("ladder", "1. The ladder",
     ("Each rung's held-out loss against tokens (dots) with the exported law: along each rung's "
      "own schedule for a law of whole runs (trajectory), or through the rungs' final points "
      "for a law of final points. Colours are fixed per rung throughout the report.")),
    ("law", "2. The law",
     ("Final loss of the finished rungs against training compute on log axes, the fitted law "
      "with its band, and the pre-registered forecast for the target far to the right. Right: "
      "backtest errors recorded in law.json (fit on smaller runs, predict a held-out larger "
      "one).")),
    ("watch", "3. The watch",
     ("The target's live curve over the band that was frozen before it started; thin grey: its "
      "train loss, clipped to the axes. Vertical lines: loss alerts where they fired, coloured "
      "by severity; triangles on the top edge: other alerts; hatched: the forecast did not "
      "apply. Bottom: the deviation from the forecast.")),
    ("health", "4. Health against the ladder",
     ("Training health signals at the same fraction of each run's schedule: ladder rungs thin, "
      "the target thick. Vertical lines: health alerts.")),
)


def render_html(inp: ReportInputs, pngs: dict[str, bytes], missing_plots: dict[str, str]) -> str:
    lines, tone = verdict_lines(inp)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Scaling-ladder report: {_esc(inp.target_name or 'ladder')}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>Scaling-ladder report{': ' + _esc(inp.target_name) if inp.target_name else ''}</h1>",
        (f'<p class="sub">metric <code>{_esc(inp.metric)}</code>, band level {inp.level:.0%}; '
         f"generated {stamp} from artifacts only.</p>"),
    ]
    if lines:
        cls = {"ok": "", "warn": " warn", "bad": " bad"}[tone]
        parts.append(f'<div class="verdict{cls}"><ul>'
                     + "".join(f"<li>{_esc(x)}</li>" for x in lines) + "</ul></div>")
    from ladder.reports import updated
    up_line = updated.line(updated.of_inputs(inp), inp.metric)
    if up_line:  # issue 40: the updated forecast, labelled, beside the frozen numbers
        parts.append(f'<p class="updated">{_esc(up_line)}</p>')
    if "metrics" in pngs:  # a multi-metric pre-registration (ladder.reports.metrics)
        from ladder.reports.metrics import panel_rows
        b64 = base64.b64encode(pngs["metrics"]).decode("ascii")
        parts += ["<h2>Every registered metric</h2>",
                  f'<figure><img src="data:image/png;base64,{b64}" alt="every metric">'
                  "<figcaption>One panel per registered metric: the target's live curve, "
                  "the frozen band, the alerts about that metric; sorted by the largest "
                  "residual (median of the last evals, relative to the forecast) first "
                  "(file: metrics.png)</figcaption></figure>",
                  _table(panel_rows(inp), "no metrics")]
    for key, title, caption in SECTIONS:
        parts.append(f"<h2>{_esc(title)}</h2>")
        if key in pngs:
            b64 = base64.b64encode(pngs[key]).decode("ascii")
            parts.append(f'<figure><img src="data:image/png;base64,{b64}" alt="{_esc(title)}">'
                         f"<figcaption>{_esc(caption)} (file: {key}.png)</figcaption></figure>")
        else:
            parts.append(f'<p class="missing">Not drawn: {_esc(missing_plots.get(key, "missing"))}'
                         "</p>")
    parts += ["<h2>5. Numbers</h2>", "<h3>Law parameters</h3>",
              _table(law_rows(inp), "no law given"),
              f"<h3>Forecast vs actual ({_esc(inp.metric)})</h3>",
              _table(forecast_rows(inp), "no pre-registration given")]
    rule = inp.prereg.get("decision_rule") if inp.prereg else None
    words = rule.get("words") if isinstance(rule, dict) else rule if isinstance(rule, str) else None
    if words:
        short, items = decision_rule(str(words))
        parts += ["<h3>Decision rule (pre-registered)</h3>", f'<p class="rule">{_esc(short)}</p>',
                  f'<details class="rule"><summary>every rule ({len(items)})</summary><ul>'
                  + "".join(f"<li>{_esc(x)}</li>" for x in items) + "</ul></details>"]
    n = len(shown_alerts(inp))
    empty = "no alerts file given" if inp.alerts is None else "no alerts fired"
    parts += [f"<h3>Alerts ({n})</h3>", _table(alert_rows(inp), empty)]
    if n > 200:
        parts.append(f"<p>first 200 of {n} alerts shown.</p>")
    parts += ["<h3>Runs</h3>", _table(run_rows(inp), "no runs")]
    notes = list(inp.notes)
    if inp.law is not None and inp.law.error and inp.law.error not in notes:
        notes.append(inp.law.error)  # set while drawing: the law could not be evaluated
    if notes:
        parts.append("<h3>Missing or unusable inputs</h3><ul>"
                     + "".join(f'<li class="missing">{_esc(x)}</li>' for x in notes)
                     + "</ul>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in cols) + " |"
            for r in rows]
    return "\n".join(out) + "\n"


def render_summary(inp: ReportInputs, pngs: dict[str, bytes]) -> str:
    lines, _ = verdict_lines(inp)
    # names come from files: inline HTML in Markdown is live in most viewers (issue 15: a
    # target named <script> survived), so <, > and & are escaped
    name = _md_text(inp.target_name) if inp.target_name else ""
    out = [f"# Scaling-ladder report{': ' + name if name else ''}", ""]
    out += [f"- {_md_text(x)}" for x in lines] or ["- nothing to report: no artifacts given"]
    from ladder.reports import updated
    up_line = updated.line(updated.of_inputs(inp), inp.metric)
    if up_line:  # issue 40: the updated forecast, labelled, beside the frozen numbers
        out += [f"- {_md_text(up_line)}"]
    from ladder.reports.metrics import panel_rows
    pr_rows = panel_rows(inp)
    if pr_rows:
        out += ["", "## Every registered metric (largest residual first)", "",
                _md_table(pr_rows)]
    fr = forecast_rows(inp)
    if fr:
        out += ["", f"## Forecast vs actual ({inp.metric})", "", _md_table(fr)]
    if pngs:
        out += ["", "Figures: " + ", ".join(f"[{k}]({k}.png)" for k in pngs)
                + "; full report: [index.html](index.html)."]
    notes = list(inp.notes)
    if inp.law is not None and inp.law.error and inp.law.error not in notes:
        notes.append(inp.law.error)
    if notes:
        out += ["", "Missing: " + _md_text("; ".join(notes)) + "."]
    return "\n".join(out) + "\n"


def _md_text(text) -> str:
    return html.escape(str(text), quote=False)
