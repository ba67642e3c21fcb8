"""`ladder tokenize` on a >= 1 GB JSONL corpus: peak memory and throughput per --processes.

Builds the corpus once (the Python standard library's sources cut at line boundaries into
records of 200-4,000 characters, shuffled, repeated with fresh cuts until --gb is reached; one
JSON object per line with the text under "text") and a byte-level BPE tokenizer trained here on
a sample of it (vocab 8,192; nothing downloaded). Then runs `ladder tokenize` on it once per
--processes value, side by side in one session, under /usr/bin/time -v (peak RSS of the largest
process) while sampling the summed RSS of the whole process tree (main process + workers), and
checks that every run wrote the same shards (sha256 in the manifests). With --kill-at F it also
kills one run (SIGKILL) once F of the input is read, runs it again, and checks the shards equal
the uninterrupted run's.

    nice -n 15 python bench/tokenize_stream.py [--gb 1.0] [--processes 0,1,2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def stdlib_texts() -> list[str]:
    from ladder.trainer.data import stdlib_files

    _, files = stdlib_files()
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def build_corpus(path: Path, gb: float, seed: int = 0) -> None:
    """Records cut once from the stdlib sources at line boundaries (200-4,000 characters),
    written in a fresh shuffled order per pass until ``gb`` GB (records repeat ~30x at 1 GB:
    tokenizing speed does not care, and identical records hash into the same split)."""
    rng = random.Random(seed)
    lines_out = []
    for t in stdlib_texts():
        lines = t.splitlines(keepends=True)
        i = 0
        while i < len(lines):
            size, j, piece, n = rng.randint(200, 4000), i, [], 0
            while j < len(lines) and n < size:
                piece.append(lines[j])
                n += len(lines[j])
                j += 1
            lines_out.append(json.dumps({"text": "".join(piece)}) + "\n")
            i = j
    target = int(gb * 1e9)
    tmp = path.with_suffix(".partial")
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            rng.shuffle(lines_out)
            for line in lines_out:
                f.write(line)
                written += len(line)      # json.dumps escapes to ASCII: characters = bytes
                if written >= target:
                    break
    os.replace(tmp, path)


def train_tokenizer(path: Path, sample_chars: int = 20_000_000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, size = [], 0
    for t in stdlib_texts():
        texts.append(t)
        size += len(t)
        if size >= sample_chars:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path))


def tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_tokenize(corpus: Path, tok: Path, out: Path, processes: int,
                 kill_when=None) -> dict:
    """One `ladder tokenize` under /usr/bin/time -v; ``kill_when(out)`` -> True kills it."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "ladder", "-q", "tokenize",
           str(corpus), "--tokenizer", str(tok), "--out", str(out), "--processes",
           str(processes)]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         start_new_session=True)
    peak, killed = 0, False
    while p.poll() is None:
        peak = max(peak, tree_rss(p.pid))
        if kill_when is not None and kill_when(out):
            os.killpg(p.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.2)
    _, err = p.communicate()
    wall = time.perf_counter() - t
    if killed:
        return {"killed": True, "wall_s": wall}
    if p.returncode != 0:
        raise SystemExit(f"tokenize failed ({p.returncode}):\n{err[-3000:]}")
    max_rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) * 1024
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", err).group(1))
              for k in ("User", "System"))
    m = json.loads((out / "manifest.json").read_text())
    return {"processes": processes, "wall_s": wall, "cpu_s": cpu, "max_rss": max_rss,
            "tree_rss": peak,
            "tokens": sum(m["splits"][s]["tokens"] for s in ("train", "val")),
            "documents": sum(m["splits"][s]["documents"] for s in ("train", "val")),
            "shards": {s: [sh["sha256"] for sh in m["splits"][s]["shards"]]
                       for s in ("train", "val")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="corpus size (default: 1.0)")
    ap.add_argument("--processes", default="1,2", help="comma-separated --processes values")
    ap.add_argument("--dir", default="/tmp/ladder-tokenize-bench", help="work folder (kept: "
                    "the corpus is reused)")
    ap.add_argument("--kill-at", type=float, default=None, metavar="F",
                    help="also kill a run with the first --processes value once the progress "
                         "file says F of the input is read, resume it and compare")
    a = ap.parse_args()
    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{a.gb:g}gb.jsonl"
    if not corpus.exists():
        t = time.perf_counter()
        build_corpus(corpus, a.gb)
        print(f"corpus: {corpus} built in {time.perf_counter() - t:.0f} s")
    tok = work / "tokenizer.json"
    if not tok.exists():
        train_tokenizer(tok)
    size = corpus.stat().st_size
    with open(corpus, "rb") as f:
        records = sum(1 for _ in f)
    print(f"corpus: {size / 1e9:.3f} GB, {records:,} records; tokenizer: byte-level BPE, vocab "
          f"8192; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    results = []
    for n in [int(x) for x in a.processes.split(",")]:
        out = work / f"out-p{n}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        r = run_tokenize(corpus, tok, out, n)
        results.append(r)
        print(f"processes {n}: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU (all processes),"
              f" {size / r['wall_s'] / 1e6:.2f} MB/s, {r['tokens'] / r['wall_s'] / 1e6:.3f} M "
              f"tokens/s, {size / r['cpu_s'] / 1e6:.2f} MB per CPU-second, load average "
              f"{os.getloadavg()[0]:.1f}, peak RSS {r['max_rss'] / 2**20:.0f}"
              f" MiB (largest process), {r['tree_rss'] / 2**20:.0f} MiB (all processes), "
              f"{r['tokens']:,} tokens, {r['documents']:,} documents", flush=True)
    base = results[0]
    for r in results[1:]:
        assert r["shards"] == base["shards"], "shards differ between --processes values"
        print(f"processes {r['processes']} vs {base['processes']}: "
              f"{base['wall_s'] / r['wall_s']:.2f}x the throughput, "
              f"{r['tree_rss'] / base['tree_rss']:.2f}x the memory (all processes)")
    print("shards identical across --processes values: "
          f"{sum(len(v) for v in base['shards'].values())} shards")
    if a.kill_at is not None:
        n = base["processes"]
        out = work / f"out-p{n}-killed"
        subprocess.run(["rm", "-rf", str(out)], check=True)

        def far_enough(o: Path) -> bool:
            try:
                pos = json.loads((o / "progress.json").read_text())["position"]
            except (OSError, ValueError, KeyError):
                return False
            return pos[0] > 0 or pos[1] >= a.kill_at * size

        first = run_tokenize(corpus, tok, out, n, kill_when=far_enough)
        assert first.get("killed"), "the run finished before it could be killed"
        again = run_tokenize(corpus, tok, out, n)
        same = again["shards"] == base["shards"]
        print(f"killed after {first['wall_s']:.0f} s, resumed in {again['wall_s']:.0f} s: "
              f"shards {'identical to' if same else 'DIFFERENT from'} the uninterrupted run's")
        assert same


if __name__ == "__main__":
    main()
