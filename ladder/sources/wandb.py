"""The W&B sources.

- :class:`WandbOfflineSource`: a W&B offline run directory (or its ``.wandb`` file), its record
  log decoded incrementally with wandb's protobuf classes (:func:`iter_wandb_records`).
- :class:`WandbApiSource`: ``wandb://ENTITY/PROJECT/ID[,ID...]`` through the public API; several
  ids form one lineage (a restarted run gets a new id) and later ids win for repeated steps.
- :func:`read_api_runs`, :func:`read_offline_run`: runs read whole as :class:`WandbHistory`
  (``ladder fit``'s points, ladder.fit.points).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ladder.io import EX_NOINPUT, InputError, open_input, step_of
from ladder.sources.base import POS_INT, Poll, Source, check_position

# a saved segment's read position (ladder.sources.base.check_position)
SEGMENT_POSITION = {"offset": ("int", POS_INT), "num": ("int", POS_INT), "exit": ("bool", None)}

# ----------------------------------------------------------------------------------- offline


class WandbOfflineSource(Source):
    """A W&B offline run: a directory (``wandb/``, a ``run-*`` directory) or one ``.wandb`` file.

    Every ``.wandb`` segment is read in lineage order (a resumed run writes a new
    ``run-<time>-<id>`` directory), each from the byte after its last complete record: a poll
    decodes only what was appended. A later segment's row for a step wins downstream. The run
    finished when the newest segment holds W&B's exit record."""

    kind = "wandb-offline"
    poll_seconds = 2.0  # W&B flushes its offline log every few seconds

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.segs: dict[str, dict] = {}  # segment name -> {"offset", "num", "exit"}
        self._config_sent = False

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "segments": self.segs,
                "config_sent": self._config_sent}

    def restore(self, pos: dict) -> bool:
        """Continue at a saved position; True when every segment it names (relative to the
        watched directory) is still there. Segments it does not name are read from their start."""
        if pos.get("kind") != self.kind or not isinstance(pos.get("segments"), dict):
            return False
        self.segs = {str(k): check_position(v if isinstance(v, dict) else {"offset": v},
                                            SEGMENT_POSITION)
                     for k, v in pos["segments"].items()}
        self._config_sent = pos.get("config_sent") is True
        try:
            there = {name for name, _ in self.segments()}
        except InputError:  # no segment yet (a follow started before the run)
            there = set()
        return set(self.segs) <= there

    def segments(self) -> list[tuple[str, Path]]:
        """(name, path) of every .wandb file of the run, oldest first."""
        p = self.path
        if p.is_file():
            return [(p.name, p)]
        found: dict[Path, str] = {}
        for q in sorted(p.glob("*.wandb")) + sorted(p.glob("*/*.wandb")):
            if q.parent.name == "latest-run" and q.parent != p:
                continue  # a link to one of the run-* directories (unless it is the one given)
            found.setdefault(q.resolve(), str(q.relative_to(p)))
        if not found and (p / "latest-run").exists():
            for q in sorted((p / "latest-run").glob("*.wandb")):
                found.setdefault(q.resolve(), str(q.relative_to(p)))
        if not found:
            raise InputError("no .wandb record file", path=p, field="--source",
                             exit_code=EX_NOINPUT)
        # run-YYYYMMDD_HHMMSS-ID/run-ID.wandb: the directory names sort by start time
        return sorted(((name, q) for q, name in found.items()),
                      key=lambda t: (Path(t[0]).parent.name, Path(t[0]).name))

    def record_file(self) -> Path:
        """The newest segment."""
        return self.segments()[-1][1]

    def finished(self) -> str | None:
        segs = self.segments()
        last = self.segs.get(segs[-1][0]) if segs else None
        return "W&B exit record" if last and last.get("exit") else None

    def poll(self) -> Poll:
        out = Poll()
        for name, f in self.segments():
            seg = self.segs.setdefault(name, {"offset": 0, "num": 0, "exit": False})
            try:
                size = f.stat().st_size
            except OSError:
                continue
            if size < seg["offset"]:  # rewritten: read again, the judged steps skipped
                out.notes.append(f"{f} shrank: reading it again from the start")
                out.restarted = True
                seg.update(offset=0, num=0)
            if size == seg["offset"]:
                continue
            stats: dict = {}
            recs = list(iter_wandb_records(f, seg["offset"], max_bytes=POLL_BYTES, stats=stats))
            end, bad = stats["end"], stats["bad"]
            out.more = out.more or stats["more"]
            if bad:
                if not recs and seg["offset"] == 0:
                    raise InputError(f"not a readable W&B record log ({bad} corrupt "
                                     f"record(s), none readable)", path=f, field="--source")
                out.notes.append(f"{f}: {bad} corrupt record(s) skipped near byte {end}")
            seg["offset"] = end
            self._take(recs, seg, out)
        return out

    def _take(self, recs: Iterable[dict], seg: dict, out: Poll) -> None:
        for rec in recs:
            num = int(rec.get("num", 0) or 0)
            typ = rec.get("type")
            if typ == "config" or typ == "run" and not self._config_sent:
                upd = (rec["run"]["config"] if typ == "run" else rec["config"])["update"]
                cfg = {k: v for k, v in upd.items() if k != "_wandb"}
                if cfg:
                    out.configs.append(cfg)
                self._config_sent = self._config_sent or typ == "run"
            elif typ == "history":
                h = rec.get("history") or {}
                row = dict(h.get("item") or {})
                step = (h.get("step") or {}).get("num", row.get("_step"))
                row["step"] = step
                out.rows.append(row)
            elif typ == "exit":
                seg["exit"] = True
            seg["num"] = max(seg["num"], num)


