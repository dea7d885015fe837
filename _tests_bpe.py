"""Tests for bpe.py: training against a deliberately naive trainer, the GPT-2 format and
GPT-2's exact ids, streaming in constant memory, encode_file, and every user error."""
import collections
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import regex

import bpe

_BPE_SHARED = Path(__file__).resolve().parent.parent / "shared"
_BPE_REPO = Path(__file__).resolve().parent
_BPE_GPT2_VOCAB = _BPE_SHARED / "reference" / "gpt2_vocab.json"
_BPE_GPT2_MERGES = _BPE_SHARED / "reference" / "gpt2_merges.txt"
_BPE_SHAKESPEARE = _BPE_SHARED / "data" / "shakespeare.txt"
_BPE_TINYSTORIES = _BPE_SHARED / "reference" / "tinystories_sample.txt"
_BPE_EOT = "<|endoftext|>"


def _bpe_need(path):
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared data directory is not mounted)")
    return path


# -----------------------------------------------------------------------------
# The oracle: BPE exactly as the handout states it, with no cleverness. After every merge
# it recounts every pair of every word from scratch and takes max((count, pair)).

def _bpe_naive_train(text, vocab_size, special_tokens=()):
    if special_tokens:
        alts = sorted(special_tokens, key=len, reverse=True)
        parts = regex.split("|".join(regex.escape(s) for s in alts), text)
    else:
        parts = [text]
    words = collections.Counter()
    for part in parts:
        for w in regex.findall(bpe.GPT2_PAT, part):
            words[tuple(bytes([b]) for b in w.encode("utf-8"))] += 1
    vocab = {i: bytes([i]) for i in range(256)}
    for s in special_tokens:
        vocab[len(vocab)] = s.encode("utf-8")
    merges = []
    while len(vocab) < vocab_size:
        pairs = collections.Counter()
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return vocab, merges


# -----------------------------------------------------------------------------
# Corpora

def _bpe_unicode_text():
    rng = random.Random(0)
    words = ["日本語", "テキスト", "中文字符", "한국어", "русский", "Ελληνικά", "العربية",
             "naïve", "café", "e\u0301te\u0301", "a\u0308\u0304", "कि\u093e", "🙂", "🚀🚀",
             "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "ß", "Ωmega", "x\u0336y\u0336", "１２３",
             "٣٤٥", "\u00a0nbsp", "tab\there"]
    seps = [" ", " ", "  ", "\n", "\n\n", ", ", "。", "! "]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(3000))


def _bpe_special_text():
    rng = random.Random(1)
    docs = []
    for _ in range(200):
        n = rng.randint(3, 30)
        docs.append(" ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "eot|",
                                         "<|", "|>", "end", "of", "text"]) for _ in range(n)))
    seps = [_BPE_EOT, "<|eot|>", "<|eot|><|eot|>", "\n" + _BPE_EOT + "\n", "<|eot|><|eot|><|eot|>"]
    return "".join(d + rng.choice(seps) for d in docs)


def _bpe_ties_text():
    # Every 3-letter word over 6 letters exactly once: nearly every pair count is tied,
    # so the merge order is decided by the lexicographic rule again and again.
    letters = "abcdef"
    words = [a + b + c for a in letters for b in letters for c in letters]
    random.Random(2).shuffle(words)
    return " ".join(words) + "\n" + " ".join(w[::-1].upper() for w in words)


def _bpe_shakespeare_1mb():
    data = _bpe_need(_BPE_SHAKESPEARE).read_bytes()[:1_000_000]
    return data[:data.rindex(b"\n") + 1].decode("utf-8")


_BPE_HANDOUT_TEXT = ("low low low low low\nlower lower widest widest widest\n"
                     "newest newest newest newest newest newest")

