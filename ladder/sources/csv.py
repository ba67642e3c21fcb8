"""The CSV source: a table of metrics, incl. W&B exports (``_step``/``Step`` columns,
``<run> - <key>`` chart columns, ``__MIN``/``__MAX`` dropped)."""

from __future__ import annotations

import os
from pathlib import Path

from ladder.io import InputError, read_bytes
from ladder.sources.base import (
    POS_INT,
    Poll,
    Source,
    check_position,
    file_identity,
    same_file,
    summary_finished,
)


class CsvSource(Source):
    """A CSV of metrics (read whole each poll; rows already returned are not returned again)."""

    kind = "csv"
    poll_seconds = 1.0

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.n_rows = 0
        self.size = 0

    def position(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "n_rows": self.n_rows,
                "size": self.size, "identity": file_identity(self.path)}

    def finished(self) -> str | None:
        return summary_finished(self.path.parent)

    def restore(self, pos: dict) -> bool:
        if pos.get("kind") != self.kind:
            return False
        got = check_position(pos, {"path": ("str", None), "n_rows": ("int", POS_INT),
                                   "size": ("int", POS_INT), "identity": ("dict?", None)})
        if got["path"] == str(self.path) or same_file(self.path, got["identity"]):
            self.n_rows, self.size = got["n_rows"], got["size"]
            return True
        return False

    def poll(self) -> Poll:
        import pandas as pd
        out = Poll()
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            out.notes.append(f"{self.path}: not there (yet); waiting")
            return out
        if size == self.size:
            return out
        if size < self.size:
            out.notes.append(f"{self.path} shrank: reading it again from the start")
            out.restarted = True
            self.n_rows = 0
        self.size = size
        try:
            # read whole each poll: bounded as every file read whole (ladder.io.read_bytes)
            data = read_bytes(self.path, field="--source")
            complete = data[: data.rfind(b"\n") + 1] if b"\n" in data else b""
            import io
            df = pd.read_csv(io.BytesIO(complete), sep=None if self.path.suffix == ".tsv"
                             else ",", engine="c" if self.path.suffix != ".tsv" else "python",
                             dtype=str, keep_default_na=False)
        except pd.errors.EmptyDataError:
            return out
        except (pd.errors.ParserError, UnicodeDecodeError, ValueError, OverflowError) as e:
            raise InputError(f"not a readable CSV ({str(e).splitlines()[0]})",
                             path=self.path) from None
        df = normalise_columns(df)
        if "step" not in df.columns:
            raise InputError("no step column (expected 'step', '_step' or 'Step')",
                             path=self.path, field="step")
        new = df.iloc[self.n_rows:]
        self.n_rows = len(df)
        out.rows = [{k: (None if v == "" else v) for k, v in rec.items()}
                    for rec in new.to_dict("records")]
        return out


def normalise_columns(df):
    """W&B exports: ``_step``/``Step`` -> ``step``; ``<run name> - <key>`` -> ``<key>``;
    ``__MIN``/``__MAX`` companion columns (chart exports) dropped."""
    cols = {}
    for c in df.columns:
        name = str(c)
        if name.endswith(("__MIN", "__MAX")):
            continue
        if name in ("_step", "Step") and "step" not in df.columns:
            cols[c] = "step"
        elif " - " in name and "/" in name.split(" - ", 1)[1]:
            cols[c] = name.split(" - ", 1)[1]
        else:
            cols[c] = name
    df = df[list(cols)].rename(columns=cols)
    return df.loc[:, ~df.columns.duplicated()]
