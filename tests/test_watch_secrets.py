"""Issue 26 item 7: secrets off the command line. The webhook's URL (with its token) comes from
``--webhook-file FILE`` or ``$LADDER_WEBHOOK_URL``; ``--webhook URL`` still works, warns, and is
redacted from the command line W&B records; nothing secret reaches the watcher's outputs; a
receiver's answer is read up to a small bound, within a deadline."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import sys
import threading
import time

import pytest
from helpers import offline_records

from ladder.cli.main import main
from ladder.io import InputError
from ladder.predict import sinks as sk

SECRET = "t0ken-s3cret"


class Receiver:
    def __init__(self, body: str = "ok"):
        rx = self
        self.got, self.sent = [], 0

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                rx.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()
                try:
                    if body == "endless":
                        while rx.sent < (256 << 20):
                            self.wfile.write(b"x" * 65536)
                            rx.sent += 65536
                    elif body == "trickle":
                        for _ in range(600):
                            self.wfile.write(b"x")
                            self.wfile.flush()
                            rx.sent += 1
                            time.sleep(0.05)
                    else:
                        self.wfile.write(body.encode())
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://watch:{SECRET}@127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from bench.fuzz_inputs import build_world
    return build_world(tmp_path_factory.mktemp("secrets") / "world")


@pytest.fixture
def w(world, tmp_path):
    dst = tmp_path / "w"
    shutil.copytree(world, dst)
    return dst


@pytest.fixture
def rx():
    r = Receiver()
    yield r
    r.close()


def watch(w, capsys, monkeypatch, *extra):
    argv = ["watch", str(w / "pre" / "prereg.json"), "--source", str(w / "live_nan.jsonl"),
            "--state", str(w / "st.json"), "--alerts", str(w / "alerts.jsonl"), *extra]
    monkeypatch.setattr(sys, "argv", ["ladder", *argv])  # the process's own command line
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def no_secret_in(w, *texts):
    for t in texts:
        assert SECRET not in t
    for q in w.rglob("*"):
        if q.is_file() and q.name != "hook.txt":
            assert SECRET.encode() not in q.read_bytes(), q


@pytest.mark.heavy  # 4 s on 2 busy cores
def test_webhook_file_keeps_the_url_off_the_command_line(w, rx, capsys, monkeypatch):
    hook = w / "hook.txt"
    hook.write_text(rx.url + "\n")
    hook.chmod(0o600)
    code, out, err = watch(w, capsys, monkeypatch, "--webhook-file", str(hook))
    assert code == 2, err
    assert [a["kind"] for a in rx.got] == ["nan"]
    assert SECRET not in " ".join(sys.argv) and "readable by other" not in err
    no_secret_in(w, out, err)


def test_the_environment_variable_is_the_default(w, rx, capsys, monkeypatch):
    monkeypatch.setenv(sk.WEBHOOK_ENV, rx.url)
    code, out, err = watch(w, capsys, monkeypatch)
    assert code == 2 and [a["kind"] for a in rx.got] == ["nan"]
    no_secret_in(w, out, err)


def test_webhook_on_the_command_line_warns_and_is_redacted(w, rx, capsys, monkeypatch):
    code, out, err = watch(w, capsys, monkeypatch, "--webhook", rx.url)
    assert code == 2 and [a["kind"] for a in rx.got] == ["nan"]
    assert "--webhook-file" in err and "ps" in err
    assert SECRET not in " ".join(sys.argv) and "<redacted>" in sys.argv  # what W&B records
    no_secret_in(w, out, err)


def test_webhook_file_problems_are_one_line(w, capsys, monkeypatch, tmp_path):
    hook = w / "hook.txt"
    hook.write_text("http://a/\nhttp://b/\n")
    with pytest.raises(InputError, match="one line"):
        sk.webhook_url(None, str(hook))
    with pytest.raises(InputError, match="not both"):
        sk.webhook_url("http://a/", str(hook))
    hook.write_text("http://127.0.0.1:9/x\n")
    hook.chmod(0o644)
    said = []
    assert sk.webhook_url(None, str(hook), warn=said.append) == "http://127.0.0.1:9/x"
    assert said and "chmod 600" in said[0]
    assert sk.webhook_url(None, None, environ={}) is None


@pytest.mark.parametrize("body", ["endless", "trickle"])
def test_a_receivers_answer_is_read_up_to_a_bound_within_a_deadline(body):
    r = Receiver(body)
    try:
        sink = sk.WebhookSink(r.url, timeout=1.0)
        t0 = time.monotonic()
        assert sink._post(b'{"a": 1}', "id1") is None  # 2xx: delivered
        assert time.monotonic() - t0 < 10
        time.sleep(0.2)
        assert r.sent < (32 << 20)  # read: 64 KiB; the rest is what the kernel buffered
    finally:
        r.close()


@pytest.mark.slow  # a W&B offline run (~10-20 s)
def test_wandb_metadata_holds_no_secret(w, rx, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(w))
    code, out, err = watch(w, capsys, monkeypatch, "--webhook", rx.url, "--wandb",
                           "--wandb-project", "secrets")
    assert code == 2, err
    # the run's metadata (its command line among it) goes to files/wandb-metadata.json in older
    # W&B versions and into the binary run-*.wandb log in newer ones: every file W&B wrote, once
    # its writer has closed each run's log (helpers.offline_records)
    runs = [d for d in w.rglob("offline-run-*") if d.is_dir()]
    assert runs
    for d in runs:
        offline_records(d)
    written = [p for p in w.rglob("*") if p.is_file() and "wandb" in p.parts]
    blobs = [p.read_bytes() for p in written]
    assert any(b"<redacted>" in b for b in blobs), written   # the command line was recorded
    assert not any(SECRET.encode() in b for b in blobs)
    no_secret_in(w, out, err)
    os.environ.pop("WANDB_RUN_ID", None)
