"""`ladder report`: the report of a ladder's artifacts (:func:`ladder.reports.build.build_report`),
or with ``--serve`` the live page over the same files."""

from __future__ import annotations

from ladder.io import EX_USAGE, InputError


def report_main(args) -> int:
    serve = getattr(args, "serve", False)
    if args.out is None and not serve:
        raise InputError("required (or --serve for a live page)", field="--out",
                         exit_code=EX_USAGE)
    if args.out is not None:
        from ladder.reports.build import build_report
        path = build_report(args.out, runs=args.runs, law=args.law, prereg=args.prereg,
                            alerts=args.alerts, target_run=args.target_run,
                            points=getattr(args, "points", None))
        from ladder.cli.output import tell  # after the report is written: a closed pipe
        tell(f"report: {path}")             # costs the printout, not the exit status
        summary = path.parent / "summary.md"
        tell(summary.read_text(encoding="utf-8").split("\n## ")[0].rstrip())
    if serve:
        from ladder.reports.live import LivePage, serve_forever
        page = LivePage.for_files(runs=args.runs, law=args.law, prereg=args.prereg,
                                  alerts=args.alerts, target_run=args.target_run,
                                  port=args.port, title="ladder: live report")
        page.snapshot()  # a bad input file fails here, before anyone opens the page
        print(f"live page: {page.url} (Ctrl-C stops it)", flush=True)
        serve_forever(page)
    return 0
