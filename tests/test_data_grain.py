"""Token shards (`ladder tokenize`) read through Grain: every window of an epoch once, a fresh
shuffle each epoch, resume mid-epoch continues the same order, 2 data-parallel processes see
disjoint halves, segment ids restart exactly after EOS, and `ladder run --data DIR` trains,
records the tokenizer's hash and resumes bitwise."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ladder.cli.main import main
from ladder.io import InputError, read_json, read_metrics
from ladder.specs import LADDERS
from ladder.trainer.data import load_corpus
from ladder.trainer.tokens import GrainFeed, WindowSource, load_shards, segment_ids
from ladder.trainer.train import train_rung
from ladder.trainer.trainconfig import RunArgs, TrainConfig

EOS = "<|endoftext|>"
SEQ = 16
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega scaling ladder expert router token").split()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """40 text documents of random words, a BPE tokenizer trained on them in memory, and the
    shards `ladder tokenize` writes from them (small shards: several per split)."""
    root = tmp_path_factory.mktemp("tok")
    rng = np.random.default_rng(0)
    docs = []
    for i in range(40):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(30, 200))))
        (root / f"doc{i:02d}.txt").write_text(text)
        docs.append(text)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(root / "tokenizer.json"))
    code = main(["tokenize", str(root / "doc*.txt"), "--tokenizer", str(root / "tokenizer.json"),
                 "--out", str(root / "shards"), "--shard-tokens", "2000"])
    assert code == 0
    return root


def test_tokenize_writes_shards_and_a_manifest_with_the_tokenizer_hash(corpus_dir):
    m = read_json(corpus_dir / "shards" / "manifest.json", schema="token-shards")
    sha = hashlib.sha256((corpus_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert m["tokenizer"]["sha256"] == sha and m["dtype"] == "uint16"
    tok = Tokenizer.from_file(str(corpus_dir / "tokenizer.json"))
    assert m["eos_id"] == tok.token_to_id(EOS) and m["vocab_size"] == tok.get_vocab_size()
    assert len(m["splits"]["train"]["shards"]) > 1
    # the shards decode back to the documents, one EOS after each
    stream = np.concatenate([np.fromfile(corpus_dir / "shards" / s["file"], np.uint16)
                             for s in m["splits"]["train"]["shards"]])
    ends = np.flatnonzero(stream == m["eos_id"])
    first = tok.decode(stream[:ends[0]].tolist())
    assert first in {p.read_text() for p in corpus_dir.glob("doc*.txt")}
    total = m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"]
    assert total == 40 and len(ends) == m["splits"]["train"]["documents"]
    # never overwritten
    code = main(["tokenize", str(corpus_dir / "doc00.txt"), "--tokenizer",
                 str(corpus_dir / "tokenizer.json"), "--out", str(corpus_dir / "shards")])
    assert code >= 64


def _window_ids(src: WindowSource) -> dict:
    return {src[i]["tokens"].tobytes() + src[i]["targets"][-1:].tobytes(): i
            for i in range(len(src))}


def _ids(batch: dict, index: dict) -> list[int]:
    full = np.concatenate([batch["tokens"], batch["targets"][:, -1:]], axis=1)
    return [index[row[:-1].astype(np.int32).tobytes() + row[-1:].astype(np.int32).tobytes()]
            for row in full]


def test_every_window_of_an_epoch_is_seen_once_and_each_epoch_is_reshuffled(corpus_dir):
    shards = load_shards(corpus_dir / "shards")
    src = WindowSource(list(shards.train_shards), SEQ, shards.eos_id)
    index = _window_ids(src)
    assert len(index) == len(src)      # windows are distinct (random text), so ids by content
    batch = 4
    feed = GrainFeed(src, seed=3, batch=batch, rows=slice(0, batch))
    n = len(src)   # the sampler's stream runs on across epochs, so a batch may straddle two
    seen = [i for k in range(-(-2 * n // batch)) for i in _ids(feed.batch(k), index)]
    one, two = seen[:n], seen[n:2 * n]
    assert sorted(one) == list(range(n))    # epoch 1: every window once, none twice
    assert sorted(two) == list(range(n))    # epoch 2 as well ...
    assert one != two                       # ... in a fresh order
    # the windows tile each shard: every training token is a target exactly once per epoch
    assert len(src) == sum((len(s) - 1) // SEQ for s in shards.train_shards)


def test_resume_mid_epoch_continues_the_same_order(corpus_dir):
    shards = load_shards(corpus_dir / "shards")
    a = shards.train_feed(7, 4, SEQ, slice(0, 4))
    first = [a.batch(k)["tokens"] for k in range(6)]   # the trainer has drawn batch 5 ...
    state = a.state_for(5)                             # ... when it checkpoints step 5
    rest = [a.batch(k)["tokens"] for k in range(6, 12)]
    b = shards.train_feed(7, 4, SEQ, slice(0, 4))
    b.iterator.set_state(state)
    b.seek(5)
    again = [b.batch(k)["tokens"] for k in range(5, 12)]
    assert all(np.array_equal(x, y) for x, y in zip(again, [first[5], *rest]))


def test_two_data_parallel_processes_see_disjoint_halves(corpus_dir):
    shards = load_shards(corpus_dir / "shards")
    src = WindowSource(list(shards.train_shards), SEQ, shards.eos_id)
    index = _window_ids(src)
    # batch 4 over 2 processes: process 0 builds rows 0-1, process 1 rows 2-3
    feeds = [shards.train_feed(0, 4, SEQ, rows) for rows in (slice(0, 2), slice(2, 4))]
    half = len(src) // 2 // 2      # batches of 2 in one epoch of half the windows
    seen = [{i for k in range(half) for i in _ids(f.batch(k), index)} for f in feeds]
    assert not seen[0] & seen[1]
    assert len(seen[0]) == len(seen[1]) == half * 2
    assert len(seen[0] | seen[1]) >= len(src) - 3   # together: all but the odd remainder


def test_segment_ids_restart_exactly_after_each_eos(corpus_dir):
    shards = load_shards(corpus_dir / "shards")
    b = shards.train_feed(1, 8, SEQ, slice(0, 8))
    eos = shards.eos_id
    found = 0
    for k in range(20):
        x = b.batch(k)
        tok, seg = x["tokens"], x["segment_ids"]
        assert seg.dtype == np.int32 and seg.shape == tok.shape == (8, SEQ)
        assert (seg[:, 0] == 0).all()
        step = np.diff(seg, axis=1)
        assert np.array_equal(step, (tok[:, :-1] == eos).astype(np.int32))
        found += int((tok == eos).sum())
    assert found > 0          # the check above met real document boundaries
    assert np.array_equal(segment_ids(np.array([5, eos, 6, 7, eos, eos, 8]), eos),
                          [0, 0, 1, 1, 1, 2, 3])
    for e in shards.eval_batches(2, 4, SEQ):
        assert np.array_equal(np.diff(e["segment_ids"], axis=1),
                              (e["tokens"][:, :-1] == eos).astype(np.int32))


def _shard_cfg(corpus_dir):
    # the tokenizer's 300 ids on the tiny rung (vocabulary 256): a model change, asked for
    return TrainConfig(run=RunArgs(peak_flops=1e11, progress=False),
                       data=(str(corpus_dir / "shards"),), model={"vocab_size": 300})


@pytest.mark.heavy  # 10 s on 2 busy cores
def test_run_on_token_shards_records_the_tokenizer_and_checkpoints_the_iterator(corpus_dir,
                                                                               tmp_path):
    rung = LADDERS["tiny"].rungs[0]
    s = train_rung(rung, tmp_path / "run", _shard_cfg(corpus_dir), max_steps=3)
    assert s["status"] == "running" and s["step"] == 3
    env = read_json(tmp_path / "run" / "env.json", schema="run-env")
    sha = hashlib.sha256((corpus_dir / "tokenizer.json").read_bytes()).hexdigest()
    assert env["corpus"]["tokenizer_sha256"] == sha and env["corpus"]["loader"] == "grain"
    assert read_json(tmp_path / "run" / "config.json")["rung"]["model"]["vocab_size"] == 300
    ck = tmp_path / "run" / "checkpoints" / "3"
    assert (ck / "state").is_dir() and (ck / "data" / "process_0-of-1.json").is_file()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["train/ce"] == pytest.approx(
        np.log(300), abs=0.2)   # an untrained model over the 300-token vocabulary


@pytest.mark.slow
def test_run_on_token_shards_resumes_bitwise(corpus_dir, tmp_path):
    rung, cfg = LADDERS["tiny"].rungs[0], _shard_cfg(corpus_dir)
    train_rung(rung, tmp_path / "full", cfg, max_steps=10)
    train_rung(rung, tmp_path / "part", cfg, max_steps=4)
    train_rung(rung, tmp_path / "part", cfg, max_steps=10, resume=True)
    keys = ["step", "train/loss", "grad/norm", "params/norm/router_bias"]
    a, b = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("full", "part"))
    assert [r["step"] for r in a] == list(range(1, 11))
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_bad_shard_directories_fail_with_the_file_named(corpus_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(corpus_dir / "shards", bad)
    first = sorted(bad.glob("train-*.bin"))[0]
    first.write_bytes(first.read_bytes()[:-2])
    with pytest.raises(InputError, match=str(first)):
        load_corpus((str(bad),))
    with pytest.raises(InputError, match="vocab_size"):
        load_corpus((str(corpus_dir / "shards"),), vocab_size=256)
    code = main(["tokenize", str(corpus_dir / "doc00.txt"), "--tokenizer",
                 str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")])
    assert code >= 64 and not (tmp_path / "o").exists()
    assert Path(corpus_dir / "shards" / "manifest.json").exists()