# The .wandb file: a 7-byte header (":W&B", a 2-byte magic, a version byte), then the LevelDB log
# format: 32 KiB blocks of records, each a 7-byte header (CRC32C, uint16 length, type: 1 full,
# 2 first, 3 middle, 4 last) and a payload; a block tail under 7 bytes is zero padding. The
# payloads are ``wandb_internal_pb2.Record`` protobufs. (LevelDB log format: leveldb's
# doc/log_format.md.)
_BLOCK = 32768


# The log is read READ_BYTES at a time, never whole (issue 39: a 7 GiB log); a record split over
# blocks is joined once from its fragments. A record beyond MAX_RECORD (a history row is a few
# KB) is passed over unread and counted as corrupt.
READ_BYTES = 128 * _BLOCK      # 4 MiB
MAX_RECORD = 64 << 20
POLL_BYTES = 64 << 20          # of log decoded per segment and poll; the rest: ``Poll.more``


def read_wandb_records(path: str | os.PathLike, *, full: bool = False) -> Iterable[dict]:
    """Every record of a .wandb record log, streamed (see :func:`iter_wandb_records`).
    ``full``: every record type whole (protobuf's own dict of it: a run's group, name, job type
    and tags, a metric's definition), not only the history and config the watcher reads."""
    yield from iter_wandb_records(Path(path), 0, full=full)