_BPE_CASES = {
    # name: (text factory, vocab size, special tokens)
    "handout": (lambda: _BPE_HANDOUT_TEXT, 300, [_BPE_EOT]),
    "tinystories": (lambda: _bpe_need(_BPE_TINYSTORIES).read_text(encoding="utf-8"), 500,
                    [_BPE_EOT]),
    "unicode": (_bpe_unicode_text, 450, []),
    "specials": (_bpe_special_text, 400, [_BPE_EOT, "<|eot|>", "<|eot|><|eot|>"]),
    "ties": (_bpe_ties_text, 420, []),
    "shakespeare_1mb": (_bpe_shakespeare_1mb, 456, [_BPE_EOT]),
}


@pytest.fixture(scope="module")
def bpe_trained(tmp_path_factory):
    """{case: (text, path, specials, naive (vocab, merges), train_bpe (vocab, merges))}."""
    d = tmp_path_factory.mktemp("bpe_corpora")
    out = {}
    for name, (make, vocab_size, specials) in _BPE_CASES.items():
        text = make()
        path = d / f"{name}.txt"
        path.write_bytes(text.encode("utf-8"))
        naive = _bpe_naive_train(text, vocab_size, specials)
        fast = bpe.train_bpe(str(path), vocab_size, specials)
        out[name] = (text, path, specials, naive, fast)
    return out


# -----------------------------------------------------------------------------
# Training

@pytest.mark.parametrize("compiled", [False, True])
def test_bpe_handout_example_merges(compiled):
    # The handout's example pre-tokenizes on whitespace: feed its word counts directly.
    counts = {"low": 5, "lower": 2, "widest": 3, "newest": 6}
    vocab, merges = bpe.train_from_counts(counts, 256 + 1 + 12, [_BPE_EOT], compiled=compiled)
    expected = ["s t", "e st", "o w", "l ow", "w est", "n e", "ne west", "w i", "wi d",
                "wid est", "low e", "lowe r"]
    assert [f"{a.decode()} {b.decode()}" for a, b in merges] == expected
    assert vocab[256] == _BPE_EOT.encode() and vocab[257] == b"st" and vocab[268] == b"lower"
    six = bpe.Tokenizer(vocab, merges[:6])
    assert [six.vocab[i] for i in six.encode("newest")] == [b"ne", b"west"]


@pytest.mark.parametrize("case", list(_BPE_CASES))
def test_bpe_train_matches_naive(bpe_trained, case):
    text, path, specials, (nv, nm), (fv, fm) = bpe_trained[case]
    assert fm == nm
    assert fv == nv
    assert len(fv) == _BPE_CASES[case][1] or len(fm) < _BPE_CASES[case][1] - 256 - len(specials)


@pytest.mark.parametrize("case", list(_BPE_CASES))
def test_bpe_compiled_and_interpreted_agree_with_naive(bpe_trained, case):
    # train_bpe picks one of the two by job size; check both against the oracle.
    text, path, specials, (nv, nm), _ = bpe_trained[case]
    counts = bpe.count_pretokens(str(path), specials)
    for compiled in (False, True):
        if not compiled and case == "shakespeare_1mb":
            continue                                  # interpreted on 100k positions: slow
        v, m = bpe.train_from_counts(counts, _BPE_CASES[case][1], specials, compiled=compiled)
        assert (v, m) == (nv, nm), f"compiled={compiled}"


