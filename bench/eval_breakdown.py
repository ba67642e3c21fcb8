"""Where a finished run's held-out loss comes from: by position in the window, and by document.

The demo ladder was redesigned (issue 21, docs/LOG.md 2026-12-02) after this breakdown showed
that the old proxy hero's loss fell along the window while every rung's stayed flat (it had
learned to use its context, the rungs had not), and that the codec tables among the held-out files
lose loss faster with size than the code around them. For each run directory it restores the
newest checkpoint, scores the ladder's own eval set (the same windows as the trainer: the rung's
``eval_sequences``, dropless) and prints the mean loss overall, per bucket of positions, and for
the windows that start in documents matching ``--docs`` (a path prefix of the default corpus,
e.g. ``encodings/``) against the rest.

    python bench/eval_breakdown.py RUN_DIR [RUN_DIR ...] [--docs encodings/] [--json]

Runs trained on the default corpus only (``--docs``); any corpus for positions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """Doubling buckets of positions: [0, 4), [4, 8), [8, 16), ... up to ``seq_len``."""
    edges = [0, 4]
    while edges[-1] < seq_len:
        edges.append(min(2 * edges[-1], seq_len))
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < seq_len]


def window_documents(corpus_val_len: int, starts: np.ndarray):
    """The held-out document each eval window starts in, for the default corpus (documents joined
    by one separator byte in the order ``ladder.trainer.data.stdlib_corpus`` joins them)."""
    from ladder.trainer.data import is_held_out, stdlib_files

    root, files = stdlib_files()
    held = [(str(f.relative_to(root)), f.stat().st_size) for f in files
            if is_held_out(str(f.relative_to(root)))]
    if sum(s for _, s in held) + len(held) - 1 != corpus_val_len:
        raise SystemExit("the run's held-out stream is not this Python's standard library")
    doc_starts = np.cumsum([0] + [s + 1 for _, s in held])[:-1]
    index = np.searchsorted(doc_starts, starts, side="right") - 1
    return [held[i][0] for i in index]


def breakdown(run_dir: Path, docs: str | None) -> dict:
    import jax
    import jax.numpy as jnp

    from ladder import model
    from ladder.specs import Rung
    from ladder.trainer.checkpointing import Checkpoints
    from ladder.trainer.data import load_corpus
    from ladder.trainer.step import make_mesh, programs

    cfg = json.loads((run_dir / "config.json").read_text())
    rung = Rung.from_dict(cfg["rung"])
    train = cfg.get("train", {})
    corpus = load_corpus(tuple(train.get("data") or ()), train.get("vocab_size"))
    n_seq = train.get("eval_sequences") or rung.eval_sequences
    batch = min(n_seq, rung.eval_batch or n_seq)
    mesh = make_mesh(1, 1, rung.model.n_experts, batch)
    like = programs(rung.model, mesh, rung.optimizer_settings, 1).init_state(0)
    ckpt = Checkpoints(run_dir / "checkpoints", 2)
    step = ckpt.latest_step()
    state = ckpt.restore(step, like)
    losses = []
    for b in corpus.eval_batches(n_seq // batch, batch, rung.seq_len):
        logits, _ = model.apply(rung.model, state["params"], state["router_bias"],
                                jnp.asarray(b["tokens"]), dropless=True)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
        losses.append(-np.take_along_axis(np.asarray(logp), np.asarray(b["targets"])[..., None],
                                          -1)[..., 0])
    ce = np.concatenate(losses)                                     # [windows, positions]
    out = {"run": run_dir.name, "step": step, "windows": len(ce), "loss": float(ce.mean()),
           "positions": {f"{a}-{b - 1}": float(ce[:, a:b].mean())
                         for a, b in position_buckets(rung.seq_len)}}
    if docs:
        n = len(ce)
        starts = np.linspace(0, len(corpus.val) - rung.seq_len - 1, n).astype(np.int64)
        match = np.array([d.startswith(docs) for d in window_documents(len(corpus.val), starts)])
        out["docs"] = {"prefix": docs, "share": float(match.mean()),
                       "matching": float(ce[match].mean()) if match.any() else None,
                       "rest": float(ce[~match].mean()) if (~match).any() else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    ap.add_argument("--docs", default=None, metavar="PREFIX",
                    help="also split by held-out documents whose path starts with PREFIX")
    ap.add_argument("--json", action="store_true", help="one JSON list instead of lines")
    a = ap.parse_args()
    rows = [breakdown(d, a.docs) for d in a.runs]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        pos = "  ".join(f"{k}: {v:.4f}" for k, v in r["positions"].items())
        line = f"{r['run']} (step {r['step']}, {r['windows']} windows): {r['loss']:.4f}; {pos}"
        if "docs" in r:
            d = r["docs"]
            line += (f"; {d['prefix']} ({d['share']:.1%} of windows) {d['matching']:.4f}, "
                     f"the rest {d['rest']:.4f}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
