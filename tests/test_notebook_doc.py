"""docs/notebook.md runs (issue 38 item 3): its python blocks in order in one namespace, each
followed by a text block that must be what the block prints (numbers rounded as the doc rounds
them), so the notebook example cannot drift from the library."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "notebook.md"


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^```(\w+)\n(.*?)^```$", text, flags=re.S | re.M)]


def test_the_notebook_doc_runs_and_prints_what_it_shows():
    blocks = _blocks(DOC.read_text())
    assert [lang for lang, _ in blocks] == ["python", "text"] * (len(blocks) // 2)
    env: dict = {}
    for (_, code), (_, shown) in zip(blocks[::2], blocks[1::2], strict=True):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOC), "exec"), env)  # noqa: S102 - the doc's own code
        got = [ln.rstrip() for ln in out.getvalue().splitlines()]
        assert got == [ln.rstrip() for ln in shown.splitlines()], code
    law = env["law"]
    assert len(repr(law).splitlines()) <= 20 and "<table>" in law._repr_html_()