def test_bpe_parallel_counting_matches_single_process(tmp_path, monkeypatch):
    # Tiny chunks force many cuts: at special tokens, and (in the text without any) at
    # safe spaces. Two worker processes must count exactly what one process counts.
    monkeypatch.setattr(bpe, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(bpe, "_BOUNDARY_WINDOW", 64)
    for text, specials in [(_bpe_special_text(), [_BPE_EOT, "<|eot|>", "<|eot|><|eot|>"]),
                           (_bpe_unicode_text() + " plain words " * 300, [])]:
        path = tmp_path / "c.txt"
        path.write_text(text, encoding="utf-8")
        whole = collections.Counter()
        alts = sorted(specials, key=len, reverse=True)
        for part in (regex.split("|".join(map(regex.escape, alts)), text) if specials else [text]):
            whole.update(regex.findall(bpe.GPT2_PAT, part))
        bounds = bpe._chunk_bounds(str(path), path.stat().st_size,
                                   [s.encode() for s in specials], 40)
        assert len(bounds) > 10
        assert bpe.count_pretokens(str(path), specials, num_workers=2) == whole


# -----------------------------------------------------------------------------
# Tokenizer on the trained vocabularies

@pytest.mark.parametrize("case", list(_BPE_CASES))
def test_bpe_roundtrip_and_streaming(bpe_trained, case, monkeypatch, tmp_path):
    text, path, specials, _, (vocab, merges) = bpe_trained[case]
    tok = bpe.Tokenizer(vocab, merges, specials)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    if specials:                    # each special token, longest first, is one id
        alts = sorted(specials, key=len, reverse=True)
        n_special = len(regex.findall("|".join(map(regex.escape, alts)), text))
        special_ids = {i for i, b in vocab.items() if b in {s.encode() for s in specials}}
        assert sum(i in special_ids for i in ids) == n_special
        assert n_special > 0 or case != "specials"
    # Stream in pieces of 7 characters with a small batch so that many cuts happen.
    monkeypatch.setattr(bpe, "_STREAM_CHARS", 256)
    pieces = (text[i:i + 7] for i in range(0, len(text), 7))
    assert list(tok.encode_iterable(pieces)) == ids
    # save / from_files round trip (tokens with spaces and newlines included).
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    again = bpe.Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", specials)
    assert again.vocab == tok.vocab and again.merges == tok.merges
    assert again.encode(text) == ids


# -----------------------------------------------------------------------------
# GPT-2 exactness. Expected ids were produced once (2026-11-21) by tiktoken with an
# Encoding built from the same gpt2_vocab.json / gpt2_merges.txt (GPT-2 pattern,
# <|endoftext|> = 50256), and agreed with Hugging Face tokenizers loaded from the same
# files. Each row: text, ids with <|endoftext|> special, ids with it as plain text.

_BPE_GPT2_CASES = [
    ("Hello, world! This is GPT-2's tokenizer.",
     [15496, 11, 995, 0, 770, 318, 402, 11571, 12, 17, 338, 11241, 7509, 13],
     [15496, 11, 995, 0, 770, 318, 402, 11571, 12, 17, 338, 11241, 7509, 13]),
    ('héllo wörld: naïve café, Ελληνικά, русский текст, 日本語のテキスト, 中文字符, 한국어',
     [71, 2634, 18798, 266, 30570, 335, 25, 41492, 40304, 11, 7377, 243, 39377, 39377, 138, 115,
      26180, 29945, 43000, 138, 105, 11, 220, 21169, 35072, 21727, 21727, 31583, 18849, 140, 117,
      220, 20375, 16843, 31583, 21727, 20375, 11, 10545, 245, 98, 17312, 105, 45739, 252, 5641,
      24336, 25084, 43302, 11, 220, 40792, 23877, 229, 27764, 245, 163, 105, 99, 11, 220, 47991,
      250, 166, 113, 255, 168, 244, 112],
     [71, 2634, 18798, 266, 30570, 335, 25, 41492, 40304, 11, 7377, 243, 39377, 39377, 138, 115,
      26180, 29945, 43000, 138, 105, 11, 220, 21169, 35072, 21727, 21727, 31583, 18849, 140, 117,
      220, 20375, 16843, 31583, 21727, 20375, 11, 10545, 245, 98, 17312, 105, 45739, 252, 5641,
      24336, 25084, 43302, 11, 220, 40792, 23877, 229, 27764, 245, 163, 105, 99, 11, 220, 47991,
      250, 166, 113, 255, 168, 244, 112]),
    ('emoji 🙂🚀👍🏽 and 👨\u200d👩\u200d👧 family, flags 🇫🇷',
     [368, 31370, 32485, 8582, 248, 222, 41840, 235, 8582, 237, 121, 290, 50169, 101, 447, 235,
      41840, 102, 447, 235, 41840, 100, 1641, 11, 9701, 12520, 229, 104, 8582, 229, 115],
     [368, 31370, 32485, 8582, 248, 222, 41840, 235, 8582, 237, 121, 290, 50169, 101, 447, 235,
      41840, 102, 447, 235, 41840, 100, 1641, 11, 9701, 12520, 229, 104, 8582, 229, 115]),
    ('combining: é ä ñ कि',
     [24011, 3191, 25, 304, 136, 223, 257, 136, 230, 299, 136, 225, 28225, 243, 11976, 123],
     [24011, 3191, 25, 304, 136, 223, 257, 136, 230, 299, 136, 225, 28225, 243, 11976, 123]),
    ('   leading spaces\n\n\ttabs\t\tand\r\nCRLF   trailing   ',
     [220, 220, 3756, 9029, 628, 197, 8658, 82, 197, 197, 392, 201, 198, 34, 7836, 37, 220, 220,
      25462, 220, 220, 220],
     [220, 220, 3756, 9029, 628, 197, 8658, 82, 197, 197, 392, 201, 198, 34, 7836, 37, 220, 220,
      25462, 220, 220, 220]),
    ("I'll we've they're she's don't I'd I'm YOU'RE it'S",
     [40, 1183, 356, 1053, 484, 821, 673, 338, 836, 470, 314, 1549, 314, 1101, 7013, 6, 2200, 340,
      6, 50],
     [40, 1183, 356, 1053, 484, 821, 673, 338, 836, 470, 314, 1549, 314, 1101, 7013, 6, 2200, 340,
      6, 50]),
    ('digits 1234567890 3.14159 1,000,000 2026-11-21 0x1F',
     [12894, 896, 17031, 2231, 30924, 3829, 513, 13, 1415, 19707, 352, 11, 830, 11, 830, 1160,
      2075, 12, 1157, 12, 2481, 657, 87, 16, 37],
     [12894, 896, 17031, 2231, 30924, 3829, 513, 13, 1415, 19707, 352, 11, 830, 11, 830, 1160,
      2075, 12, 1157, 12, 2481, 657, 87, 16, 37]),
    ('Hello<|endoftext|>World <|endoftext|> again<|endoftext|><|endoftext|>',
     [15496, 50256, 10603, 220, 50256, 757, 50256, 50256],
     [15496, 27, 91, 437, 1659, 5239, 91, 29, 10603, 1279, 91, 437, 1659, 5239, 91, 29, 757, 27,
      91, 437, 1659, 5239, 91, 6927, 91, 437, 1659, 5239, 91, 29]),
    ('',
     [],
     []),
    ('\n',
     [198],
     [198]),
    ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
     [24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794],
     [24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794]),
    ('   ',
     [220, 220, 220],
     [220, 220, 220]),
    ('<|endoftext|>',
     [50256],
     [27, 91, 437, 1659, 5239, 91, 29]),
]


