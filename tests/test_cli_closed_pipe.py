"""A reader that goes away (`ladder fit runs | head`) never costs a command its artifact: every
command that writes a file writes it before it prints, and a closed stdout after that leaves the
command's own exit status (ladder.cli.output). The stdout here is a pipe whose reader is already
closed and that is line-buffered, as Python's stdout is under PYTHONUNBUFFERED=1 (common in
containers), so the first line printed meets the closed pipe."""

import contextlib
import json
import os
import sys

import pytest
from helpers import write_law_runs

import ladder.fit.estimate
import ladder.fit.solver
from ladder.cli.main import main
from ladder.fit.law import load_law

TARGET = "tiny:46.4K-A21.1K"


@contextlib.contextmanager
def closed_stdout():
    """sys.stdout a pipe whose reader is gone (set inside the test: pytest's capture resets
    sys.stdout between a fixture's setup and the test)."""
    r, w = os.pipe()
    os.close(r)
    stream = open(w, "w", buffering=1)  # noqa: SIM115 - closed below, whatever it holds
    saved, sys.stdout = sys.stdout, stream
    try:
        yield stream
    finally:
        sys.stdout = saved
        with contextlib.suppress(OSError):
            stream.close()


@pytest.fixture
def runs(tmp_path):
    write_law_runs(tmp_path / "runs")
    return tmp_path / "runs"


@pytest.mark.heavy  # 6 s on 2 busy cores
def test_fit_writes_law_json_before_the_report_meets_a_closed_pipe(runs, tmp_path):
    out = tmp_path / "law.json"
    with closed_stdout():
        assert main(["fit", str(runs), "--bootstrap", "0", "--out", str(out)]) == 0
    assert load_law(str(out)).metric == "eval_dropless/loss"
    # --json prints the law itself; the file is still written first
    out2 = tmp_path / "law2.json"
    with closed_stdout():
        assert main(["fit", str(runs), "--bootstrap", "0", "--json", "--out", str(out2)]) == 0
    assert json.loads(out2.read_text())["schema"] == json.loads(out.read_text())["schema"]


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_fit_of_several_metrics_writes_before_its_summary(runs, tmp_path):
    out = tmp_path / "law.json"
    with closed_stdout():
        assert main(["fit", str(runs), "--bootstrap", "0", "--metric", "eval_dropless/loss",
                     "--metric", "train/loss", "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())["laws"]) == {"eval_dropless/loss", "train/loss"}


def test_a_refused_fit_still_shows_its_report_and_writes_nothing(tmp_path, monkeypatch,
                                                                 capsys):
    """The report goes out before a refusal (its solver line says why), and no file."""
    orig = ladder.fit.solver.lbfgs

    def short(*a, **kw):  # a solver allowed 2 iterations cannot converge
        return orig(*a, **dict(kw, max_iter=2))
    monkeypatch.setattr(ladder.fit.estimate, "lbfgs", short)
    monkeypatch.setattr(ladder.fit.solver, "lbfgs", short)
    pts, out = tmp_path / "p.csv", tmp_path / "law.json"
    pts.write_text("run,compute,loss\n" + "".join(f"r{i},{c:g},{1.5 + 60 * c ** -0.12:.6f}\n"
                                                  for i, c in enumerate([1e10, 1e11, 1e12])))
    assert main(["fit", str(pts), "--form", "compute", "--bootstrap", "0",
                 "--out", str(out)]) == 65
    assert "law: compute" in capsys.readouterr().out and not out.exists()
    with closed_stdout():
        assert main(["fit", str(pts), "--form", "compute", "--bootstrap", "0",
                     "--out", str(out)]) == 65
    assert not out.exists()


def test_preregister_ends_with_its_own_status_after_writing(runs, tmp_path):
    law, out = tmp_path / "law.json", tmp_path / "prereg.json"
    assert main(["fit", str(runs), "--bootstrap", "0", "--out", str(law)]) == 0
    with closed_stdout():
        assert main(["preregister", str(law), "--target", TARGET, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["target"]["name"] == TARGET


@pytest.mark.heavy  # 5 s on 2 busy cores
def test_report_ends_with_its_own_status_after_writing(runs, tmp_path):
    law, out = tmp_path / "law.json", tmp_path / "rep"
    assert main(["fit", str(runs), "--bootstrap", "0", "--out", str(law)]) == 0
    with closed_stdout():
        assert main(["report", "--law", str(law), "--out", str(out)]) == 0
    assert (out / "index.html").is_file() and (out / "law.png").is_file()


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_isoflop_writes_its_figure_before_the_report(tmp_path):
    from test_isoflop import chinchilla_table
    path, png = tmp_path / "iso.csv", tmp_path / "iso.png"
    chinchilla_table().to_csv(path, index=False)
    with closed_stdout():
        assert main(["isoflop", str(path), "--bootstrap", "0", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_compare_writes_its_folder_before_the_report(tmp_path):
    from test_compare import C, pair
    a, b = pair(1.3, compute=C[:4])
    pa, pb, out = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "cmp"
    a.to_csv(pa, index=False)
    b.to_csv(pb, index=False)
    with closed_stdout():
        assert main(["compare", str(pa), str(pb), "--bootstrap", "0", "--fix", "E=2",
                     "--free-asymptote", "--equal-weights", "--out", str(out)]) == 0
    assert json.loads((out / "compare.json").read_text())["schema"] == "compare/1"


def test_list_into_a_closed_pipe_still_ends_quietly_with_141():
    """What `ladder list` makes is its printout: a reader gone before it is out is a SIGPIPE."""
    with closed_stdout():
        assert main(["list", "tiny"]) == 141


def test_the_demo_goes_on_past_a_closed_pipe():
    """`ladder demo | head`: its progress lines and the live watcher's alert lines meet the closed
    pipe (the demo itself is slow: its two printers are tested); the demo goes on to write its
    artifacts and end with its own status."""
    from ladder.cli import demo
    from ladder.predict.watch.alerts import Alert

    alert = Alert(time="t", step=10, tokens=None, fraction=0.5, kind="loss-band",
                  severity="warn", value=2.0, expected=1.9, lo=1.8, hi=1.95, direction="above",
                  message="outside the band")
    with closed_stdout():
        demo.say("[1/5] rung 1/3")
        demo.SaySink().send(alert, {})
    with closed_stdout():  # the watcher's thread may be the first to meet it
        demo.SaySink().send(alert, {})
        demo.say("[5/5] report: demo_out/report/index.html")