def iter_wandb_records(path: Path, start: int = 0, *, full: bool = False,
                       max_bytes: int | None = None, stats: dict | None = None
                       ) -> Iterable[dict]:
    """The records of a .wandb log from byte ``start`` (0, or a ``stats["end"]`` of an earlier
    call), one at a time. ``stats`` gets ``end`` (the offset after the last complete record: a
    truncated last record of a live run is left for the next call), ``bad`` (corrupt records)
    and ``more`` (stopped at the first record boundary ``max_bytes`` past ``start``, with bytes
    left). The CRC is not checked; a record header that cannot be one (an unknown type, a length
    past its block) is corrupt: counted, and the rest of the file is skipped (a log cannot be
    resynchronised reliably). ``full``: see :func:`read_wandb_records`. Memory: one read buffer
    and one record, whatever the log's size."""
    from wandb.proto import wandb_internal_pb2 as pb

    st = {"end": start, "bad": 0, "more": False} if stats is None else stats
    st.update(end=start, bad=0, more=False)
    with open_input(path, field="--source") as fh:
        fh.seek(start)
        if start == 0:
            head = fh.read(7)
            if len(head) < 7:
                return
            if head[:4] != b":W&B":
                raise InputError("not a W&B record file (bad header)", path=path,
                                 field="--source")
        base = fh.tell()              # the file offset of buf[0]
        buf, i = fh.read(READ_BYTES), 0
        st["end"] = base
        parts: list[bytes] = []       # the fragments of a record split over blocks
        size, skipping = 0, False     # their bytes; an oversized record being passed over

        def refill():
            nonlocal buf, base, i
            if i > len(buf):                # skipped padding past the bytes read
                fh.seek(base + i)
                buf, base, i = b"", base + i, 0
            while len(buf) - i < _BLOCK + 7:   # a block's record fits after a refill
                more = fh.read(READ_BYTES)
                if not more:
                    break
                buf, base, i = buf[i:] + more, base + i, 0

        while True:
            refill()
            if len(buf) - i < 7:
                break
            abs_pos = base + i
            block_left = _BLOCK - (abs_pos % _BLOCK)
            _crc, length, typ = struct.unpack_from("<IHB", buf, i)
            if block_left < 7 or typ == 0 and length == 0:  # padding: on to the next block
                i += block_left
                if not parts and not skipping:
                    st["end"] = base + min(i, len(buf))
                continue
            if typ not in (1, 2, 3, 4) or 7 + length > block_left:
                st["bad"] += 1
                break
            if i + 7 + length > len(buf):
                break  # a record still being written
            payload = buf[i + 7:i + 7 + length]
            i += 7 + length
            if typ in (1, 2):
                parts, size, skipping = [payload], length, False
            elif skipping:
                if typ == 4:
                    skipping = False
                    st["end"] = base + i
                continue
            else:
                parts.append(payload)
                size += length
            if size > MAX_RECORD:   # passed over, fragment by fragment, never assembled
                st["bad"] += 1
                parts, size, skipping = [], 0, typ != 4
                if not skipping:
                    st["end"] = base + i
                continue
            if typ in (2, 3):
                continue
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts, size = [], 0
            st["end"] = base + i
            rec = pb.Record()
            try:
                rec.ParseFromString(data)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError: a corrupt record, skipped
                st["bad"] += 1
                continue
            yield _record_dict(rec, full)
            if max_bytes is not None and st["end"] - start >= max_bytes:
                refill()
                st["more"] = len(buf) - i >= 7
                break


def _record_dict(rec, full: bool = False) -> dict:
    which = rec.WhichOneof("record_type")
    d: dict[str, Any] = {"num": rec.num, "type": which}
    if full and which not in ("history", None):
        from google.protobuf.json_format import MessageToDict  # protobuf comes with wandb
        d[which] = MessageToDict(getattr(rec, which), preserving_proto_field_name=True)
        return d
    if which == "history":
        d["history"] = {"item": _items(rec.history.item), "step": {"num": rec.history.step.num}}
    elif which == "run":
        d["run"] = {"config": {"update": _items(rec.run.config.update)}}
    elif which == "config":
        d["config"] = {"update": _items(rec.config.update)}
    elif which == "exit":
        d["exit"] = {}
    return d


def _items(items) -> dict:
    """W&B's key/value items (a history row, a config update) as a dict."""
    return {it.key or "/".join(it.nested_key): _history_value(it) for it in items}


def _history_value(it) -> Any:
    """One item's value: a typed field where the item has them (newer wandb), else its JSON."""
    which = it.WhichOneof("value") if any(f.containing_oneof for f in it.DESCRIPTOR.fields) \
        else None
    if which and which != "value_json":
        return None if which == "none" else getattr(it, which)
    try:
        return json.loads(it.value_json)
    except (ValueError, RecursionError):
        return it.value_json


# ----------------------------------------------------------------------------------- the API