@pytest.fixture(scope="module")
def bpe_gpt2():
    _bpe_need(_BPE_GPT2_VOCAB)
    special = bpe.Tokenizer.from_files(_BPE_GPT2_VOCAB, _BPE_GPT2_MERGES, [_BPE_EOT])
    plain = bpe.Tokenizer.from_files(_BPE_GPT2_VOCAB, _BPE_GPT2_MERGES)
    return special, plain


@pytest.mark.parametrize("text,ids_special,ids_plain", _BPE_GPT2_CASES)
def test_bpe_gpt2_exact_ids(bpe_gpt2, text, ids_special, ids_plain):
    special, plain = bpe_gpt2
    assert special.encode(text) == ids_special
    assert plain.encode(text) == ids_plain
    assert special.decode(ids_special) == text and plain.decode(ids_plain) == text
    assert list(special.encode_iterable(iter(text.splitlines(keepends=True)))) == ids_special


def test_bpe_gpt2_special_token_declared_or_not(bpe_gpt2):
    special, plain = bpe_gpt2
    assert special.encode(_BPE_EOT) == [50256]
    assert plain.encode(_BPE_EOT) == [27, 91, 437, 1659, 5239, 91, 29]   # < | end of text | >
    assert len(special.vocab) == 50257 and len(special.merges) == 50000


