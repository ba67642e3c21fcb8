"""Pre-registration files (shared/DESIGN.md section 3): write once, verify, amend as a chain.

The ``sha256`` field is the SHA-256 of :func:`ladder.io.canonical_json` of the document without
that field. ``section_sha256`` holds one digest per top-level section (inside the hashed content),
so that :func:`verify` can name the section that was edited; ``law_sha256`` is the digest of the
embedded law, so an edited law is named as such. A file is written atomically, made read-only,
and never replaces an existing file (the final step is a hard link, which fails if the name is
taken, so two writers cannot race either).

An amendment (``--amend OLD.json --reason ...``) is a new pre-registration whose ``amends`` names
the old one's sha256, path and the reason; the old file is not touched. :func:`resolve_chain`
finds the newest valid amendment of a file among the pre-registrations in the same directory.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ladder.io import (EX_CANTCREAT, EX_DATAERR, PREREG_MODE, InputError, atomic_write_bytes,
                       canonical_json, read_json, schema_version, sha256_of, to_jsonable)

SCHEMA = "prereg/1"
HASHED_OUT = ("sha256",)


def content_hash(doc: Mapping) -> str:
    return sha256_of({k: v for k, v in doc.items() if k not in HASHED_OUT})


def section_digests(doc: Mapping) -> dict:
    return {k: sha256_of(v) for k, v in sorted(doc.items())
            if k not in HASHED_OUT and k != "section_sha256"}


def git_sha(cwd: str | Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=cwd or Path(__file__).parent, capture_output=True, text=True,
                           check=False)
    return sha + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def build(*, target: dict, applicability: dict, metric: str, law: dict, forecast: list[dict],
          final: dict, band_level: float, decision_rule: dict, eval_noise: dict | None = None,
          extrapolation: dict | None = None, health_reference: dict | None = None,
          budget_curve: dict | None = None, amends: dict | None = None,
          created: str | None = None) -> dict:
    """The pre-registration document, hashed (plain JSON types only)."""
    from ladder import __version__
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "target": target,
        "applicability": applicability,
        "metric": metric,
        "law": law,
        "law_sha256": sha256_of(law),
        "forecast": forecast,
        "final": final,
        "band_level": band_level,
        "eval_noise": eval_noise,
        "extrapolation": extrapolation,
        "decision_rule": decision_rule,
        "health_reference": health_reference,
        "budget_curve": budget_curve,
        "amends": amends,
        "created": created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "tool_version": f"ladder {__version__}",
    }
    doc = to_jsonable(doc)
    doc["section_sha256"] = section_digests(doc)
    doc["sha256"] = content_hash(doc)
    return doc


def write_once(path: str | os.PathLike, doc: Mapping) -> Path:
    """Write ``doc`` to ``path`` atomically and read-only; never replace an existing file."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise InputError("exists; a pre-registration is never overwritten (choose another --out, "
                         "or amend it with --amend)", path=path, exit_code=EX_CANTCREAT)
    import json
    data = (json.dumps(to_jsonable(doc), indent=2, allow_nan=False) + "\n").encode("utf-8")
    try:
        return atomic_write_bytes(path, data, mode=PREREG_MODE, exclusive=True)
    except FileExistsError:
        raise InputError("exists; a pre-registration is never overwritten", path=path,
                         exit_code=EX_CANTCREAT) from None


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
    if doc.get("schema") != SCHEMA:
        v.problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
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
    if stored is None:
        v.problems.append("no sha256 field")
    v.ok = (stored == computed) and not v.problems and not v.changed
    return v


def _name_change(doc, key) -> str:
    if key == "forecast" and isinstance(doc.get("forecast"), list):
        return "forecast (a forecast point was edited)"
    return key


def verify(path: str | os.PathLike) -> Verification:
    doc = read_json(path, schema="prereg")
    _known_version(doc, path)
    return verify_doc(doc, str(path))


def _known_version(doc: Mapping, path) -> None:
    """A newer schema version is not "MODIFIED": it is a file this tool cannot judge."""
    v = schema_version(dict(doc))
    if v is not None and v > int(SCHEMA.split("/")[1]):
        raise InputError(f"written by a newer ladder ({doc.get('schema')}); this one reads "
                         f"{SCHEMA}: upgrade ladder to verify it", path=path, field="schema",
                         exit_code=EX_DATAERR)


def seal(doc: Mapping) -> dict:
    """``doc`` with its ``section_sha256`` and ``sha256`` (re)computed (for tools and tests that
    assemble a pre-registration by hand; :func:`build` does this for the command)."""
    out = to_jsonable(dict(doc))
    out.pop("sha256", None)
    out["section_sha256"] = section_digests(out)
    out["sha256"] = content_hash(out)
    return out


def load(path: str | os.PathLike, *, check: bool = True) -> dict:
    """Read a pre-registration; with ``check``, a modified file is an InputError."""
    doc = read_json(path, schema="prereg")
    _known_version(doc, path)
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
    return doc


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
    """The amendment chain from a given pre-registration to the newest valid amendment."""

    links: list[ChainLink]
    skipped: list[str]

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
        return s


def resolve_chain(path: str | os.PathLike) -> Chain:
    """From ``path``, follow amendments (files in the same directory whose ``amends.sha256`` is
    the current link's hash) to the newest valid one. Invalid (tampered) candidates are skipped
    and reported; among several valid amendments of one link the latest ``created`` wins."""
    path = Path(path)
    start = load(path)
    links = [ChainLink(str(path), start["sha256"], None, start.get("created"))]
    skipped: list[str] = []
    candidates: dict[str, list[tuple[Path, dict]]] = {}
    for p in sorted(path.parent.glob("*.json")):
        if p.resolve() == path.resolve():
            continue
        try:
            doc = read_json(p)
        except InputError:
            continue
        if not str(doc.get("schema", "")).startswith("prereg/"):
            continue
        am = doc.get("amends")
        if isinstance(am, Mapping) and isinstance(am.get("sha256"), str):
            candidates.setdefault(am["sha256"], []).append((p, doc))
    seen = {start["sha256"]}
    cur = start["sha256"]
    while cur in candidates:
        valid = []
        for p, doc in candidates[cur]:
            v = verify_doc(doc, str(p))
            if v.ok:
                valid.append((str(doc.get("created", "")), p, doc))
            else:
                skipped.append(f"{p.name} fails verification")
        if not valid:
            break
        _, p, doc = max(valid, key=lambda t: (t[0], str(t[1])))
        if doc["sha256"] in seen:
            break
        seen.add(doc["sha256"])
        links.append(ChainLink(str(p), doc["sha256"], doc["amends"].get("reason"),
                               doc.get("created")))
        cur = doc["sha256"]
    return Chain(links=links, skipped=skipped)


def canonical_bytes(doc: Mapping) -> bytes:
    return canonical_json({k: v for k, v in doc.items() if k not in HASHED_OUT})