@dataclass(frozen=True)
class WandbUri:
    entity: str
    project: str
    run_ids: tuple[str, ...]

    @classmethod
    def parse(cls, uri: str, *, field: str = "--source") -> WandbUri:
        """``field``: the argument that gave it, named in the error (InputError, 64)."""
        parts = uri[len("wandb://"):].strip("/").split("/")
        if not uri.startswith("wandb://") or len(parts) != 3 or not all(parts):
            raise InputError(f"expected wandb://ENTITY/PROJECT/RUN_ID[,RUN_ID...], got {uri!r}",
                             field=field, exit_code=64)
        ids = tuple(i.strip() for i in parts[2].split(",") if i.strip())
        if not ids:
            raise InputError(f"no run id in {uri!r}", field=field, exit_code=64)
        return cls(parts[0], parts[1], ids)

    def uri_of(self, run_id: str | None = None) -> str:
        """The URI of one run (None: of them all)."""
        return f"wandb://{self.entity}/{self.project}/{run_id or ','.join(self.run_ids)}"


class WandbApiSource(Source):
    """Runs of one lineage through the W&B public API (``api`` injectable for tests).

    The first poll reads every id's history in lineage order; later polls read the last id's new
    rows (``min_step`` past the last step seen). Rows are passed on in lineage order, so a step
    logged again by a later run replaces the earlier one downstream (last one wins). Errors name
    the URI and ``field``, the argument that gave it."""

    kind = "wandb-api"
    # W&B's public API is rate-limited (per user and minute); a minute between polls is what a
    # run logged every few minutes needs, and what a 100-day follow can afford
    poll_seconds = 60.0

    def __init__(self, uri: str, *, api: Any = None, page_size: int = 1000,
                 max_rows: int = 100_000, field: str = "--source"):
        self.uri = WandbUri.parse(uri, field=field)
        self.field = field
        self._api = api
        self.page_size = page_size
        # a poll returns at most this many rows (``Poll.more``): a 100-day history is read in
        # slices, memory bounded as for a JSONL source (ladder.sources.jsonl)
        self.max_rows = max_rows
        self.last_step: dict[str, int] = {}
        self.done_ids: list[str] = []
        self._config_sent = False
        self.runs: dict[str, Any] = {}

    @property
    def api(self):
        if self._api is None:
            try:
                import wandb
                self._api = wandb.Api(timeout=30)
            except Exception as e:  # noqa: BLE001 - no network / no login: one clear line
                raise InputError(f"cannot reach the W&B API ({type(e).__name__}: {e})",
                                 path=self.uri.uri_of(), field=self.field, exit_code=69) from None
        return self._api

    def position(self) -> dict:
        return {"kind": self.kind, "uri": list(self.uri.run_ids), "last_step": self.last_step,
                "done_ids": self.done_ids, "config_sent": self._config_sent}

    def restore(self, pos: dict) -> bool:
        if pos.get("kind") == self.kind and pos.get("uri") == list(self.uri.run_ids):
            self.last_step = {k: int(v) for k, v in (pos.get("last_step") or {}).items()}
            self.done_ids = list(pos.get("done_ids") or [])
            self._config_sent = bool(pos.get("config_sent"))
            return True
        return False

    def run(self, run_id: str):
        if run_id not in self.runs:
            api = self.api  # its own error first
            try:
                self.runs[run_id] = api.run(f"{self.uri.entity}/{self.uri.project}/{run_id}")
            except Exception as e:  # noqa: BLE001
                raise InputError(f"W&B run not readable ({type(e).__name__}: {e})",
                                 path=self.uri.uri_of(run_id), field=self.field,
                                 exit_code=69) from None
        return self.runs[run_id]

    def finished(self) -> str | None:
        """The lineage's newest run's state, when W&B says it ended."""
        run = self.run(self.uri.run_ids[-1])
        try:
            if hasattr(run, "load"):  # refresh the run's state from the server
                run.load(force=True)
        except TypeError:
            run.load()
        state = getattr(run, "state", None)
        return f"W&B run state {state}" if state in ("finished", "crashed", "failed",
                                                      "killed") else None

    def poll(self) -> Poll:
        try:
            return self._poll()
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - the API's errors (HTTP, timeouts) vary by version
            raise InputError(f"W&B API error ({type(e).__name__}: {str(e)[:160]})",
                             path=self.uri.uri_of(), field=self.field, exit_code=69) from None

    def _poll(self) -> Poll:
        out = Poll()
        ids = self.uri.run_ids
        for k, rid in enumerate(ids):
            if rid in self.done_ids:
                continue
            run = self.run(rid)
            if k == len(ids) - 1 and not self._config_sent:
                cfg = dict(getattr(run, "config", {}) or {})
                if cfg:
                    out.configs.append({key: v for key, v in cfg.items() if key != "_wandb"})
                self._config_sent = True
            start = self.last_step.get(rid)
            kw = {"page_size": self.page_size}
            if start is not None:
                kw["min_step"] = start + 1
            for row in run.scan_history(**kw):
                row = dict(row)
                row.setdefault("step", row.get("_step"))
                s = step_of(row["step"])
                if s is None:
                    continue
                if start is not None and s <= start:
                    continue
                out.rows.append(row)
                self.last_step[rid] = max(self.last_step.get(rid, s), s)
                if len(out.rows) >= self.max_rows:  # the rest from the next step on
                    out.more = True
                    return out
            if k < len(ids) - 1:  # an earlier run of the lineage (superseded): read once
                self.done_ids.append(rid)
        return out


