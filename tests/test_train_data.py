"""Data: the split, batches as pure functions of (seed, i), token files and their failures."""

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from ladder.io import InputError
from ladder.trainer.data import (
    VAL_BUCKETS,
    is_held_out,
    load_corpus,
    shuffle_bytes,
    stdlib_corpus,
    stdlib_files,
)


def test_stdlib_corpus_excludes_tests_and_splits_by_path_hash():
    root, files = stdlib_files()
    assert root == Path(sysconfig.get_paths()["stdlib"])
    rel = [str(f.relative_to(root)) for f in files]
    assert "os.py" in rel and "json/decoder.py" in rel
    assert not any(part in ("test", "tests", "idle_test", "site-packages")
                   for r in rel for part in Path(r).parts)
    c = stdlib_corpus()
    # the split is the hash rule, computed here independently of the module
    held = [r for r in rel
            if int.from_bytes(hashlib.sha256(r.encode()).digest()[:8], "big") % VAL_BUCKETS == 0]
    assert held == [r for r in rel if is_held_out(r)] and 0 < len(held) < len(rel)
    val_bytes = sum((root / r).stat().st_size for r in held) + len(held) - 1  # + NUL separators
    assert len(c.val) == val_bytes
    assert len(c.train) + len(c.val) == sum(f.stat().st_size for f in files) + len(files) - 2
    fp = c.fingerprint
    assert fp["files"] == len(files) and fp["kind"] == "python-stdlib" and fp["python"]
    assert c.vocab_size == 256 and c.train.dtype == np.uint8


def test_batches_are_pure_functions_of_seed_and_index(tmp_path):
    # token ids 0..N-1 in order: every window must be a run of consecutive integers
    n = 5000
    path = tmp_path / "tok.npy"
    np.save(path, np.arange(n, dtype=np.uint16))
    c = load_corpus([str(path)], vocab_size=n)
    assert len(c.train) == 4750 and len(c.val) == 250   # the last 5% is held out
    b = c.batch(seed=3, index=7, batch=4, seq_len=16)
    assert b["tokens"].shape == (4, 16) and b["tokens"].dtype == np.int32
    np.testing.assert_array_equal(np.diff(b["tokens"], axis=1), 1)
    np.testing.assert_array_equal(b["targets"], b["tokens"] + 1)
    assert b["targets"].max() < 4750                       # never reads into the held-out part
    again = c.batch(seed=3, index=7, batch=4, seq_len=16)
    np.testing.assert_array_equal(b["tokens"], again["tokens"])
    assert not np.array_equal(b["tokens"], c.batch(3, 8, 4, 16)["tokens"])
    assert not np.array_equal(b["tokens"], c.batch(4, 7, 4, 16)["tokens"])
    ev = c.eval_batches(2, 4, 16)
    assert len(ev) == 2 and all(e["tokens"].min() >= 4750 for e in ev)
    np.testing.assert_array_equal(ev[0]["tokens"][0], np.arange(4750, 4766))


def test_shuffle_bytes_keeps_the_multiset_and_breaks_the_order():
    c = stdlib_corpus()
    b = c.batch(0, 0, 2, 64)
    s = shuffle_bytes(b, 0, 0)
    full = np.concatenate([b["tokens"], b["targets"][:, -1:]], 1)
    sfull = np.concatenate([s["tokens"], s["targets"][:, -1:]], 1)
    np.testing.assert_array_equal(np.sort(full, 1), np.sort(sfull, 1))
    assert not np.array_equal(full, sfull)
    np.testing.assert_array_equal(s["tokens"][:, 1:], s["targets"][:, :-1])


def test_bin_tokens_uint16_and_uint32(tmp_path):
    ids = np.array([1, 2, 3, 65535, 0] * 40, dtype=np.uint16)
    (tmp_path / "a.bin").write_bytes(ids.tobytes())
    c = load_corpus([str(tmp_path / "a.bin")], vocab_size=65536)
    np.testing.assert_array_equal(np.concatenate([c.train, c.val]), ids)
    big = np.array([70000, 5] * 100, dtype=np.uint32)
    (tmp_path / "b.bin").write_bytes(big.tobytes())
    c = load_corpus([str(tmp_path / "b.bin")], vocab_size=100_000)
    assert int(c.train[0]) == 70000 and c.vocab_size == 100_000


def test_text_files_and_globs(tmp_path):
    for i in range(30):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i}\n" * 20)
    c = load_corpus([str(tmp_path / "*.txt")])
    assert c.vocab_size == 256 and len(c.val) > 0 and c.fingerprint["files"] == 30
    text = bytes(np.concatenate([c.train, c.val]))
    assert b"document number 7\n" in text


@pytest.mark.parametrize("case", ["out_of_vocab", "odd_length", "not_npy", "float", "missing",
                                  "bin_without_vocab"])
def test_bad_token_files_name_the_file(tmp_path, case):
    path = tmp_path / "bad.npy"
    vocab = 256
    if case == "out_of_vocab":
        np.save(path, np.array([1, 2, 300, 4] * 50, dtype=np.uint16))
    elif case == "odd_length":
        path = tmp_path / "bad.bin"
        path.write_bytes(b"\x01\x00\x02")          # 3 bytes: not whole uint16 tokens
    elif case == "not_npy":
        path.write_bytes(b"garbage, not an npy header")
    elif case == "float":
        np.save(path, np.ones(100, np.float32))
    elif case == "bin_without_vocab":
        path = tmp_path / "bad.bin"
        path.write_bytes(b"\x01\x00" * 100)
        vocab = None
    else:
        path = tmp_path / "nope.npy"
    with pytest.raises(InputError) as e:
        load_corpus([str(path)], vocab_size=vocab)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    if case == "out_of_vocab":
        assert "300" in msg and "position 2" in msg