def test_bpe_overlapping_special_tokens_longest_first():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = bpe.Tokenizer(vocab, [], ["<|eot|>", "<|eot|><|eot|>"])
    one, two = tok._special_ids["<|eot|>"], tok._special_ids["<|eot|><|eot|>"]
    assert {one, two} == {256, 257}               # appended to the vocab
    assert tok.encode("a<|eot|><|eot|><|eot|>b") == [ord("a"), two, one, ord("b")]
    assert tok.decode([two, one]) == "<|eot|>" * 3


def test_bpe_decode_malformed_utf8_becomes_replacement_char():
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)}, [])
    assert tok.decode([0xE6, 0x97]) == "\ufffd"
    assert tok.decode([ord("a"), 0xFF, ord("b")]) == "a\ufffdb"


# -----------------------------------------------------------------------------
# Constant-memory streaming

_BPE_STREAM_SCRIPT = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
import bpe                                   # bpe only: no torch in this process

def field(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

tok = bpe.Tokenizer.from_files(sys.argv[2], sys.argv[3], ["<|endoftext|>"])

def stream():
    n, h = 0, 0
    with open(sys.argv[4], encoding="utf-8") as f:
        for i in tok.encode_iterable(f):
            n += 1
            h = (h * 1000003 + i) % (1 << 61)
    return n, h

first = stream()                              # warm-up: caches and allocator pools fill up
limit = field("VmSize") + (1 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    bytearray(8 << 20)                        # the cap is real: 8 MB more cannot be had
    print("cap not enforced")
    sys.exit(1)
except MemoryError:
    pass
second = stream()                             # the whole 5 MB file again, under the cap
print(first[0], first == second, field("VmRSS") // 1024, field("VmSize") // 1024)
"""


def test_bpe_encode_iterable_streams_5mb_under_address_space_cap():
    """RLIMIT_AS caps virtual address space, which is always far above RSS (shared
    libraries, reserved arenas), so a cap at "RSS + 1 MB" would forbid any allocation at
    all. Instead the child process streams the 5 MB file once to warm up, then caps its
    address space at its current VmSize + 1 MB and streams the whole file again. Holding
    the text (5 MB) or the ids (1.5M Python ints) would need several MB more and raise
    MemoryError, so passing shows memory does not grow with the file."""
    _bpe_need(_BPE_SHAKESPEARE)
    _bpe_need(_BPE_GPT2_VOCAB)
    r = subprocess.run([sys.executable, "-c", _BPE_STREAM_SCRIPT, str(_BPE_REPO),
                        str(_BPE_GPT2_VOCAB), str(_BPE_GPT2_MERGES), str(_BPE_SHAKESPEARE)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    n, same = r.stdout.split()[:2]
    assert int(n) > 1_000_000 and same == "True"


# -----------------------------------------------------------------------------
# encode_file

def test_bpe_encode_file_matches_encode(bpe_trained, tmp_path, monkeypatch):
    text, path, specials, _, (vocab, merges) = bpe_trained["specials"]
    tok = bpe.Tokenizer(vocab, merges, specials)
    monkeypatch.setattr(bpe, "_ENCODE_CHUNK", 1000)     # many chunks over 2 processes
    out = tmp_path / "ids.npy"
    n = bpe.encode_file(tok, str(path), str(out), num_workers=2, progress=False)
    arr = np.load(out, mmap_mode="r")
    assert arr.dtype == np.uint16 and n == len(arr)
    assert arr.tolist() == tok.encode(text)
    assert [p.name for p in tmp_path.iterdir()] == ["ids.npy"]   # no temp files left


def test_bpe_encode_file_uint32_for_large_vocab(tmp_path):
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[70000] = b"ab"
    tok = bpe.Tokenizer(vocab, [(b"a", b"b")])
    src = tmp_path / "t.txt"
    src.write_text("abcab", encoding="utf-8")
    n = bpe.encode_file(tok, str(src), str(tmp_path / "o.npy"), num_workers=1, progress=False)
    arr = np.load(tmp_path / "o.npy")
    assert arr.dtype == np.uint32 and arr.tolist() == [70000, ord("c"), 70000] and n == 3


# -----------------------------------------------------------------------------
# Bad input: one clear sentence each

def test_bpe_errors_training(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("hello world", encoding="utf-8")
    with pytest.raises(ValueError, match="smaller than 256 bytes \\+ 1 special"):
        bpe.train_bpe(str(good), 256, [_BPE_EOT])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bpe.train_bpe(str(tmp_path / "missing.txt"), 300)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        bpe.train_bpe(str(empty), 300)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"caf\xc3\xa9 ok \xff oops")
    with pytest.raises(ValueError, match="not valid UTF-8.*byte offset 9"):
        bpe.train_bpe(str(bad), 300)
    with pytest.raises(ValueError, match="empty string"):
        bpe.train_bpe(str(good), 300, ["<a>", ""])


def test_bpe_errors_tokenizer_files(tmp_path):
    tok = bpe.Tokenizer({i: bytes([i]) for i in range(256)} | {256: b"ab", 257: b"abc"},
                        [(b"a", b"b"), (b"ab", b"c")])
    with pytest.raises(ValueError, match="token id 999: the vocab has ids 0..257"):
        tok.decode([97, 999])
    v, m = tmp_path / "vocab.json", tmp_path / "merges.txt"
    tok.save(v, m)
    lines = m.read_text(encoding="utf-8").splitlines()
    m.write_text("\n".join(lines + ["a b c"]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"line {len(lines) + 1}: expected 'left right'"):
        bpe.Tokenizer.from_files(v, m)
    m.write_text("\n".join(lines + ["b c"]) + "\n", encoding="utf-8")   # 'bc' is not in vocab
    with pytest.raises(ValueError, match=f"line {len(lines) + 1}: token 'bc' is not in the "
                                         "vocab file; vocab and merges disagree"):
        bpe.Tokenizer.from_files(v, m)
    v.write_text('{"a": 0,\n "b": }', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        bpe.Tokenizer.from_files(v, m)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bpe.Tokenizer.from_files(tmp_path / "nope.json", m)


def test_bpe_cli_errors_exit_2_without_traceback_or_files(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("hello world", encoding="utf-8")
    out = tmp_path / "tok"
    cases = [["train", str(good), "--vocab-size", "100", "--out", str(out)],
             ["train", str(tmp_path / "missing.txt"), "--vocab-size", "300", "--out", str(out)],
             ["encode", str(good), "--tokenizer", str(tmp_path / "none"), "--out",
              str(tmp_path / "ids.npy")]]
    for args in cases:
        r = subprocess.run([sys.executable, str(_BPE_REPO / "bpe.py")] + args,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.txt"]


def test_bpe_cli_train_then_encode(tmp_path):
    src = _bpe_need(_BPE_TINYSTORIES)
    out = tmp_path / "tok"
    r = subprocess.run([sys.executable, str(_BPE_REPO / "bpe.py"), "train", str(src),
                        "--vocab-size", "400", "--special-tokens", _BPE_EOT, "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "longest token" in r.stdout and "peak RSS" in r.stdout
    r = subprocess.run([sys.executable, str(_BPE_REPO / "bpe.py"), "encode", str(src),
                        "--tokenizer", str(out), "--out", str(tmp_path / "ids.npy")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "bytes/token" in r.stdout and "MB/s" in r.stdout
    tok = bpe.Tokenizer.from_files(out / "vocab.json", out / "merges.txt", [_BPE_EOT])
    text = src.read_text(encoding="utf-8")
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(text)
    assert tok.vocab == bpe.train_bpe(str(src), 400, [_BPE_EOT])[0]