# ----------------------------------------------------------------------------- whole runs


@dataclass
class WandbHistory:
    """One W&B run read whole (``ladder fit``'s points): where (URI or directory), id, name,
    config, history rows (streamed from the API) and summary (e.g. a parameter count)."""

    where: str
    run_id: str
    name: str
    config: dict
    rows: Iterable
    summary: dict = field(default_factory=dict)


def read_api_runs(uri: str, *, api: Any = None, field: str = "--source") -> list[WandbHistory]:
    """Every run of a ``wandb://ENTITY/PROJECT/ID[,ID...]`` URI (:class:`WandbApiSource`'s
    lookups and errors), its history streamed page by page when read."""
    src = WandbApiSource(uri, api=api, field=field)
    out = []
    for rid in src.uri.run_ids:
        run = src.run(rid)
        try:
            summary = dict(getattr(run, "summary", None) or {})
        except (TypeError, ValueError):
            summary = {}
        out.append(WandbHistory(where=src.uri.uri_of(rid), run_id=rid,
                                name=str(getattr(run, "name", None) or rid),
                                config=dict(getattr(run, "config", {}) or {}),
                                rows=run.scan_history(page_size=src.page_size), summary=summary))
    return out


def is_wandb_offline_dir(path) -> bool:
    """A W&B offline run directory (or the ``wandb/`` folder above): a ``.wandb`` file in it
    or one level down, and no metrics.jsonl."""
    p = Path(path)
    if not p.is_dir() or (p / "metrics.jsonl").exists():
        return False
    return bool(list(p.glob("*.wandb")) or list(p.glob("*/*.wandb")))


def read_offline_run(path: str | os.PathLike, *, summary: bool = False) -> WandbHistory:
    """A W&B offline run whole, named by its id: its rows and first config as the watcher reads
    them (:data:`POLL_BYTES` a slice); with ``summary``, its summary records too (a second pass
    over the log; later records win)."""
    src = WandbOfflineSource(path)
    run_id = src.record_file().stem.removeprefix("run-")
    rows, configs = [], []
    while True:
        got = src.poll()
        rows += got.rows
        configs += got.configs
        if not got.more:
            break
    return WandbHistory(where=str(path), run_id=run_id, name=run_id,
                        config=configs[0] if configs else {}, rows=rows,
                        summary=_offline_summary(src) if summary else {})


def _offline_summary(src: WandbOfflineSource) -> dict:
    out: dict = {}
    for _, f in src.segments():
        for rec in read_wandb_records(f, full=True):
            if rec.get("type") != "summary":
                continue
            for item in (rec.get("summary") or {}).get("update") or []:
                key = item.get("key") or "/".join(item.get("nested_key") or [])
                try:
                    out[key] = json.loads(item.get("value_json", "null"))
                except ValueError:
                    continue
    return out
