"""Issue 39's readers, adversarially: the table per class (cases tried, clean), for this tree or
another checkout (``--tree DIR``: e.g. the code before, to show the cases failing there).

Classes: the law's fields (its extrapolation record and spread, the law/1 upgrade), our other
files' fields (state, key maps, compare files, a prereg/3 family record), a restarted watcher
(no step judged twice, whatever the source), bounded readers (memory under a cap, a split record
joined in linear time), the live page (slow clients, Host). Each case is judged:

- ``clean``: a bad input refused with one line naming the file or the field (exit 64+, or an
  InputError), or a tolerated one read as it should be;
- ``accepted``: a bad input used (exit 0, an Infinity band, an interval widened);
- ``traceback``: another exception; ``exhausted``: a MemoryError under the case's cap;
- ``rejudged``: a step judged twice by a restarted watcher; ``slow``: past the case's deadline.

    nice python bench/fuzz_readers.py [--tree DIR] [--only SUBSTRING] [-v]

Also printed: the time to decode a record split over ~1,600 blocks (50 MB) and the time a
GET /state.json waits behind 24 clients that trickle a header byte every 2 s, side by side
with the tree judged (run it with ``--tree`` for the other column).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import json
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.fuzz_inputs import address_space_cap, small_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    name: str
    cls: str
    run: Callable[[Path, Path], str]   # (world, scratch) -> verdict


def _sources():
    """The metrics readers' package (``ladder.sources``; ``ladder.predict.sources`` in a tree
    from before they moved, for ``--tree``)."""
    try:
        import ladder.sources as m
    except ImportError:
        import ladder.predict.sources as m
    return m


def _synthetic():
    """The synthetic ladder of the tests (tests/synthetic.py; ladder.predict.synthetic before)."""
    try:
        import synthetic as m
    except ImportError:
        from ladder.predict import synthetic as m
    return m


def _cli(*argv) -> tuple[int, str]:
    import io

    from ladder.cli.main import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def _verdict_cli(code: int, err: str, *names: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    if "Traceback" in err:
        return "traceback"
    if code is None or code < 64:
        return "accepted"
    return "clean" if len(lines) == 1 and any(n in lines[0] for n in names) else "unnamed"


def _guard(fn: Callable[[], str]) -> str:
    from ladder.io import InputError
    try:
        return fn()
    except InputError:
        return "clean"
    except MemoryError:
        return "exhausted"
    except Exception:  # noqa: BLE001 - the point: anything else escaping is a finding
        return "traceback"


def _apart(run: Callable[[Path, Path], str]) -> Callable[[Path, Path], str]:
    """``run`` in a forked child: a case under a memory cap may take the process down (orjson
    failing an allocation is a segmentation fault), which is its verdict, ``exhausted``."""
    import os

    def go(w: Path, tmp: Path) -> str:
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its verdict down the pipe, then out without cleanup
            os.close(r)
            v = _guard(lambda: run(w, tmp))
            os.write(wr, v.encode())
            os._exit(0)
        os.close(wr)
        with os.fdopen(r, "rb") as f:
            got = f.read().decode()
        _, status = os.waitpid(pid, 0)
        return got if os.WIFEXITED(status) and got else "exhausted"
    return go


# ----------------------------------------------------------------------------- the world


def build_world(root: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import KNOWN_LAW, write_law_runs

    from ladder.predict.forecast import Target
    E, A, alpha = KNOWN_LAW
    lad = write_law_runs(root / "runs")
    # form auto: the tiny ladder's 3 runs give a compute law with a band (a named --form is
    # the textbook estimator since issue 35: 3 points, 3 parameters, no residual dof)
    code, err = _cli("fit", root / "runs", "--form", "auto", "--bootstrap", "20", "--out",
                     root / "law.json")
    assert code == 0, err
    (root / "target.json").write_text(json.dumps(Target.from_rung(lad.target).to_dict()))
    code, err = _cli("preregister", root / "law.json", "--target-spec", root / "target.json",
                     "--out", root / "pre" / "prereg.json", "--eval-noise", "0.003")
    assert code == 0, err
    t = lad.target
    rows = [{"step": s, "tokens": s * t.tokens_per_step, "progress": s / t.steps, "time": 0.0,
             "eval_dropless/loss": E + A * t.compute(s * t.tokens_per_step) ** -alpha,
             "train/loss": 2.0} for s in t.eval_steps()]
    (root / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _set(doc, dotted: str, value):
    doc = copy.deepcopy(doc)
    node, parts = doc, dotted.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[int(parts[-1]) if isinstance(node, list) else parts[-1]] = value
    return doc


# ----------------------------------------------------------------------------- the cases


def _law_case(field: str, value, *, old: bool = False) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        src = ROOT / "tests" / "data" / "law_main_b81488e.json" if old else w / "law.json"
        p = tmp / "edited_law.json"
        p.write_text(json.dumps(_set(json.loads(src.read_text()), field, value)))
        code, err = _cli("predict", p, "--compute", "1e22" if old else "1e13")
        return _verdict_cli(code, err, "edited_law.json")
    return run


def _state_schema(w: Path, tmp: Path) -> str:
    st = tmp / "state.json"
    _cli("watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl", "--state", st)
    doc = json.loads(st.read_text())
    doc["schema"] = "watch-state/3"
    st.write_text(json.dumps(doc))
    return _verdict_cli(*_cli("watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl",
                              "--state", st), "state.json")


def _state_inner(value) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        st = tmp / "state.json"
        _cli("watch", w / "pre" / "prereg.json", "--source", w / "live.jsonl", "--state", st)
        doc = json.loads(st.read_text())
        doc["state"]["schema"] = value
        st.write_text(json.dumps(doc))
        return _verdict_cli(*_cli("watch", w / "pre" / "prereg.json", "--source",
                                  w / "live.jsonl", "--state", st), "state.json")
    return run


def _keymap(text: str) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        km = tmp / "km.toml"
        km.write_text(text)
        return _verdict_cli(*_cli("watch", w / "pre" / "prereg.json", "--source",
                                  w / "live.jsonl", "--keys", km), "km.toml")
    return run


def _compare(entry: dict) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        from ladder.predict.amend import multiplier_from_compare
        p = tmp / "compare.json"
        p.write_text(json.dumps({"loss": entry}))
        return _guard(lambda: (multiplier_from_compare(str(p), "loss"), "accepted")[1])
    return run


def _family(edit: Callable[[dict], None]) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        from ladder.predict import prereg as pr
        sy = _synthetic()
        from ladder.predict.watch import WatchConfig
        from ladder.predict.watch.multi import family_config
        target = sy.ladder_targets(3, steps0=60)[-1]
        cfg, family = family_config(WatchConfig(), 2)
        docs = {k: pr.make_prereg(sy.TruthLaw(sy.Truth(), metric=k), target, eval_noise=0.003,
                                  config=cfg) for k in ("a/loss", "b/loss")}
        doc = pr.build_multi(docs, family=family)
        edit(doc["decision_rule"])
        p = tmp / "resealed.json"
        p.write_text(json.dumps(pr.seal(doc)))
        (tmp / "m.jsonl").write_text(json.dumps({"step": 1, "a/loss": 3.0}) + "\n")
        return _verdict_cli(*_cli("watch", p, "--source", tmp / "m.jsonl"), "resealed.json")
    return run


def _resealed(field: str, value) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        from ladder.predict import prereg as pr
        doc = _set(json.loads((w / "pre" / "prereg.json").read_text()), field, value)
        p = tmp / "resealed.json"
        p.write_text(json.dumps(pr.seal(doc)))
        return _verdict_cli(*_cli("watch", p, "--source", w / "live.jsonl"), "resealed.json")
    return run


def _multi_runs(w: Path, tmp: Path) -> str:
    law = json.loads((w / "law.json").read_text())
    (tmp / "law2.json").write_text(json.dumps(
        {"schema": "law/2", "laws": {k: {**law, "metric": k} for k in ("p/a/loss", "p/b/loss")},
         "created": law.get("created"), "tool_version": law.get("tool_version")}))
    return _verdict_cli(*_cli("preregister", tmp / "law2.json", "--target-spec",
                              w / "target.json", "--runs", w / "runs", "--out", tmp / "p.json"),
                        "--runs")


# ---- a restarted watcher

def write_wandb_log(path: Path, records, append: bool = False) -> None:
    """Protobuf ``records`` (wandb_internal_pb2.Record) framed as W&B's offline log: a 7-byte
    header, then LevelDB log records in 32 KiB blocks (one split across blocks as first/middle/
    last; the CRC left 0, the reader does not check it). ``append``: added to a file that has its
    header already (framed as if the file were new, as a test of a log growing in pieces)."""
    block = 32768
    buf = bytearray(b":W&B\xbe\xe7\x01")
    for rec in records:
        data, first = rec.SerializeToString(), True
        while True:
            left = block - len(buf) % block
            if left < 7:
                buf += b"\0" * left
                continue
            piece, data = data[:left - 7], data[left - 7:]
            typ = (1 if not data else 2) if first else (4 if not data else 3)
            buf += struct.pack("<IHB", 0, len(piece), typ) + piece
            first = False
            if not data:
                break
    path.parent.mkdir(parents=True, exist_ok=True)
    if append and path.exists() and path.stat().st_size:
        with open(path, "ab") as f:
            f.write(bytes(buf[7:]))
    else:
        path.write_bytes(bytes(buf))


def history_records(rows, num0: int = 1) -> list:
    """Rows ({"step": S, key: value, ...}) as W&B history records numbered from ``num0``."""
    from wandb.proto import wandb_internal_pb2 as pb
    out = []
    for k, r in enumerate(rows):
        rec = pb.Record(num=num0 + k)
        rec.history.step.num = int(r["step"])
        for key, v in r.items():
            if key != "step":
                it = rec.history.item.add()
                it.key, it.value_json = key, json.dumps(v)
        out.append(rec)
    return out


def _wandb_log(path: Path, rows) -> None:
    write_wandb_log(path, history_records(rows))


def _judged(w: Path, source, state) -> list[int]:
    from ladder.predict.live import Watcher
    wt = Watcher(w / "pre" / "prereg.json", source, [], state)
    seen: list[int] = []
    wt.listeners.append(lambda view, batch: seen.extend(int(s) for s in batch.step))
    wt.poll()
    return seen


def _restart(kind: str) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        m = _sources()
        CsvSource, JsonlSource, WandbOfflineSource = (m.CsvSource, m.JsonlSource,
                                                      m.WandbOfflineSource)
        rows = [json.loads(x) for x in (w / "live.jsonl").read_text().splitlines()]
        half = len(rows) // 2
        st = tmp / "state.json"
        seg = tmp / "wandb" / "run-20261201_080000-abc" / "run-abc.wandb"
        if kind == "wandb renamed":
            _wandb_log(seg, rows[:half])
            first = _judged(w, WandbOfflineSource(seg.parent.parent), st)
            new = tmp / "wandb" / "run-20261201_080000-abd" / "run-abd.wandb"
            shutil.move(seg.parent, new.parent)
            (new.parent / "run-abc.wandb").rename(new)
            _wandb_log(new, rows)
            second = _judged(w, WandbOfflineSource(tmp / "wandb"), st)
        elif kind == "jsonl then wandb":
            part = tmp / "metrics.jsonl"
            part.write_text("".join(json.dumps(r) + "\n" for r in rows[:half]))
            first = _judged(w, JsonlSource(part), st)
            _wandb_log(seg, rows)
            second = _judged(w, WandbOfflineSource(seg.parent.parent), st)
        elif kind == "csv shrank":
            p = tmp / "m.csv"
            keys = list(rows[0])

            def text(rs):
                return ",".join(keys) + "\n" + "".join(
                    ",".join(str(r[k]) for k in keys) + "\n" for r in rs)
            p.write_text(text(rows[:half]))
            from ladder.predict.live import Watcher
            wt = Watcher(w / "pre" / "prereg.json", CsvSource(p), [], None)
            seen: list[int] = []
            wt.listeners.append(lambda v, b: seen.extend(int(s) for s in b.step))
            wt.poll()
            p.write_text(text(rows[half - 1:half]))
            wt.poll()
            p.write_text(text(rows[half - 1:]))
            wt.poll()
            first, second = seen, []
        else:
            raise ValueError(kind)
        every = first + second
        return "rejudged" if len(every) != len(set(every)) else "clean"
    return run


# ---- bounded readers

def _wandb_sparse(w: Path, tmp: Path) -> str:
    WandbOfflineSource = _sources().WandbOfflineSource
    seg = tmp / "wb" / "run-20261201_080000-abc" / "run-abc.wandb"
    _wandb_log(seg, [{"step": s, "train/loss": 2.0} for s in range(1, 50)])
    with open(seg, "r+b") as f:
        f.truncate(768 << 20)

    def go():
        with address_space_cap(256 << 20):
            rows = WandbOfflineSource(seg.parent.parent).poll().rows
        return "clean" if [r["step"] for r in rows] == list(range(1, 50)) else "accepted"
    return _guard(go)


def _gz_line(w: Path, tmp: Path) -> str:
    tok = small_tokenizer(tmp)  # a small byte-level BPE, as the writers' fuzz makes it
    src = tmp / "big.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=1) as f:
        f.write(b'{"text": "')
        for _ in range(512):
            f.write(b"a" * (1 << 20))
        f.write(b'"}\n')
    from ladder.trainer import tokens as T

    def go():
        with address_space_cap(384 << 20):
            T.tokenize_files([str(src)], tok, tmp / "out", shard_tokens=300)
        return "accepted"
    return _guard(go)


def _metrics_line(w: Path, tmp: Path) -> str:
    JsonlSource = _sources().JsonlSource
    p = tmp / "metrics.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"step": 1}\n{"step": 2, "x": "')
        for _ in range(64):
            f.write(b"a" * (1 << 20))
        f.write(b'"}\n{"step": 3}\n')

    def go():
        with address_space_cap(160 << 20):
            rows = JsonlSource(p).poll().rows
        return "clean" if [r["step"] for r in rows] == [1, 3] else "accepted"
    return _guard(go)


# ---- the live page

def _page():
    from ladder.reports.live import LivePage
    return LivePage(lambda: {"chart": None, "verdict": [], "tone": "", "alerts": [],
                             "n_alerts": 0}, lambda: 1, port=0)


def trickle_wait(clients: int = 24, limit: float = 40.0) -> float:
    """Seconds a GET /state.json waits behind ``clients`` that send a header byte every 2 s
    (``limit`` when it got no answer)."""
    page = _page()
    stop = threading.Event()

    def trickle():
        s = socket.create_connection(("127.0.0.1", page.port))
        try:
            for ch in b"GET /state.json HTTP/1.1\r\nHost: 127.0.0.1\r\n":
                if stop.wait(2.0):
                    break
                s.send(bytes([ch]))
        except OSError:
            pass
        finally:
            s.close()
    ts = [threading.Thread(target=trickle, daemon=True) for _ in range(clients)]
    for t in ts:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(page.url + "state.json", timeout=limit):
            waited = time.monotonic() - t0
    except OSError:
        waited = limit
    stop.set()
    for t in ts:
        t.join(5)
    page.close()
    return waited


def _trickle(w: Path, tmp: Path) -> str:
    return "clean" if trickle_wait(limit=15.0) < 10.0 else "slow"


def _host(*hosts: str) -> Callable[[Path, Path], str]:
    def run(w: Path, tmp: Path) -> str:
        page = _page()
        try:
            s = socket.create_connection(("127.0.0.1", page.port), timeout=5)
            s.sendall(b"GET /state.json HTTP/1.1\r\n" + b"".join(
                b"Host: " + h.format(port=page.port).encode() + b"\r\n" for h in hosts)
                + b"\r\n")
            code = int(s.recv(64).split()[1])
            s.close()
        finally:
            page.close()
        return "clean" if code == 403 else "accepted"
    return run


def _bind_any(w: Path, tmp: Path) -> str:
    def go():
        from ladder.reports.live import LivePage
        LivePage(lambda: {}, lambda: 1, port=0, host="0.0.0.0").close()
        return "accepted"
    return _guard(go)


def corpus() -> list[Case]:
    L, F, R, B, P = ("law fields", "other files' fields", "restarted watcher", "bounded readers",
                     "live page")
    ex = "diagnostics.backtest.extrapolation"
    cases = [Case(f"law {f} = {v!r}"[:70], L, _law_case(f, v)) for f, v in (
        (f"{ex}.ranges_log10", [8.8, 9.8]), (f"{ex}.ranges_log10", {"compute": [9.9, 8.8]}),
        (f"{ex}.ranges_log10", {"compute": [None, None]}), (f"{ex}.rate_per_decade", "0.5"),
        (f"{ex}.rate_per_decade", 1e300), (f"{ex}.rate_per_decade", -1), (ex, [1]),
        ("uncertainty.sigma_log", 1e300), ("uncertainty.dof", 0), ("uncertainty.dof", 1e-300),
        ("uncertainty.abs_residuals_log", [1e300]), ("uncertainty.bootstrap_u", [[1e300, 1]] * 30),
        ("uncertainty.covariance_free", [[-1.0, 0.0], [0.0, 1.0]]))]
    cases += [Case(f"law/1 {f} = {v!r}", L, _law_case(f, v, old=True)) for f, v in (
        ("diagnostics.backtest.folds", 5), ("diagnostics.backtest.folds.0.final_rel_err", 7),
        ("diagnostics.backtest.folds.0", "x"), ("form", ["compute"]))]
    cases += [Case("state file watch-state/3", F, _state_schema),
              Case("inner state watch-state/9", F, _state_inner("watch-state/9")),
              Case("keymap scale 1e300", F, _keymap(
                  '[keys]\nflops = { from = "g", scale = 1e300 }\n')),
              Case("keymap scale 1e-300", F, _keymap(
                  '[keys]\nflops = { from = "g", scale = 1e-300 }\n')),
              Case("keymap nested 5000 deep", F, _keymap("x = " + "[" * 5000 + "]" * 5000)),
              Case("compare lo above the estimate", F, _compare(
                  {"multiplier": 1.5, "lo": 2.0, "hi": 3.0})),
              Case("compare hi below the estimate", F, _compare(
                  {"multiplier": 1.5, "lo": 1.0, "hi": 1.2})),
              Case("compare level 7", F, _compare(
                  {"multiplier": 1.5, "lo": 1.0, "hi": 2.0, "level": 7})),
              Case("family_alert_level 7.5 resealed", F, _family(
                  lambda r: r["family"].update(family_alert_level=7.5))),
              Case("family alert_level not Sidak", F, _family(
                  lambda r: r["family"].update(alert_level=0.5))),
              Case("family metrics 3 of 2", F, _family(lambda r: r["family"].update(metrics=3))),
              Case("prereg/3 --runs without its keys", F, _multi_runs)]
    cases += [Case(f"prereg resealed {f} = {v!r}", F, _resealed(f, v)) for f, v in (
        ("forecast.5.lo", 99.0), ("forecast.5.hi", "Infinity"), ("forecast.5.loss", "NaN"),
        ("forecast.5.fraction", 7), ("final.loss", "NaN"), ("eval_noise.sigma", -1),
        ("target.steps", -5), ("band_level", 7.5))]
    cases += [Case(f"restart: {k}", R, _restart(k)) for k in (
        "wandb renamed", "jsonl then wandb", "csv shrank")]
    cases += [Case("W&B log 768 MiB, cap 256 MiB", B, _apart(_wandb_sparse)),
              Case(".jsonl.gz of one 512 MiB line, cap 384 MiB", B, _apart(_gz_line)),
              Case("metrics line 64 MiB, cap 160 MiB", B, _apart(_metrics_line))]
    cases += [Case("24 clients trickling a byte / 2 s", P, _trickle),
              Case("Host 0.0.0.0", P, _host("0.0.0.0")),
              Case("Host 10.0.0.1:port", P, _host("10.0.0.1:{port}")),
              Case("two Host headers, the 2nd elsewhere", P,
                   _host("localhost:{port}", "attacker.example")),
              Case("bind 0.0.0.0", P, _bind_any)]
    return cases


def split_record_seconds(mb: int = 50) -> float:
    """Seconds to decode one history record of ``mb`` MB (split over ~32 blocks a MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.wandb"
        _wandb_log(p, [{"step": 1, "blob": "y" * (mb << 20)}])
        read_wandb_records = _sources().read_wandb_records
        t0 = time.perf_counter()
        n = sum(1 for _ in read_wandb_records(p))
        assert n == 1
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=None, metavar="DIR", help="judge this checkout's code")
    ap.add_argument("--only", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else ROOT))
    import ladder
    print(f"judging {Path(ladder.__file__).parents[1]}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        world = build_world(Path(tmp) / "world")
        for case in corpus():
            if args.only and args.only not in case.name:
                continue
            scratch = Path(tmp) / "case"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            t0 = time.perf_counter()
            v = _guard(lambda case=case, scratch=scratch: case.run(world, scratch))
            results.append((case, v))
            if args.verbose or v != "clean":
                print(f"{v:<10} {time.perf_counter() - t0:6.2f}s  [{case.cls}] {case.name}",
                      flush=True)
    print("\n| class | cases | clean | accepted | traceback | rejudged | exhausted | slow | "
          "unnamed |\n|---|---|---|---|---|---|---|---|---|")
    for cls in [*dict.fromkeys(c.cls for c, _ in results), "all"]:
        n = Counter(v for c, v in results if cls in ("all", c.cls))
        print(f"| {cls} | {sum(n.values())} | " + " | ".join(str(n[k]) for k in (
            "clean", "accepted", "traceback", "rejudged", "exhausted", "slow", "unnamed")) + " |")
    if not args.only:
        print(f"\ndecode one 50 MB record split over blocks: {split_record_seconds():.2f} s")
        print(f"GET /state.json behind 24 trickling clients: {trickle_wait():.1f} s "
              "(40.0: no answer)")
    return 0 if all(v == "clean" for _, v in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
