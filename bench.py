"""Every comparison of this project with other tools, and the tables docs/results.md quotes.

    python bench.py              # the tables docs/results.md quotes: train, cold, encode, step, head, generate
    python bench.py train        # train_bpe, `bpe.py train`, HF tokenizers, rustbpe: 50 and 200 MB, vocab 32k
    python bench.py train --sizes 50,200,2000   # adds the 2 GB corpus (one run, no HF)
    python bench.py train --input FILE --vocab-size 10000   # the same table on one file
    python bench.py cold         # small and large jobs with an empty numba cache, then twice with it filled
    python bench.py encode       # Tokenizer.encode, then encode_file on 50 MB (--encode-mb), vs tiktoken
    python bench.py step [train.py flags]  # the step vs HF's LlamaForCausalLM; flags replace the default
    python bench.py head         # the fused head + loss alone: its chunk count, time and peak memory; a step's peak
    python bench.py generate     # generation, batch 1 and 64: plain (cached or not), fast, HF's static cache
    python bench.py gpu          # every GPU figure in one command (--budget 480 s), ending in docs/results.md's table
    python bench.py gpu --cpu    # the same rehearsed at tiny sizes on the CPU, the GPU-only parts skipped

The scale corpus (section 0) is web-like text built with a seed from ../shared. Peers (the tools
compared against) are imported only when their table runs. Tools take turns, and a repeated table
reports medians, as a shared machine's load changes under a benchmark. Training, cold starts and
encode_file run as whole processes, measured from outside: wall time and peak memory (tree_pss_mb).
"""
import argparse
import datetime
import functools
import gc
import inspect
import json
import os
import pickle
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest.mock
import warnings
from collections import Counter
from pathlib import Path

import cli  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("bench.py")
import numpy as np
import regex
import torch
import torch.nn.functional as F

import accounting
import bpe
import config
import data
import export
import fast_cpu
import fast_gpu
import fused_head
import kernels
import model
import train
from cli import DataError, Parser, UsageError, counted, end_quietly_on_closed_pipe, error_line, exit_code, user_path
from config import MIN_TEXT_VOCAB
from files import atomic_file, unreadable
from machine import allow_many_compiles, memory_bytes, synchronizer, torch_settings, usable_cores
from model import TransformerLM, generate

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
SHAKESPEARE = SHARED / "data" / "shakespeare.txt"
SEEDS = SHARED / "reference" / "seeds"  # the course notes in Chinese
ENGLISH_SOURCES = [SHAKESPEARE, SHARED / "reference" / "tinystories_sample.txt",  # the scale corpus's words
                   SHARED / "reference" / "cs336_assignment1_handout.txt"]
EOT = data.EOT


# ----------------------------------------------------------------------------
# Helpers: peers, timings, child processes

def peer(module):
    """Import an optional peer, or None after one line saying how to install it (pip's name is the module's)."""
    try:
        return __import__(module)
    except ImportError:
        print(f"  ({module} is not installed, so it is left out: pip install {module})")
        return None


def need_file(path, what):
    if why := unreadable(path):
        raise UsageError(f"{what} {path}{why} (--input names a text of yours; the rest is in ../shared).")
    return str(path)


def need_text(path, what, block=1 << 24):
    """need_file, and its text not empty and UTF-8, read 16 MB at a time: a bad byte is one sentence naming its
    offset before minutes of measuring, not a child process's traceback (naming a copy of the text's start)."""
    if os.path.getsize(need_file(path, what)) == 0:  # train_bpe refuses it in a child (cold's names its copy)
        raise UsageError(f"{what} {path} is empty; give it some text.")
    with open(path, "rb") as f:
        text = data.FileText(f, path)
        if (bad := data.bad_utf8_offset(text, block)) is not None:
            raise UsageError(f"{what} {path} is not valid UTF-8: bad byte 0x{text[bad]:02x} at byte offset {bad}; "
                             "re-save the file as UTF-8.")
    return os.path.abspath(path)  # the children run in the clone's folder


def seed_files():  # the course notes in Chinese: the scale corpus's CJK runs and a row of the encode table
    return sorted(SEEDS.glob("*.txt")) or [Path(need_file(SEEDS / "*.txt", "corpus source"))]  # none: need_file says


def med(xs, unit="s"):
    """'a / b / c s (median m)'."""
    return " / ".join(f"{x:.2f}" for x in xs) + f" {unit} (median {statistics.median(xs):.2f})"


def take_turns(calls, rounds, sync=lambda: None):
    """The calls {name: call} run in turn, round after round, so that the machine's load weighs on
    each alike; sync() drains a GPU's queue around each. -> {name: [seconds]}, {name: [results]}."""
    times, results = {name: [] for name in calls}, {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            sync()
            t0 = time.perf_counter()
            results[name].append(call())
            sync()
            times[name].append(time.perf_counter() - t0)
    return times, results


def tree_pss_mb(pid):
    """The summed Pss in MB of pid and all its descendants (forked workers and their children):
    Pss splits a shared page among its processes, where their RSS would count it in each."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            pss = next(int(x.split()[1]) for x in f if x.startswith(b"Pss:")) / 1024
        kids = [int(k) for t in os.listdir(f"/proc/{pid}/task")
                for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except (OSError, StopIteration):
        return 0.0  # it ended while we looked
    return pss + sum(map(tree_pss_mb, kids))


# Python code run by run_measured starts with this, sets t0 just before its timed call and ends with
# report(): its last line, a JSON dict with import_s, the seconds before t0 (`import bpe` loads numba).
CHILD_PRELUDE = """
import json, time
START = time.perf_counter()
def report(call_s, **extra):
    print(json.dumps({"call_s": call_s, "import_s": t0 - START, **extra}))
"""


def run_measured(argv, env=None, **constants):
    """Run argv as a whole process (cwd: this repo): its wall time, and the peak of its tree's summed Pss
    sampled every 50 ms. argv may be Python code, run in a fresh Python after CHILD_PRELUDE and the
    constants (EOT always), its report merged in: run_measured("t0 = 0; report(1.0)", PATH="a.txt")."""
    if isinstance(argv, str):
        head = "".join(f"{name} = {value!r}\n" for name, value in {"EOT": EOT, **constants}.items())
        argv = [sys.executable, "-c", CHILD_PRELUDE + head + argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0, pss = time.perf_counter(), 0.0
        p = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, env=env)
        while p.poll() is None:
            pss = max(pss, tree_pss_mb(p.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        if p.returncode != 0:  # one sentence: the child's last line (its error, not its traceback), or its signal
            why = err.read().decode(errors="replace").split("\n")
            why = next((line for line in reversed(why) if line.strip()), f"killed by signal {-p.returncode}")
            who = "a Python child" if argv[1] == "-c" else " ".join(map(str, argv[1:3]))
            raise DataError(f"{who} of the benchmark exited {p.returncode}: {why.strip()}")
        report = json.loads(out.read().splitlines()[-1]) if argv[1] == "-c" else {}
    return {**report, "process_s": wall, "pss_mb": pss}


def process_table(runs, call="call"):
    """One row per tool of {tool: [run_measured results]}."""
    print(f"| tool | {call} | whole process | peak Pss, process tree |")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        call_s = med([r["call_s"] for r in rs]) if "call_s" in rs[0] else "-"
        print(f"| {name} | {call_s} | {med([r['process_s'] for r in rs])} | "
              f"{max(r['pss_mb'] for r in rs):,.0f} MB |")


# ----------------------------------------------------------------------------
# 0. The scale corpus: web-like text of any size, built from ../shared and a seed
#
# The handout's real corpora (TinyStories, OpenWebText) are gigabytes and not in ../shared,
# so the scale tables train on text built here. What makes web text hard for a BPE trainer
# is not its bytes but its millions of distinct pre-tokens (typos, names, numbers, URLs,
# other scripts), so the generator mutates real words into a pool of 0.3-3 million distinct
# strings and samples them with a Zipf-like weight: common words stay common, and the tail of
# rare words grows with the corpus (up to 180 MB), as on the web.

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cs336-bench"
CORPUS_VERSION = 1  # bump when the generator changes, so that old cached files are not reused

# Share of the words by kind (the rest are English words and their mutations). A CJK run averages
# ~6 characters of 3 bytes (cut short at its source's end), so 2.5% of the words make ~5% of the bytes.
KINDS = {"number": 0.05, "url": 0.006, "cyrillic": 0.015, "cjk": 0.025, "emoji": 0.006}
CYRILLIC = str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                         "абцдефгхийклмнопярстуввхызАБЦДЕФГХИЙКЛМНОПЯРСТУВВХЫЗ")
ACCENTS = {"a": "àáâäå", "e": "èéêë", "i": "ìíîï", "o": "òóôöø", "u": "ùúûü", "n": "ñ", "c": "ç", "s": "ß"}
PREFIXES = ["", "", "", "", "un", "re", "pre", "anti", "over", "non", "super", "micro", "e-"]
SUFFIXES = ["", "", "", "", "", "s", "ed", "ing", "ly", "er", "ness", "ful", "ism", "ist", "ity",
            "able", "ish", "less", "ment", "'s", "-like", "ify", "ization", "z", "ie", "o"]
TLDS = ["com", "org", "net", "io", "edu", "de", "cn", "ru", "co.uk", "ai", "dev"]
EMOJI = ["😀", "😂", "🥲", "😍", "🤔", "🙄", "😭", "🔥", "✨", "🎉", "❤️", "💯", "🚀", "🙏", "🤖", "🍕",
         "🌍", "📈", "✅", "⚡", "🐍", "🇺🇸", "🇨🇳", "🇷🇺", "🇫🇷"]
PEOPLE = ["👍", "👋", "🙌", "👏", "💪", "🤝", "👩", "👨", "🧑", "🏃", "🧑‍💻", "👩‍🔬"]
SKIN = ["", "\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
ZWJ = ["👨‍👩‍👧", "👨‍👩‍👧‍👦", "👩‍❤️‍👨", "🏳️‍🌈", "🧑‍🤝‍🧑", "👁️‍🗨️", "🐻‍❄️", "❤️‍🔥"]
# What follows a word: mostly a space; punctuation, line breaks and other whitespace sometimes.
SEPARATORS = {" ": 0.80, ", ": 0.06, ". ": 0.05, ".\n": 0.015, ".\n\n": 0.015, "\n": 0.01, "! ": 0.005,
              "? ": 0.005, ": ": 0.005, "; ": 0.003, " - ": 0.003, " (": 0.002, ") ": 0.002,
              "\" ": 0.003, " \"": 0.003, "  ": 0.004, "\t": 0.002, "... ": 0.003, "n't ": 0.004,
              "'ll ": 0.002, "'re ": 0.002, "\r\n": 0.002, ". \u00a0": 0.001}
DOC_WORDS = 400  # mean words per document; documents end with <|endoftext|>


def zipf(pool, a=1.05, offset=3.0):
    """A sampler (rng, n) -> n strings of pool, the i-th with weight 1 / (i + offset)^a."""
    cum = np.cumsum(1.0 / (np.arange(len(pool)) + offset) ** a)
    return lambda rng, n: pool[np.searchsorted(cum, rng.random(n) * cum[-1])]


def _typos(rng, words, n):
    """n words with one typo each: two letters swapped, one dropped, inserted or changed, or accented."""
    base = words[rng.integers(0, len(words), n)].tolist()
    op, pos, r = rng.integers(0, 5, n).tolist(), rng.random(n).tolist(), rng.random(n).tolist()
    out = []
    for w, o, p, r0 in zip(base, op, pos, r):
        k, c = int(p * len(w)), chr(ord("a") + int(r0 * 26))
        if o == 0 and k + 1 < len(w):
            w = w[:k] + w[k + 1] + w[k] + w[k + 2:]
        elif o == 1 and len(w) > 3:
            w = w[:k] + w[k + 1:]
        elif o in (2, 3):  # a letter inserted, or one changed
            w = w[:k] + c + w[k + o - 2:]
        elif w[k:k + 1] in ACCENTS:
            acc = ACCENTS[w[k]]
            w = w[:k] + acc[int(r0 * len(acc))] + w[k + 1:]
        out.append(w)
    return out


def _mutate(rng, words, n):
    """n words, or words with a typo, between a prefix and a suffix (either often empty), sometimes
    capitalised. Typos are made for a tenth as many words: a pool of millions stays cheap to build."""
    core = words.tolist() + _typos(rng, words, n // 10 + 1)
    pick = lambda xs: np.array(xs, dtype=object)[rng.integers(0, len(xs), n)]
    out = pick(PREFIXES) + pick(core) + pick(SUFFIXES)  # object arrays: + joins the strings pairwise
    return [w.capitalize() if c < 0.12 else w.upper() if c < 0.14 else w for w, c in zip(out, rng.random(n))]


def _word_pool(rng, english, n_mutated):
    """English words by frequency (the head of the Zipf curve), then n_mutated distinct
    mutations of them in random order (its tail). Returns a numpy array of str."""
    counts = Counter(regex.findall(r"[A-Za-z]+(?:'[a-z]+)?", english))
    real = sorted(counts, key=lambda w: (-counts[w], w))
    pool = dict.fromkeys(real)
    words = np.array([w.lower() for w in real if len(w) > 1], dtype=object)
    while len(pool) < len(real) + n_mutated:  # duplicates are dropped, so top up
        pool.update(dict.fromkeys(_mutate(rng, words, len(real) + n_mutated - len(pool))))
    return np.array(list(pool), dtype=object)


def _cjk_runs(rng, runs, n):
    """n runs of Chinese text cut from the notes' runs (1-24 characters, punctuation included)."""
    lengths = np.array([len(r) for r in runs])
    which = np.searchsorted(np.cumsum(lengths), rng.random(n) * lengths.sum())
    size = rng.integers(1, 25, n)
    start = (rng.random(n) * lengths[which]).astype(int)
    return [r[s:s + k] for r, s, k in zip(runs[which].tolist(), start.tolist(), size.tolist())]


def _numbers(rng, n):
    """Integers, years, decimals, prices, percentages, times, thousands separators."""
    v, kind = rng.zipf(1.3, n) % 10_000_000, rng.integers(0, 8, n)
    year, cents = rng.integers(1600, 2031, n), rng.integers(0, 100, n)
    forms = [lambda a, y, c: str(a), lambda a, y, c: str(y), lambda a, y, c: f"{a % 1000}.{c}",
             lambda a, y, c: f"${a % 5000}.{c:02d}", lambda a, y, c: f"{c}%",
             lambda a, y, c: f"{a % 24}:{c % 60:02d}", lambda a, y, c: f"{a:,}",
             lambda a, y, c: f"€{a % 300},{c:02d}"]  # one function per form: only the chosen string is built
    return [forms[k](a, y, c) for k, a, y, c in zip(kind.tolist(), v.tolist(), year.tolist(), cents.tolist())]


def _urls(rng, sample, n):
    w = sample(rng, 4 * n).reshape(n, 4).tolist()
    tld, q = rng.integers(0, len(TLDS), n).tolist(), rng.integers(0, 100_000, n).tolist()
    return [f"https://www.{a.lower()}.{TLDS[t]}/{b}/{c}-{d}" + (f"?id={i}" if i % 3 == 0 else "")
            for (a, b, c, d), t, i in zip(w, tld, q)]


def _emoji(rng, n):
    kind, a, b = rng.integers(0, 4, n).tolist(), rng.integers(0, 1000, n).tolist(), rng.integers(1, 4, n).tolist()
    one = [lambda i: EMOJI[i % len(EMOJI)], lambda i: PEOPLE[i % len(PEOPLE)] + SKIN[i % len(SKIN)],
           lambda i: ZWJ[i % len(ZWJ)], lambda i: EMOJI[i % len(EMOJI)] + PEOPLE[i % len(PEOPLE)]]
    return [one[k](i) * r for k, i, r in zip(kind, a, b)]


def _chunk(rng, sample, sample_cyr, runs, n):
    """n words with their separators, as one string."""
    names = ["english", *KINDS]
    kind = rng.choice(len(names), n, p=[1 - sum(KINDS.values()), *KINDS.values()])
    words = np.empty(n, dtype=object)
    for k, name in enumerate(names):
        where = np.flatnonzero(kind == k)
        m = len(where)
        made = {"english": lambda: sample(rng, m),
                "cyrillic": lambda: [w.translate(CYRILLIC) for w in sample_cyr(rng, m)],
                "number": lambda: _numbers(rng, m), "url": lambda: _urls(rng, sample, m),
                "cjk": lambda: _cjk_runs(rng, runs, m), "emoji": lambda: _emoji(rng, m)}[name]()
        words[where] = np.array(list(made) + [None], dtype=object)[:m]  # keep numpy from splitting strs
    seps = np.array(list(SEPARATORS), dtype=object)[
        rng.choice(len(SEPARATORS), n, p=np.array(list(SEPARATORS.values())) / sum(SEPARATORS.values()))]
    seps[rng.random(n) < 1 / DOC_WORDS] = "\n" + EOT
    out = np.empty(2 * n, dtype=object)  # words and separators interleaved: one join, no string per pair
    out[0::2], out[1::2] = words, seps
    return "".join(out.tolist())


def corpus_path(megabytes, seed=0, cache=CACHE):  # where scale_corpus keeps a corpus
    return Path(cache) / f"web-v{CORPUS_VERSION}-{megabytes:g}MB-seed{seed}.txt"


def scale_corpus(megabytes, seed=0, cache=CACHE):
    """A web-like UTF-8 corpus of `megabytes` MB (10^6 bytes, cut after a space or newline; documents end with
    <|endoftext|>), built once per (size, seed), the same bytes for the same seed, and kept in `cache`:
    scale_corpus(50) -> ~/.cache/cs336-bench/web-v1-50MB-seed0.txt"""
    path = corpus_path(megabytes, seed, cache)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    target = int(megabytes * 1_000_000)
    rng = np.random.default_rng(seed)
    read = lambda paths: "\n".join(Path(need_file(p, "corpus source")).read_text(encoding="utf-8") for p in paths)
    english = read(ENGLISH_SOURCES)
    chinese = read(seed_files())
    pool = _word_pool(rng, english, n_mutated=min(3_000_000, 300_000 + 15_000 * int(megabytes)))
    sample, sample_cyr = zipf(pool), zipf(pool, a=0.9)  # Cyrillic: a flatter curve
    runs = np.array([r for r in regex.findall(r"[\p{Han}\p{P}]+", chinese) if regex.search(r"\p{Han}", r)],
                    dtype=object)
    with atomic_file(path) as f:  # a corpus cut short by Ctrl-C is never found and used next time
        while target > 0:  # target: the bytes still to write
            blob = _chunk(rng, sample, sample_cyr, runs, 1_000_000).encode("utf-8")
            if len(blob) > target:  # the last piece: cut after its last space or newline, a character boundary
                blob = blob[:max(blob.rfind(b" ", 0, target), blob.rfind(b"\n", 0, target)) + 1]
                target = len(blob)
            f.write(blob)
            target -= len(blob)
    return path


def distinct_pretokens(path):
    """Distinct GPT-2 pre-tokens in the corpus's documents (as train_bpe counts them), kept next to the file."""
    memo = Path(str(path) + ".pretokens")
    if memo.is_file() and memo.stat().st_mtime >= Path(path).stat().st_mtime:
        return int(memo.read_text())
    n = len({t for doc in documents(path) for t in bpe.pretokenize(doc)})
    memo.write_text(str(n))
    return n


# ----------------------------------------------------------------------------
# 1. BPE training: this project, Hugging Face tokenizers, rustbpe (whole processes); cold starts

def documents(path, block=1 << 24):
    """The documents of a text file, between <|endoftext|> markers, read 16M characters at a time."""
    rest = ""
    with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n as it is
        for piece in iter(lambda: f.read(block), ""):
            docs = (rest + piece).split("<|endoftext|>")
            rest = docs.pop()
            yield from docs
    yield rest


DOCUMENTS_SOURCE = inspect.getsource(documents)  # read now: the file may change during a long run


TRAINERS = {
    "bpe.train_bpe": """
import bpe
t0 = time.perf_counter()
vocab, merges = bpe.train_bpe(PATH, VOCAB, [EOT])
report(time.perf_counter() - t0, merges=len(merges), longest=max(map(len, vocab.values())))
""",
    "python bpe.py train": None,  # the command line itself, see train_run
    "HF tokenizers BpeTrainer": """
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
t0 = time.perf_counter()
hf = Tokenizer(models.BPE())
hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
hf.train([PATH], trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
report(time.perf_counter() - t0)
""",
    # rustbpe has no special tokens: it gets the documents between them, streamed (by bench's
    # documents(), its source pasted here), and one id fewer, so both learn the same merges.
    "rustbpe": """
import rustbpe
t0 = time.perf_counter()
rustbpe.Tokenizer().train_from_iterator(documents(PATH), VOCAB - 1, pattern=GPT2_PAT)
report(time.perf_counter() - t0)
""",
}
PEERS = {"HF tokenizers BpeTrainer": "tokenizers", "rustbpe": "rustbpe"}  # the modules they import


def train_run(name, path, vocab_size, out_dir):
    if name == "python bpe.py train":
        return run_measured([sys.executable, "bpe.py", "train", str(path), "--vocab-size", str(vocab_size),
                             "--special-tokens", EOT, "--out", str(out_dir)])
    return run_measured(DOCUMENTS_SOURCE + TRAINERS[name], PATH=str(path), VOCAB=vocab_size, GPT2_PAT=bpe.GPT2_PAT)


def train_table(path, vocab_size, repeats, hf_runs):
    """One table: every tool on one corpus, whole processes taking turns, HF in the first hf_runs rounds."""
    print(f"## BPE training: {Path(path).name} ({os.path.getsize(path) / 1e6:.1f} MB), vocab {vocab_size:,}, "
          f"{EOT} special; each tool a fresh process, {counted(repeats, 'run')} taking turns (HF tokenizers "
          f"{min(hf_runs, repeats)})", flush=True)
    runs = {n: [] for n in TRAINERS if (hf_runs or not n.startswith("HF")) and (n not in PEERS or peer(PEERS[n]))}
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for name in [n for n in runs if i < hf_runs or not n.startswith("HF")]:
                runs[name].append(train_run(name, path, vocab_size, d))
        cli_merges = len(bpe._read_merges_file(Path(d, "merges.txt"))[0])  # its merges (not the #version line)
    process_table(runs, "training call")
    last = runs["bpe.train_bpe"][-1]
    print(f"bpe.train_bpe: {last['merges']} merges, longest token {last['longest']} bytes; "
          f"python bpe.py train: {cli_merges} merges in merges.txt")
    if "rustbpe" in runs:
        ours, theirs = (statistics.median(r["process_s"] for r in runs[n]) for n in ("bpe.train_bpe", "rustbpe"))
        print(f"whole process, bpe.train_bpe / rustbpe: {ours / theirs:.2f} (medians)")
    print(flush=True)


def bench_train(args):
    if args.input:
        return train_table(need_text(args.input, "corpus"), args.vocab_size, args.repeats, args.repeats)
    # numba compiles bpe.py's loops on a fresh checkout and caches them on disk; one untimed
    # run fills that cache, so the table times what every later run costs (`cold` times the rest).
    train_run("bpe.train_bpe", scale_corpus(5), args.vocab_size, tempfile.gettempdir())
    print("(one untimed bpe.train_bpe run on the 5 MB scale corpus first: numba's disk cache is warm)")
    for mb in args.sizes:
        t0 = time.perf_counter()
        path = scale_corpus(mb)
        print(f"# scale corpus {mb:g} MB, seed 0: {path} ({distinct_pretokens(path):,} distinct GPT-2 "
              f"pre-tokens; built or found in {time.perf_counter() - t0:.0f} s)")
        # the 2 GB run is long: one run, no HF; HF once above 50 MB
        repeats, hf_runs = (1, 0) if mb > 500 else (args.repeats, 1 if mb > 50 else args.repeats)
        train_table(path, args.vocab_size, repeats, hf_runs)


# The cold table's jobs: {job: (its label, its child)}.
COLD_BYTES, COLD_VOCAB = 133_120, 500  # the small jobs: the first 133 KB of a text (whole lines), vocab 500
COLD_JOBS = {"train": ("train_bpe, {}, vocab {:,}", TRAINERS["bpe.train_bpe"]),
             "encode": ("GPT-2 Tokenizer.from_files + encode, {}", """
import bpe
t0 = time.perf_counter()
bpe.Tokenizer.from_files(*FILES, [EOT]).encode(open(PATH, encoding="utf-8").read())
report(time.perf_counter() - t0)
""")}


def bench_cold(args):
    """What a student's first run costs: each job in three fresh processes sharing a new numba cache
    directory, empty for the first (a fresh clone); the difference is the one-off compile."""
    text = Path(need_text(args.input or SHAKESPEARE, "corpus"))  # the user's own flag is named first
    files = [str(p) for p in data.gpt2_files()]  # the course's copies, the clone's data cache, or fetched
    print("## Cold start: each job in a fresh process with a new, empty numba cache directory, "
          "then twice more with what that run saved there; 'call' is around the call, after `import bpe`")
    print("| job | empty cache: call (import bpe) | warm cache: call | whole process, empty / warm | "
          "first compile costs |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        jobs, web = [], "the scale corpus (web-like: more distinct words)"
        for i, (name, source) in enumerate([(text.name, text), (web, scale_corpus(5))]):
            cut, small = source.read_bytes()[:COLD_BYTES], Path(d, f"{i}.txt")
            small.write_bytes(cut[:cut.rindex(b"\n") + 1] if b"\n" in cut else cut)  # whole lines
            where = f"{small.stat().st_size / 1e3:.0f} KB of {name}"
            jobs += [(job, where, small, COLD_VOCAB) for job in COLD_JOBS]
        jobs += [("train", "5 MB scale corpus", scale_corpus(5), 32_000),
                 ("encode", f"{text.name} ({text.stat().st_size / 1e6:.1f} MB)", text, 0)]
        for job, where, path, vocab in jobs:
            with tempfile.TemporaryDirectory() as cache:
                cold, *warm = [run_measured(COLD_JOBS[job][1], {**os.environ, "NUMBA_CACHE_DIR": cache}, PATH=str(path),
                                            VOCAB=vocab, FILES=files) for _ in range(3)]
            print(f"| {COLD_JOBS[job][0].format(where, vocab)} | {cold['call_s']:.2f} s ({cold['import_s']:.2f} s) | "
                  f"{med([r['call_s'] for r in warm])} | {cold['process_s']:.2f} / "
                  f"{statistics.median(r['process_s'] for r in warm):.2f} s | "
                  f"{compile_cost(cold['call_s'], [r['call_s'] for r in warm])} |", flush=True)


def compile_cost(cold, warm):
    """The cold call's extra seconds over the warm calls' median, or none where it is within the warm calls' own
    spread: a job that compiles nothing (a small one runs bpe.py's Python loop) printed noise, "-0.10 s", as a cost."""
    cost, spread = cold - statistics.median(warm), max(warm) - min(warm)
    return f"{cost:.2f} s" if cost > spread else f"none measurable ({cost:+.2f} s; warm calls differ by {spread:.2f} s)"


# ----------------------------------------------------------------------------
# 2. Encoding with GPT-2's files: this project vs tiktoken

def stdlib_source(limit=5_000_000):
    """The first `limit` bytes of Python's own standard library (.py files sorted by path,
    site-packages and files that are not UTF-8 left out), so that machines with the same Python have the same text."""
    import sysconfig
    parts, size = [], 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            if size < limit and "site-packages" not in p.parts:
                parts.append(p.read_text(encoding="utf-8"))
                size += len(parts[-1].encode("utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return "".join(parts)


def small_documents(text, size=1000, total=1_400_000):
    """The first `total` characters of text cut at spaces into documents of about `size` characters (bytes, for the
    English text this is given: count bytes of another script with len(doc.encode()))."""
    docs, start = [], 0
    while start < min(len(text), total):
        cut = text.find(" ", start + size)
        cut = len(text) if cut < 0 else cut
        docs.append(text[start:cut])
        start = cut
    return docs


STREAMS = {"CJK paragraphs joined by blank lines": "\n\n".join(["这是一个没有空格的段落。" * 30] * 1000),
           "tab-indented lines": "\tfoo(bar);\n" * 100_000}


def bench_encode(args):
    english = Path(need_text(args.input or SHAKESPEARE, "text")).read_text(encoding="utf-8")  # --input first
    files = [str(p) for p in data.gpt2_files()]  # the course's copies, the clone's data cache, or fetched
    rows = {f"English, {Path(args.input or SHAKESPEARE).name}": [english],
            "Chinese, the notes in reference/seeds": ["".join(p.read_text(encoding="utf-8") for p in seed_files())],
            "Python source, the stdlib's first 5 MB": [stdlib_source()],
            "1 KB documents of the English, one call each": small_documents(english)}
    tiktoken = peer("tiktoken")  # its GPT-2 is built offline from the same vocab file
    ranks = {t: i for i, t in bpe._load_vocab_file(files[0]).items() if t != EOT.encode()} if tiktoken else None
    enc = tiktoken and tiktoken.Encoding(name="gpt2_local", pat_str=bpe.GPT2_PAT, mergeable_ranks=ranks,
                                         special_tokens={EOT: 50256})
    # bpe.py loads its compiled encoder once per process (small jobs alone would not load it):
    # done here, untimed, as tiktoken's import loads its compiled extension.
    bpe.bpe_fast.load_compiled_encoder()
    compared = (" taking turns with tiktoken; ids identical (per document); ratio: our MB/s over tiktoken's" if enc
                else " (tiktoken is not installed: no comparison)")
    print(f"## Encoding with GPT-2's vocab and merges, one thread, a fresh Tokenizer each run, "
          f"{counted(args.repeats, 'run')}{compared}")
    print("| text | MB | calls | Tokenizer.encode | tiktoken.encode | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for name, docs in rows.items():  # one call per document
        times = {"ours": [], "tiktoken": []}
        for _ in range(args.repeats):
            # a fresh Tokenizer each run, built untimed just before it, as a user's would be (built all
            # at once beforehand, with several GPT-2 tables alive, ours measured slower than in use)
            tok = bpe.Tokenizer.from_files(*files, [EOT])
            calls = {"ours": lambda: [tok.encode(doc) for doc in docs]}
            if enc:
                calls["tiktoken"] = lambda: [enc.encode(doc, allowed_special="all") for doc in docs]
            t, ids = take_turns(calls, 1)
            assert ids.get("tiktoken", ids["ours"]) == ids["ours"], "the ids differ from tiktoken's"
            times = {who: times[who] + t.get(who, []) for who in times}
        mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
        speed = {who: med([mb / t for t in ts], "MB/s") if ts else "-" for who, ts in times.items()}
        ratio = f"{statistics.median(times['tiktoken']) / statistics.median(times['ours']):.2f}x" if enc else "-"
        print(f"| {name} | {mb:.3g} | {len(docs):,} | {speed['ours']} | {speed['tiktoken']} | {ratio} |", flush=True)
    # streams with few places to cut (encode_iterable stays linear), and plain English fed line by line
    for name, text in {**STREAMS, "the English's lines": english[:1_000_000]}.items():
        t, ids = take_turns({"encode": lambda: tok.encode(text),
                             "encode_iterable": lambda: list(tok.encode_iterable(text.splitlines(keepends=True)))}, 3)
        mb = len(text.encode("utf-8")) / 1e6  # an --input under 1 MB (or 1M characters of accents) is not "1 MB"
        print(f"encode_iterable on {mb:.3g} MB of {name}: {statistics.median(t['encode_iterable']):.3f} s, encode "
              f"{statistics.median(t['encode']):.3f} s (medians of 3), same ids: "
              f"{ids['encode'] == ids['encode_iterable']}")
    print(flush=True)
    bench_encode_file(args, files, enc)


ENCODE_FILE = {
    "bpe.encode_file, 2 workers": """
import bpe
tok = bpe.Tokenizer.from_files(*FILES, [EOT])
t0 = time.perf_counter()
bpe.encode_file(tok, PATH, OUT, 2, progress=False)
report(time.perf_counter() - t0)
""",
    # encode_ordinary does not treat <|endoftext|> as special, so tiktoken gets the documents
    # between the markers, and the file's markers are taken out of our count to compare.
    "tiktoken encode_ordinary_batch, 2 threads": """
import pickle
enc = pickle.load(open(ENC, "rb"))  # bench_encode's tiktoken.Encoding
t0 = time.perf_counter()
docs = open(PATH, encoding="utf-8", newline="").read().split(EOT)
ids = enc.encode_ordinary_batch(docs, num_threads=2)
report(time.perf_counter() - t0, tokens=sum(map(len, ids)), id_sum=sum(map(sum, ids)), docs=len(docs))
""",
}


def bench_encode_file(args, files, enc):
    """encode_file with 2 workers vs tiktoken's batch encode with 2 threads (given its Encoding), whole processes."""
    path = scale_corpus(args.encode_mb)
    print(f"## Encoding a file: the {os.path.getsize(path) / 1e6:.3g} MB scale corpus ({path.name}), GPT-2's files, "
          f"each tool a fresh process, {counted(args.repeats, 'run')} taking turns; the call includes reading the "
          f"file, not building the tokenizer; our ids go to a .npy, tiktoken's stay in lists; memory as in the "
          f"training table")
    with tempfile.TemporaryDirectory() as d:
        out, enc_file = os.path.join(d, "ids.npy"), os.path.join(d, "gpt2.pickle")
        Path(enc_file).write_bytes(pickle.dumps(enc))  # so that tiktoken's process needs no bpe.py
        tools = [n for n in ENCODE_FILE if enc or not n.startswith("tiktoken")]
        runs = take_turns({n: functools.partial(run_measured, ENCODE_FILE[n], PATH=str(path), OUT=out, FILES=files,
                                                ENC=enc_file) for n in tools}, args.repeats)[1]
        ids = np.load(out, mmap_mode="r")
        eot = int(np.count_nonzero(ids == 50256))  # (tokens, id sum, documents) without the markers:
        ours = (len(ids) - eot, int(ids.sum(dtype=np.int64)) - 50256 * eot, eot + 1)
    process_table(runs)
    if enc:
        theirs = tuple(runs["tiktoken encode_ordinary_batch, 2 threads"][-1][k] for k in ("tokens", "id_sum", "docs"))
        assert ours == theirs, f"token counts differ: ours {ours}, tiktoken's {theirs}"
    print(f"bpe.encode_file: {len(ids):,} ids, {eot:,} of them <|endoftext|>; without them {ours[0]:,} in the "
          f"{ours[2]:,} documents between the markers" + (", the same count and id sum as tiktoken's" if enc else ""))


# ----------------------------------------------------------------------------
# 3. The training step: this project vs Hugging Face's Llama and a compact model of the same shape
#
# The compact model is the baseline a skilled PyTorch user writes for this shape in a hundred lines: the
# same function (pre-norm RMSNorm, RoPE, causal attention, SwiGLU, untied head, no biases) through torch's
# fused ops. One Linear makes q, k and v and one makes w1 and w3 (two matmuls where three were),
# F.rms_norm, F.scaled_dot_product_attention, the loss inside the forward (so one torch.compile covers
# it), torch's AdamW (one fused kernel). Its matmuls are the ones accounting.lm_forward_flops
# counts (a test checks it), so the same MFU formula is fair to it. It also runs a second time with
# the loss outside torch.compile, as issue 35 first measured it: the two rows show what that one choice is worth.

def torch_loss(logits, targets):  # the peers' loss: (B, T, V) logits upcast, as ours are
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def rope(x, cos, sin):  # x (B, h, T, d_k): rotate the halves (x1, x2) by each position's angles, as Llama does
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)  # bf16 stays bf16 for SDPA


class CompactBlock(torch.nn.Module):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.num_heads = num_heads
        self.norm1, self.norm2 = torch.nn.Parameter(torch.ones(d_model)), torch.nn.Parameter(torch.ones(d_model))
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = torch.nn.Linear(d_model, d_model, bias=False)
        self.w13 = torch.nn.Linear(d_model, 2 * d_ff, bias=False)
        self.w2 = torch.nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, d)
        B, T, d = x.shape
        h = F.rms_norm(x, (d,), self.norm1, eps=1e-5)
        q, k, v = self.qkv(h).view(B, T, 3, self.num_heads, -1).transpose(1, 3).unbind(2)  # (B, h, T, d_k) each
        a = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
        gate, up = self.w13(F.rms_norm(x, (d,), self.norm2, eps=1e-5)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class CompactLM(torch.nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta=10000.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, d_model)
        self.blocks = torch.nn.ModuleList(CompactBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = torch.nn.Parameter(torch.ones(d_model))
        self.head = torch.nn.Linear(d_model, vocab_size, bias=False)
        d_k = d_model // num_heads
        inv_freq = rope_theta ** (-torch.arange(0, d_k, 2, dtype=torch.float32) / d_k)  # (d_k / 2,)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)  # (T, d_k / 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, targets=None):  # ids (B, T) -> logits (B, T, V), or given targets the mean loss
        T, x = ids.shape[1], self.embed(ids)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(F.rms_norm(x, (x.shape[-1],), self.norm, eps=1e-5))
        if targets is None:
            return logits
        return torch_loss(logits, targets)


def torch_update(params, cfg):
    """The peers' update with the run's settings: torch's clipping (a tensor back, no host sync) and
    AdamW fused into one kernel (on a CPU too: what HF's Trainer takes by default with torch 2.8+), then the
    gradients freed, as train.py does."""
    params = list(params)
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            weight_decay=cfg["weight_decay"], fused=True)

    def update():
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return update


def compiled(model, cfg):
    """A peer compiled as train.py compiles ours (CUDA graphs too, where they are on; then each call begins a step, as
    in train.train_step: the last replay's outputs are spent)."""
    if not cfg["compile"]:
        return model
    fast = torch.compile(model, mode=train.compile_mode(cfg))
    if not cfg["cuda_graph"]:
        return fast

    def call(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return fast(*args, **kwargs)
    return call


def llama_step(cfg, micro):
    """A standard implementation of the same shape: HF's LlamaForCausalLM (pre-norm RMSNorm, RoPE, SwiGLU,
    no biases, untied head, torch's fused attention), compiled and autocast as ours is, torch's loss outside."""
    from transformers import LlamaConfig, LlamaForCausalLM
    shape = export.llama_config({**cfg, "tie_embeddings": False}, None)  # the mapping lives there, once
    hf = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa")).to(cfg["device"])
    model, update = compiled(hf, cfg), torch_update(hf.parameters(), cfg)

    def step():  # -> the mean loss (a tensor: no host sync)
        total = 0
        for x, y in micro:
            with train.autocast(cfg):
                logits = model(input_ids=x).logits
            loss = torch_loss(logits, y)
            (loss / len(micro)).backward()
            total = total + loss.detach()
        update()
        return total / len(micro)
    return step


def compact_step(cfg, micro, loss_inside=True):
    """The compact model's step on the same micro-batches, as llama_step's; loss_inside: the loss is compiled
    with the model (else torch's loss runs after it, as llama_step's does)."""
    torch.manual_seed(cfg["seed"])
    with torch.device(cfg["device"]):
        raw = CompactLM(**{k: cfg[k] for k in config.MODEL_KEYS[:7]})  # the shape and rope_theta
    model, update = compiled(raw, cfg), torch_update(raw.parameters(), cfg)

    def step():  # -> the mean loss (a tensor: no host sync)
        total = 0
        for x, y in micro:
            with train.autocast(cfg):
                out = model(x, y) if loss_inside else model(x)  # the loss, or the logits
            loss = out if loss_inside else torch_loss(out, y)
            (loss / len(micro)).backward()
            total = total + loss.detach()
        update()
        return total / len(micro)
    return step


def step_table(cfg):
    """This project's --benchmark step, HF Llama's (when installed) and the compact model's on the same
    batches, taking turns after UNTIMED_STEPS untimed rounds: one line each -> {name: (tokens/s, that line)}."""
    sync = synchronizer(cfg["device"])
    with torch_settings(cfg):
        ours, micro, _ = train.random_step(cfg)
        steps, failed = {"this project": ours}, {}
        if peer("transformers"):
            try:  # built and run once here: a failure (another transformers release) is its row, not the table's
                (hf := llama_step(cfg, micro))()
                steps["HF LlamaForCausalLM"] = hf
            except Exception as e:
                failed["HF LlamaForCausalLM"] = None, f"failed: {error_line(e)[:200]}"
                print(f"  HF LlamaForCausalLM: {failed['HF LlamaForCausalLM'][1]}", flush=True)
        steps["compact model (bench.py)"] = compact_step(cfg, micro)
        steps["compact model, loss outside compile"] = compact_step(cfg, micro, loss_inside=False)
        take_turns(steps, config.UNTIMED_STEPS, sync)
        times = take_turns(steps, cfg["benchmark_steps"], sync)[0]
        peak = train.device_peak(cfg)  # MFU's denominator, under the run's matmul precision
    print(f"device {cfg['device']}, dtype {cfg['dtype']}, compile {cfg['compile']}, fast {cfg['fast']}, "
          f"{torch.get_num_threads()} CPU threads, median of {cfg['benchmark_steps']} steps each, taking turns")
    base, flops = statistics.median(times["this project"]), train.step_flops(cfg)
    results = {}
    for name, ts in times.items():
        dt = statistics.median(ts)
        tps = cfg["batch_size"] * cfg["context_length"] / dt
        line = (f"{1000 * dt:.1f} ms/step, {tps:,.0f} tokens/s"
                + (f", MFU {100 * accounting.mfu(flops, dt, peak):.1f}%" if peak else "")
                + ("" if name == "this project" else f"; this project is {dt / base:.2f}x its speed"))
        print(f"  {name}: {line}", flush=True)
        results[name] = tps, line
    return {**results, **failed}


def bench_step(argv):
    """train.py's --benchmark step (argv: train.py's flags), HF Llama's and the compact model's, taking turns."""
    default = ["--data", "tinystories", "--device", "cpu", "--batch-size", "4"]
    if {"-h", "--help"} & set(argv):  # train.py's help, but named and described as this command, with its default
        config.flags_parser("bench.py step", "The training step of train.py --benchmark (its flags below) against HF "
                            f"Llama's and a compact model's, taking turns; no flags: {' '.join(default)}.",
                            config.FLAGS, config.PRESETS).parse_args(["--help"])
    argv = argv or default
    cfg = config.resolve_config(["--benchmark", *argv])  # a mistake in them: one sentence (see __main__)
    print(f"## Training step: python train.py --benchmark {' '.join(argv)}, with HF Llama and a compact model "
          "taking turns")
    step_table(cfg)
    return 0


# ----------------------------------------------------------------------------
# 3b. The head and the loss alone: fused_head.py's chunks against the logits, then torch's loss
#
# The fused head (train.py's default on the fast path, but for a step compiled on a GPU) never holds the (rows,
# vocab) logits; the logits path (--no-fused-head, compiled) writes them, then torch's loss reads them back. Here
# each runs forward and backward on the same hidden state and head, taking turns: its time, its peak memory and its
# loss (the same in each).

HEAD_CHUNKS = (1, 2, 4, 8, 16)  # fused_head.CHUNKS is chosen among these by measurement. On a GPU with Triton, 1
# chunk holds the logits once, as the logits path does, and replaces its loss by fused_head.py's one kernel


def peak_bytes(call, device):
    """The most bytes call() holds at once beyond what was held before it: CUDA's allocator peak; on a CPU the
    profiler's allocation events, which see every torch and inductor allocation (numpy's, as fast_cpu.py's
    loops make, they do not: compare paths without them)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    # acc_events: one profiling cycle here either way; without it torch 2.11 prints a warning about cycles. Quiet:
    # torch 2.13's profiler prints its start and stop on the C-level stderr, which broke bench.py head's table
    with cli.quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                    profile_memory=True, acc_events=True) as prof:
        call()
    live = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):  # each allocation (+) and free (-), in time order
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def head_calls(device, rows, shape, dtype, compile):
    """{variant: call} for head_table: each call runs the head and the loss forward and backward on the same
    (rows, d_model) hidden state, head weight and targets -> the loss."""
    g = torch.Generator().manual_seed(0)
    V, d = shape["vocab_size"], shape["d_model"]
    h = torch.randn(rows, d, generator=g).to(device).requires_grad_()
    w = (torch.randn(V, d, generator=g) * d ** -0.5).to(device).requires_grad_()
    t = torch.randint(V, (rows,), generator=g).to(device)
    amp = {"dtype": dtype, "device": device}  # train.autocast's two keys

    def logits_then_loss(h, w, t):  # train.LMLoss with --no-fused-head, compiled
        return F.cross_entropy((h @ w.t()).float(), t)
    fns = {"the logits, then torch's loss (--no-fused-head)": logits_then_loss}
    fns.update({f"fused, {k} chunk{'s' * (k > 1)}": functools.partial(fused_head.linear_cross_entropy, chunks=k)
                for k in HEAD_CHUNKS})

    def runner(fn):
        fn = torch.compile(fn, dynamic=False) if compile else fn  # each chunk count its own graph, none dynamic

        def run():  # the gradients are made and freed inside the call, as a step's are (not kept in .grad)
            with train.autocast(amp):
                loss = fn(h, w, t)
            torch.autograd.grad(loss, (h, w))
            return loss.detach()
        return run
    return {name: runner(fn) for name, fn in fns.items()}


def head_table(device, rows, shape, dtype, compile, repeats):
    """The head and loss alone, each variant in turn after an untimed call (it compiles) -> {variant: its line}."""
    sync = synchronizer(device)
    calls = head_calls(device, rows, shape, dtype, compile)
    take_turns(calls, 1, sync)
    times, losses = take_turns(calls, repeats, sync)
    logits = rows * shape["vocab_size"] * (2 if dtype == "bf16" else 4)
    print(f"head and loss alone, forward and backward: {rows:,} rows x vocab {shape['vocab_size']:,} (the logits: "
          f"{logits / 2**20:,.0f} MiB in {dtype}), d_model {shape['d_model']}, {dtype}, device {device}, "
          f"{'compiled' if compile else 'eager'}, median of {counted(repeats, 'run')} taking turns; fused_head.CHUNKS "
          f"is {fused_head.CHUNKS}")
    lines = {}
    for name, call in calls.items():
        peak = peak_bytes(call, device)
        lines[name] = (f"{1000 * statistics.median(times[name]):,.1f} ms, peak {peak / 2**20:,.1f} MiB, "
                       f"loss {float(losses[name][-1]):.6f}")
        print(f"  {name}: {lines[name]}", flush=True)
    return lines


# ----------------------------------------------------------------------------
# 3c. SwiGLU's gate alone: is inductor's backward at the memory's speed? (bench.py gpu --sections gate)
#
# On the H200 inductor's backward of the gate moved its bytes at half its forward's speed (fast_gpu.py's lesson 2).
# This times the gate alone: inductor's kernels (compiled as the step's graph has them: a and b as halves of W1 and
# W3's one matmul, their gradients written into one buffer) against fast_gpu.py's Triton kernel each way
# (--triton-gate), and a copy of as many bytes (the memory's speed).

def gate_forward(ab):  # (rows, 2 F) -> silu(a) * b (rows, F): model.py's fast SwiGLU, between its two matmuls
    a, b = ab.chunk(2, dim=-1)
    return F.silu(a) * b


def gate_backward(ab, dh):  # the gate's backward as the step's graph holds it: the two gradients in one buffer
    a, b = ab.chunk(2, dim=-1)
    return torch.cat([torch.ops.aten.silu_backward(dh * b, a), dh * F.silu(a)], dim=-1)


GATE_CALLS = 10  # calls of a variant in one timing


def gate_table(device, rows, d_ff, dtype, compile, repeats):
    """SwiGLU's gate alone at rows x d_ff, forward and backward apart, each variant in turn after an untimed round
    (the compile) -> {variant: its line}: time, and bytes read and written per second; Triton's row also its largest difference
    from inductor's (in units of inductor's largest value)."""
    g = torch.Generator().manual_seed(0)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    ab = torch.randn(rows, 2 * d_ff, generator=g).to(device, dt)
    dh = torch.randn(rows, d_ff, generator=g).to(device, dt)
    fwd, bwd = (torch.compile(f, dynamic=False) if compile else f for f in (gate_forward, gate_backward))
    fns = {"inductor, forward": lambda: fwd(ab), "inductor, backward": lambda: bwd(ab, dh),
           "a copy of (rows, 2 d_ff)": lambda: ab.clone()}
    units = {"inductor, forward": 3, "inductor, backward": 5, "a copy of (rows, 2 d_ff)": 4}  # rows x d_ff numbers
    if fast_gpu.usable(ab):  # fast_gpu.py's ops, as --triton-gate runs them in the step
        fns.update({"Triton, forward": lambda: fast_gpu.silu_gate(ab),
                    "Triton, backward": lambda: fast_gpu.silu_gate_backward(ab, dh)})
        units.update({"Triton, forward": 3, "Triton, backward": 5})

    def back_to_back(fn):  # GATE_CALLS calls between two syncs: the launches overlap the kernels, and each output
        def call():        # is freed as the next is made, so the allocator reuses its block (nothing is allocated
            for _ in range(GATE_CALLS):  # from the GPU inside the timing)
                fn()
        return call
    sync = synchronizer(device)
    times = take_turns({name: back_to_back(fn) for name, fn in fns.items()}, repeats + 1, sync)[0]
    print(f"SwiGLU's gate alone: {rows:,} rows x d_ff {d_ff:,}, {dtype}, device {device}, "
          f"{'compiled' if compile else 'eager'}, {GATE_CALLS} calls a timing, median of {repeats} taking turns")
    lines = {}
    for name, fn in fns.items():
        t = statistics.median(times[name][1:]) / GATE_CALLS  # the first round compiles
        lines[name] = f"{1000 * t:,.2f} ms, {units[name] * rows * d_ff * ab.element_size() / t / 1e9:,.0f} GB/s"
        if name.startswith("Triton"):  # the same numbers as inductor's, to bf16's rounding
            got, want = fn().float(), fns[name.replace("Triton", "inductor")]().float()
            lines[name] += f", differs from inductor's by {float((got - want).abs().max() / want.abs().max()):.1e}"
        print(f"  {name}: {lines[name]}", flush=True)
    if len(fns) == 3:
        lines["Triton"] = "skipped: its kernels need a CUDA GPU and triton"
    return lines


def step_peak_table(argv, engine_loops=True):
    """One training step's peak memory (train.py's flags argv, --benchmark's random tokens), with the fused head and
    without, after one untimed step each -> {variant: MiB}. engine_loops=False: fast_cpu.py's loops off, as their
    numpy buffers are not seen by a CPU's profiler (a compiled step does not run them)."""
    cfg = config.resolve_config(["--benchmark", *argv])
    peaks = {}
    with torch_settings(cfg), unittest.mock.patch.object(fast_cpu, "usable", fast_cpu.usable if engine_loops else
                                                          lambda *tensors, in_place=False: False):
        for fused in (True, False):
            step = train.random_step(dict(cfg, fused_head=fused))[0]
            step()
            peaks[f"fused head {'on' if fused else 'off'}"] = peak_bytes(step, cfg["device"]) / 2**20
            del step
            gc.collect()
    N = cfg["micro_batch"] * cfg["context_length"]
    logits = N * cfg["vocab_size"] * (2 if cfg["dtype"] == "bf16" else 4) / 2**20
    saved = peaks["fused head off"] - peaks["fused head on"]
    print(f"one step's peak memory, python train.py --benchmark {' '.join(argv)}"
          + ("" if engine_loops else " (fast_cpu.py's loops off)") + ": "
          + ", ".join(f"{k} {v:,.0f} MiB" for k, v in peaks.items())
          + f"; the fused head holds {abs(saved):,.0f} MiB {'less' if saved >= 0 else 'more'}; "
          f"the logits ({N:,} x {cfg['vocab_size']:,}, {cfg['dtype']}) are {logits:,.0f} MiB", flush=True)
    return peaks


def bench_head(args):
    """fused_head.CHUNKS by measurement on this machine: the head alone at GPT-2 small's vocabulary and width, eager
    and compiled, then one step of GPT-2 small (batch args.rows / 1,024 at context 1,024), eager and compiled, with
    and without the fused head."""
    print(f"## The fused head: {args.rows:,} rows, GPT-2 small's vocabulary and width, float32, device cpu")
    for compile in (False, True):
        head_table("cpu", args.rows, GPT2_SMALL, "float32", compile, args.repeats)
    shape = [f"--{k.replace('_', '-')}={v}" for k, v in GPT2_SMALL.items()]
    flags = ["--data=tinystories", *shape, f"--batch-size={max(1, args.rows // 1024)}", "--device=cpu"]
    step_peak_table(flags, engine_loops=False)  # eager: the logits path holds the logits and their gradient
    step_peak_table([*flags, "--compile"])  # compiled: inductor writes the gradient over the logits, one buffer


# ----------------------------------------------------------------------------
# 4. Generation: the plain paths (with and without the KV cache), the fast path, HF's static cache

def hf_step(device):  # transformers compiles its static cache's forward on CUDA only
    return "compiled step" if str(device).startswith("cuda") else "eager step"


def hf_generator(m, shape, device, prompts):
    """HF's LlamaForCausalLM holding m's weights, generating greedily with its static cache, whose forward
    transformers compiles on CUDA -> a call (max_new_tokens) -> the new ids of each row."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = export.llama_config({**shape, "rope_theta": 10_000.0, "tie_embeddings": False}, None)
    hf = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
    hf.load_state_dict(export.llama_weights(m.state_dict(), shape["num_layers"], shape["num_heads"], False))
    hf, ids = hf.to(device).eval(), torch.tensor(prompts, device=device)

    def call(max_new_tokens):  # a longer run than the last makes a larger cache: compiled again, then reused
        out = hf.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                          pad_token_id=0, cache_implementation="static")
        return out[:, ids.shape[1]:].tolist()
    return call


def generators(m, shape, device, batch, compile, hf):
    """{row: call (max_new_tokens) -> ids} for one batch of 1-token prompts (hf: transformers is installed)."""
    prompts = [[1]] * batch
    calls = {"plain, KV cache": functools.partial(generate, m, prompts, temperature=0, fast=False)}
    if batch == 1:  # the reference, re-running the window for each token: batch 1 shows it
        calls["plain, no cache"] = functools.partial(generate, m, prompts, temperature=0, use_cache=False)
    calls[f"fast, static cache, {'compiled' if compile else 'eager'} step"] = functools.partial(
        generate, m, prompts, temperature=0, fast=True, compile=compile)
    if hf:
        calls[f"HF generate, static cache, {hf_step(device)}"] = hf_generator(m, shape, device, prompts)
    return calls


def bench_generate(args, device="cpu", name="TinyStories", shape=accounting.TINYSTORIES, compile=None, batches=None):
    """Greedy generation after a 1-token prompt, each generator in turn after an untimed call (it compiles)
    -> {"batch B, row": tokens/s}. compile (default: on CUDA, as generate's fast path) compiles the fast step."""
    torch.manual_seed(0)
    m = TransformerLM(**shape, device=device)  # model.py's from-scratch path
    compile = device.startswith("cuda") if compile is None else compile
    sync = synchronizer(device)
    print(f"## Generation: {args.new_tokens} tokens after a 1-token prompt, {name} shape, greedy, device {device}, "
          f"{torch.get_num_threads()} threads, median of {counted(args.repeats, 'run')} taking turns")
    speed, hf = {}, peer("transformers")
    for batch in batches or GEN_BATCHES[False]:
        calls = generators(m, shape, device, batch, compile, hf)
        t0 = time.perf_counter()
        take_turns({row: functools.partial(call, max_new_tokens=4) for row, call in calls.items()}, 1, sync)
        print(f"batch {batch}: the untimed first calls (they compile) {time.perf_counter() - t0:.1f} s")
        timed = {row: functools.partial(call, max_new_tokens=args.new_tokens) for row, call in calls.items()}
        times, out = take_turns(timed, args.repeats, sync)
        for row, ts in times.items():
            speed[f"batch {batch}, {row}"] = tps = batch * args.new_tokens / statistics.median(ts)
            same = out[row][-1] == out["plain, KV cache"][-1]
            print(f"batch {batch}, {row:40s} {statistics.median(ts):6.2f} s {tps:9,.1f} tokens/s, "
                  f"{'the same tokens' if same else 'other tokens than'} as the plain path with the KV cache")
    return speed


STOP_CHECKS = (1, 2, 4, 8, 16, 32)  # the fast path's tokens between looks at the stop flags, tried by bench.py gpu


def bench_stop_checks(args, device, shape, compile):
    """The fast path at batch 1 with a stop id that never comes, for each of STOP_CHECKS as model.STOP_CHECK_EVERY
    (each look is a host sync), taking turns -> {k: tokens/s}. Chooses the constant by measurement."""
    torch.manual_seed(0)
    m, chosen = TransformerLM(**shape, device=device), model.STOP_CHECK_EVERY
    sync = synchronizer(device)
    seen = set(generate(m, [1], args.new_tokens, temperature=0, fast=True, compile=compile))
    stop = next(i for i in range(shape["vocab_size"]) if i not in seen)  # greedy output never holds it

    def call(k):
        model.STOP_CHECK_EVERY = k
        try:
            return generate(m, [1], args.new_tokens, temperature=0, stop_id=stop, fast=True, compile=compile)
        finally:
            model.STOP_CHECK_EVERY = chosen
    times = take_turns({k: functools.partial(call, k) for k in STOP_CHECKS}, args.repeats, sync)[0]
    speed = {k: args.new_tokens / statistics.median(ts) for k, ts in times.items()}
    print("fast path, batch 1, a stop id that never comes: " + ", ".join(
        f"a look every {k}: {tps:,.0f}" for k, tps in speed.items()) + f" tokens/s (model.py's: {chosen})")
    return speed


# ----------------------------------------------------------------------------
# 5. The GPU report: every GPU figure of this project in one command, ending in docs/results.md's table
#
# Each section guards itself (a failure is one line, then the next section runs), and none starts
# once --budget seconds are spent, so a run on a rented GPU always ends with its table. --cpu
# rehearses it: the same sections at tiny sizes on the CPU, without what only a GPU runs here
# (torch.compile, whose CPU build takes minutes; bf16 autocast; compiled AdamW; the CUDA kernels;
# the GPU memory check; the CUDA tests' bodies).

# GPT-2 small's widths with SwiGLU (d_ff 8/3 d_model: 2,048), its vocabulary padded to a multiple of 128 (50,304)
# so that the head's matmul tiles evenly on a GPU
GPT2_SMALL = dict(vocab_size=50_304, context_length=1_024, d_model=768, num_layers=12, num_heads=12, d_ff=2_048)
GPU_SHAPES = {  # name: ((shape, batch size) on the GPU, the --cpu rehearsal's stand-in)
    "TinyStories": ((accounting.TINYSTORIES, 128),
                    (dict(vocab_size=256, context_length=32, d_model=64, num_layers=2, num_heads=4, d_ff=128), 4)),
    "GPT-2 small": ((GPT2_SMALL, 32),
                    (dict(vocab_size=512, context_length=64, d_model=48, num_layers=3, num_heads=3, d_ff=128), 2)),
}
LOOP = {False: dict(steps=300, log=10, evals=100, skip=20, ids=1_000_000),  # the real loop's run; True: --cpu's
        True: dict(steps=40, log=5, evals=20, skip=10, ids=20_000)}
GEN_BATCHES = {False: (1, 64), True: (1, 4)}  # generation's batch sizes; True: --cpu's
SECTIONS = ("step", "optimizers", "head", "gate", "levers", "profile", "autotune", "loop", "generation", "kernels",
            "accounting", "tests")  # bench.py gpu's
TESTS, CUDA_TESTS = "test_all.py", "cuda"  # pytest -k: the tests that touch CUDA have it in their names (a test checks)
TEST_LINE = regex.compile(r"\S+\.py::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)|(FAILED|ERROR) ")
SLOW_LINE = regex.compile(r"\d+\.\d+s (setup|call|teardown) ")  # pytest --durations: where a GPU's minutes went


LEVERS = {  # bench.py gpu's levers of the fast path: the row's name -> train.py's flags that turn it on (or off)
    "the defaults": [],
    # without graphs the fused head and the Triton gate default to off too: the defaults' step before commit 47eb48d
    "--no-cuda-graph (kernels launched one at a time: the logits path and inductor's gate)": ["--no-cuda-graph"],
    "--no-fused-head (the logits, then torch's loss)": ["--no-fused-head"],
    "--no-triton-gate (inductor's gate)": ["--no-triton-gate"],
    "--no-bf16-residual (the residual stream in float32, as without --fast)": ["--no-bf16-residual"],
    "--sdpa-backend flash": ["--sdpa-backend=flash"],
    "--sdpa-backend cudnn": ["--sdpa-backend=cudnn"],
}
# max-autotune's compile tunes kernels for minutes: a section of its own (GPT-2 small first), after both shapes' other
# levers, so that a report stopped from outside in its tuning has every other lever's row; its defaults built again
AUTOTUNE = {"the defaults, again beside max-autotune": [], "--max-autotune": ["--max-autotune"]}


# A kernel's kind, from its name: the first rule it matches (torch's ops by their own names on a --cpu rehearsal),
# for bench.py gpu's profile. Inductor's names list the ops a kernel fused ("triton_poi_fused_addmm_0" is an
# elementwise kernel beside a matmul), so they are read first. The five longest kernels are printed too, to name
# what is "other".
KERNEL_KINDS = ((("_gate_forward_kernel", "_gate_backward_kernel", "_loss_and_grad_kernel"),
                 "this project's Triton kernels (fast_gpu.py, fused_head.py)"),
                (("triton_tem",), "matmul"),  # inductor's matmul templates
                (("triton_for",), "foreach: optimizer, clipping"),
                (("triton_",), "inductor's fused elementwise and reductions"),
                (("flash", "fmha", "sdpa", "attention", "cudnn"), "attention"),  # before "cutlass": fmha_cutlassF
                (("gemm", "nvjet", "xmma", "cutlass", "cublas", "addmm", "::mm", "bmm"), "matmul"),
                (("multi_tensor", "foreach"), "foreach: optimizer, clipping"),
                (("memcpy", "memset", "copy", "fill"), "copies and fills"))
PROFILED_STEPS = 5


def kernel_kind(name):  # e.g. "sm90_xmma_gemm_bf16bf16..." -> "matmul"; "Memcpy DtoD" -> "copies and fills"
    return next((kind for marks, kind in KERNEL_KINDS if any(m in name.lower() for m in marks)), "other")


def kernel_times(step, device, steps=PROFILED_STEPS):
    """torch.profiler over `steps` calls of step, one after another (the host may run ahead, as in train.py's loop)
    -> ({kernel name: its device seconds per step}, the kernels launched per step, a call that gives device_waits'
    line) (on a CPU, each op's own CPU seconds and the ops: a rehearsal of the code, not a figure)."""
    gpu, activity = device.startswith("cuda"), torch.profiler.ProfilerActivity
    with cli.quiet_stderr(), torch.profiler.profile(activities=[activity.CPU, *[activity.CUDA] * gpu]) as prof:
        for _ in range(steps):
            step()
        synchronizer(device)()
    kind = torch.autograd.DeviceType.CUDA if gpu else torch.autograd.DeviceType.CPU
    times, launches = Counter(), 0
    for e in prof.key_averages():  # a record_function range (Optimizer.step#AdamW.step) is a device event too,
        if e.device_type == kind and not e.is_user_annotation:  # spanning its kernels: counted twice, it is left out
            times[e.key] += (e.self_device_time_total if gpu else e.self_cpu_time_total) / 1e6 / steps
            launches += e.count / steps
    return times, launches, functools.partial(device_waits, prof.events(), kind, steps)  # read where it is said


def device_waits(events, kind, steps, longest=3):
    """Where the device waited between its kernels (nothing ran): the total per step, and the longest waits, each
    with the kernel that ended it and the op whose launch it waited for (the host's side: on a GPU, the CPU op
    linked to the kernel's launch). On a CPU the "kernels" are the ops, as kernel_times times them."""
    cpu = {e.id: e for e in events if e.device_type == torch.autograd.DeviceType.CPU}
    kernels = sorted((e for e in events if e.device_type == kind and not e.is_user_annotation),
                     key=lambda e: e.time_range.start)
    waits, end = [], kernels[0].time_range.end if kernels else 0
    for k in kernels[1:]:
        if k.time_range.start > end:
            waits.append(((k.time_range.start - end) / 1e6, k))
        end = max(end, k.time_range.end)
    if not waits:
        return "no wait between kernels"

    def launcher(k):  # the innermost op above the CUDA runtime's launch call (cudaLaunchKernel, cudaGraphLaunch)
        e = k.cpu_parent if kind == torch.autograd.DeviceType.CPU else cpu.get(getattr(k, "linked_correlation_id", 0))
        while e is not None and e.name.startswith("cuda"):
            e = e.cpu_parent
        return e.name[:60] if e is not None else "?"
    waits.sort(key=lambda w: w[0], reverse=True)
    return (f"waits between kernels {1000 * sum(t for t, _ in waits) / steps:.2f} ms a step; the longest: "
            + ", ".join(f"{1000 * t:.2f} ms before {k.name[:50]} (launched by {launcher(k)})"
                        for t, k in waits[:longest]))


def levers_by_default():
    """Which of the levers' switches are on by default: config.resolve_config decides them (its rule in words), and
    --max-autotune's and --sdpa-backend's are train.py's flags' defaults (config.FLAGS)."""
    autotune = "on" if config.FLAG_DEFAULTS["max_autotune"] else "off"
    return ("on for a step compiled on one GPU (--compile on CUDA, one process, --grad-accum 1): --cuda-graph, "
            "--fused-head, --triton-gate (the two kernels off without the graphs; the gate needs --fast, SwiGLU and "
            "triton); on with --fast and --dtype bf16 on a GPU: "
            f"--bf16-residual; on elsewhere: --fused-head; {autotune}: --max-autotune; --sdpa-backend "
            f"{config.FLAG_DEFAULTS['sdpa_backend']} (torch's choice). A lever stays on only if it wins on the GPU (an "
            "H100 or H200)")


def cuda_host_syncs(call, calls=3):
    """Where `calls` calls of call make a synchronizing CUDA call (a host wait each), as torch.cuda's sync debug mode
    warns -> "0", or their number and the lines of this project's code that made them (the innermost; a warning
    from C++ names torch's own frame): "2 (optim.py:199 x2)". More than one call, so that a one-off is told from a
    wait in every step."""
    places = Counter()

    def note(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            ours = [f for f in traceback.extract_stack()[:-1] if Path(f.filename).resolve().parent == ROOT
                    and Path(f.filename).name != "bench.py"] or [traceback.FrameSummary(filename, lineno, "")]
            places[f"{Path(ours[-1].filename).name}:{ours[-1].lineno}"] += 1
    with warnings.catch_warnings():  # restores showwarning
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(calls):
                call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return f"{sum(places.values())}" + (f" ({', '.join(f'{p} x{n}' for p, n in places.items())})" if places else "")


# Why a step ran slower later in a run on the H200 (2026-11-30: 63.0 ms alone, 66.4 ms taking turns) is not known;
# a GPU that lowers its clock (power, heat) is one candidate. nvidia-smi, sampled through the report, tells.
GPU_WATCH = ("timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active",  # the name since 535
             "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active")  # the name before
SLOWDOWNS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "thermal (software)", 0x40: "thermal (hardware)",
             0x80: "power brake"}  # NVML's clock-event bits that lower the clock under load (not idle's 0x1)


class GpuWatch:
    """nvidia-smi's SM clock, power, temperature and slowdowns every 200 ms in a thread -> window(t0, t1), a few
    words on the GPU while a row was timed (perf_counter's seconds; each sample by nvidia-smi's own timestamp, not
    when a buffered pipe hands it over). Without nvidia-smi (a CPU, a container without it), or if it refuses, each
    window is empty."""

    def __init__(self, device):
        self.samples, self.proc, self.offset = [], None, time.time() - time.perf_counter()
        exe = shutil.which("nvidia-smi") if device.startswith("cuda") else None
        if not exe:
            return
        # the GPU torch uses by its UUID: nvidia-smi's numbers follow the PCI bus, CUDA's may not
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None) if torch.cuda.is_available() else None
        gpus = [f"GPU-{uuid}"] * (uuid is not None) + [str(index)]
        try:  # the first GPU name and field list this nvidia-smi takes, then sampled until stop()
            gpu, fields = next(((g, f) for g in gpus for f in GPU_WATCH if subprocess.run(
                [exe, f"--query-gpu={f}", "--format=csv", "-i", g], capture_output=True, timeout=30).returncode == 0),
                (None, None))
            if fields:
                self.proc = subprocess.Popen([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms",
                                              "200", "-i", gpu], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                             text=True)
                threading.Thread(target=self._read, daemon=True).start()
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _read(self):
        def number(text, parse=float):  # None where this GPU or driver has none ("[N/A]", "[Not Supported]")
            try:
                return parse(text)
            except ValueError:
                return None
        for line in self.proc.stdout:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) != 5 or number(fields[1]) is None:  # a message, or no clock: no sample
                continue
            try:  # nvidia-smi's local time, e.g. 2026/11/30 04:10:12.345
                at = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp() - self.offset
            except ValueError:
                at = time.perf_counter()
            self.samples.append((at, number(fields[1]), number(fields[2]), number(fields[3]),
                                 number(fields[4], lambda t: int(t, 16)) or 0))

    def window(self, t0, t1):
        """e.g. ", GPU 1,980 MHz (1,755-1,980), 610 W, 58 C, slowed by: power cap" or "" without samples."""
        seen = [s for s in self.samples if t0 <= s[0] <= t1]
        if not seen:
            return ""
        sm, watts, celsius, events = ([x for x in xs if x is not None] for xs in zip(*(s[1:] for s in seen)))
        slowed = [why for bit, why in SLOWDOWNS.items() if any(e & bit for e in events)]
        return "".join([f", GPU {statistics.median(sm):,.0f} MHz ({min(sm):,.0f}-{max(sm):,.0f})",
                        *[f", {statistics.median(watts):.0f} W"] * bool(watts),
                        *[f", {max(celsius):.0f} C"] * bool(celsius),
                        *[f", slowed by: {', '.join(slowed)}"] * bool(slowed)])

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()


def git_commit():  # BENCH_COMMIT where its caller sets it (a rented GPU's copy, whose .git may lag), else git's
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def steady(metrics, run, key="tokens_per_s"):
    """The median of metrics.jsonl's `key` (tokens_per_s, mfu) over its windows after the first run["skip"] steps,
    leaving out each window that holds the first step after an evaluation (the compiler may retrace there); None
    where no window has it (mfu on a CPU, which has no published peak)."""
    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    values = [r[key] for r in rows if r.get(key) is not None and r["step"] > run["skip"]
              and not any((n - 1) % run["evals"] == 0 for n in range(r["step"] - run["log"] + 1, r["step"] + 1))]
    return statistics.median(values) if values else None


class GpuReport:
    """`bench.py gpu`: the sections in order, each adding rows {what: result} to the final table."""

    def __init__(self, args):
        self.cpu, self.steps, self.budget, self.tests = args.cpu, args.steps, args.budget, args.tests
        self.command = getattr(args, "command", "python bench.py gpu" + " --cpu" * self.cpu)  # as typed, in the table
        self.profiled = min(PROFILED_STEPS, self.steps)  # a short --steps profiles as few (a profile's parse is slow)
        self.sections = getattr(args, "sections", SECTIONS)
        self.chosen = {lever: flags for lever, flags in LEVERS.items()  # --levers: the defaults and those it names
                       if not flags or any(word in lever for word in getattr(args, "levers", None) or [lever])}
        self.device = "cpu" if args.cpu else "cuda"
        self.t0, self.rows, self.failed = time.perf_counter(), {}, []
        self.benchmark_tps = {}  # shape -> --benchmark's tokens/s (the step section's, or the optimizers' AdamW step,
        # the same defaults): the real loop's yardstick
        self.watch = None  # run()'s GpuWatch

    def left(self):  # seconds of the budget left
        return self.budget - (time.perf_counter() - self.t0)

    def gpu_during(self, t0):  # the GPU's clock, power and heat from t0 until now ("" without nvidia-smi)
        return self.watch.window(t0, time.perf_counter()) if self.watch else ""

    def timed_turns(self, calls, sync):  # take_turns' times over self.steps rounds, and the GPU meanwhile (gpu_during)
        t0 = time.perf_counter()
        return take_turns(calls, self.steps, sync)[0], self.gpu_during(t0)

    def shape_flags(self, name):
        """train.py's flags for one of GPU_SHAPES, without --data."""
        shape, batch = GPU_SHAPES[name][self.cpu]
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()] + [f"--batch-size={batch}", "--fast"]
        return flags + (["--device=cpu"] if self.cpu else ["--device=cuda", "--compile"])

    def benchmark_cfg(self, name, *extra):
        """train.py --benchmark's config at one of GPU_SHAPES, with extra flags (a lever's, an optimizer's)."""
        return config.resolve_config(["--benchmark", "--data=tinystories", *self.shape_flags(name), *extra,
                                      f"--benchmark-steps={self.steps}"])

    def step(self, name):
        print(f"python train.py --benchmark {' '.join(self.shape_flags(name))}, with HF Llama and the compact model "
              "taking turns")
        cfg = self.benchmark_cfg(name)
        results = step_table(cfg)
        self.benchmark_tps[name] = results["this project"][0]
        results.setdefault("HF LlamaForCausalLM", (None, "skipped: transformers is not installed"))
        return {f"step, {name} shape: {who}": results[who][1] for who in (
            "this project", "HF LlamaForCausalLM", "compact model (bench.py)", "compact model, loss outside compile")}

    def head(self):
        """The fused head + loss alone at the GPT-2-small shape's vocabulary, width and rows (compiled, bf16), for
        each chunk count, against the logits, then torch's loss: how fused_head.CHUNKS is chosen."""
        (shape, batch), compile = GPU_SHAPES["GPT-2 small"][self.cpu], not self.cpu
        rows = batch * shape["context_length"]
        lines = head_table(self.device, rows, shape, "float32" if self.cpu else "bf16", compile, self.steps)
        return {f"head and loss alone, GPT-2-small shape ({rows:,} rows): {name}": line for name, line in lines.items()}

    def gate(self):
        """SwiGLU's gate alone at the GPT-2-small shape's rows and d_ff: inductor's kernels against Triton's."""
        (shape, batch), compile = GPU_SHAPES["GPT-2 small"][self.cpu], not self.cpu
        rows = batch * shape["context_length"]
        lines = gate_table(self.device, rows, shape["d_ff"], "float32" if self.cpu else "bf16", compile, self.steps)
        return {f"SwiGLU's gate alone, GPT-2-small shape ({rows:,} x {shape['d_ff']:,}): {name}": line
                for name, line in lines.items()}

    def levers(self, name, levers=None):
        """Each lever of the fast path at one shape (levers: LEVERS, or AUTOTUNE's), one at a time: built and compiled,
        timed taking turns with the defaults, its row printed at once, then freed, so that a report stopped from outside
        (a rented GPU's time limit, during max-autotune's long compile) keeps the rows before it. Each row has one
        step's peak memory beyond the weights and optimizer state (--no-fused-head's row against the defaults': what
        the fused head saves, or costs; with graphs, the peak of their recording) and the first step's seconds (the
        compile). A lever starts only while the budget lasts, and one train.py refuses here (a CUDA kernel on --cpu)
        says why in its row."""
        sync, rows, defaults = synchronizer(self.device), {}, {}
        print(f"python train.py --benchmark {' '.join(self.shape_flags(name))}, with each lever's flags, taking turns "
              "with the defaults")
        for lever, extra in (self.chosen if levers is None else levers).items():
            row = f"lever, {name} shape: {lever}"
            # a compile must fit in what is left (max-autotune's tunes kernels: 3 of the defaults'), or a report
            # stopped from outside (a rented GPU's time limit) loses its table and the next command its time
            need = (3 if "--max-autotune" in extra else 1) * defaults.get("first", 0)
            try:
                cfg = self.benchmark_cfg(name, *extra)
                rows[row] = (f"skipped: {max(self.left(), 0):.0f} s of the {self.budget:g} s budget left, less than "
                             f"its compile's {need:.0f} s" if self.left() <= need
                             else self.lever_line(cfg, row, defaults, sync, baseline=not extra))
            except UsageError as e:
                rows[row] = f"skipped: {e}"
            except Exception as e:  # a kernel or compiler this GPU lacks: the next lever still runs
                rows[row] = f"failed: {error_line(e)}"
                self.failed.append(row)
            print(f"  {row}: {rows[row]}", flush=True)
        return rows

    def lever_line(self, cfg, row, defaults, sync, baseline=False):
        """One lever's row, against the defaults' step and first-step seconds (kept in `defaults` by the baseline's
        call: if the defaults failed, no row is compared with another lever in their name)."""
        with torch_settings(cfg):
            t0, skips = time.perf_counter(), torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
            step = train.random_step(cfg)[0]
            # compiles; with graphs, the calls that warm up and record them too: their pool is the step's memory (a
            # replay allocates nothing), so its peak is taken over those calls
            recorded = peak_bytes(lambda s=step: [s() for _ in range(3)], self.device) if cfg["cuda_graph"] else step()
            first = time.perf_counter() - t0
            # inductor may decline a graph (a CPU tensor in it, a mutated input) and run the step without one
            skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips
            calls = {"defaults": defaults["step"], row: step} if defaults else {row: step}  # the defaults: alone
            if baseline:
                defaults.update(step=step, first=first)
            take_turns(calls, config.UNTIMED_STEPS - 1, sync)
            times, gpu = self.timed_turns(calls, sync)
            held = (recorded if cfg["cuda_graph"] else peak_bytes(step, self.device)) / 2**20
            # the kernels' own time (the profiler's): the GPU's work alone, which host delays cannot lengthen (taking
            # turns with another compiled model lengthened the defaults' step by 2-6% on the H200; the cause is not
            # established). A graph's lever changes the launches, not the kernels, so its row has none
            kernels = None if cfg["cuda_graph"] else sum(kernel_times(step, self.device, self.profiled)[0].values())
            if baseline:
                defaults["kernels"] = kernels
            peak = train.device_peak(cfg)
        del step, calls  # this lever's model and optimizer go, but the defaults' stay for the next
        gc.collect()
        dt, base = (statistics.median(times[k]) if k in times else None for k in (row, "defaults"))
        return (f"{1000 * dt:.1f} ms/step, {cfg['batch_size'] * cfg['context_length'] / dt:,.0f} tokens/s"
                + (f", MFU {100 * accounting.mfu(train.step_flops(cfg), dt, peak):.1f}%" if peak else "")
                + (f", kernels {1000 * kernels:.1f} ms/step" if kernels else "")
                + f", step's peak {held:,.0f} MiB" + (" (its graphs' recording)" if cfg["cuda_graph"] else "")
                + (f", but {counted(skips, 'graph')} skipped by inductor: timed without"
                   if cfg["cuda_graph"] and skips else "")
                + f", first step {first:.0f} s"
                + (f"; {base / dt:.2f}x the defaults' speed (their {1000 * base:.1f} ms/step, taking turns)"
                   if base else "")
                + (f", {defaults['kernels'] / kernels:.2f}x their kernels' speed" if base and kernels
                   and defaults.get("kernels") else "") + gpu)

    def optimizers(self):
        """train.py's --benchmark step with --optimizer muon against adamw at both shapes, taking turns; on a GPU
        with the synchronizing CUDA calls of one step of each (none is the aim: the host never waits)."""
        rows, sync = {}, synchronizer(self.device)
        for name in GPU_SHAPES:
            if self.left() <= 0:  # the budget bounds each shape here, not only the section's start
                rows[f"step, {name} shape: Muon vs AdamW"] = "skipped: the budget is spent"
                continue
            torch.compiler.reset()  # the second shape compiled afresh, not as dynamic shapes (see run())
            cfgs = {o: self.benchmark_cfg(name, f"--optimizer={o}") for o in ("adamw", "muon")}
            with torch_settings(cfgs["adamw"]):
                built = {o: train.random_step(cfg) for o, cfg in cfgs.items()}
                steps = {o: step for o, (step, _, _) in built.items()}
                take_turns(steps, config.UNTIMED_STEPS, sync)
                times, gpu = self.timed_turns(steps, sync)
                syncs = {o: cuda_host_syncs(step) for o, step in steps.items()} if self.device == "cuda" else None
                alone = self.optimizer_alone({o: optimizer for o, (_, _, optimizer) in built.items()}, cfgs["muon"])
            adamw, muon = (statistics.median(times[o]) for o in ("adamw", "muon"))
            self.benchmark_tps.setdefault(name, cfgs["adamw"]["batch_size"] * cfgs["adamw"]["context_length"] / adamw)
            line = f"{1000 * muon:.1f} vs {1000 * adamw:.1f} ms/step: Muon's step is {muon / adamw:.3f}x AdamW's"
            line += f"; host syncs in 3 steps: Muon {syncs['muon']}, AdamW {syncs['adamw']}" if syncs else ""
            line += gpu
            print(f"{name}: {line}\n{name}, the optimizer's step alone: {alone}", flush=True)
            rows[f"step, {name} shape: Muon vs AdamW"] = line
            rows[f"step, {name} shape: the optimizer's step alone"] = alone
        return rows

    def optimizer_alone(self, optimizers, cfg):
        """Each optimizer's step alone, over random gradients (its work is the same for any): its kernels' time, and
        Muon's matmuls' rate on Newton-Schulz's FLOPs (accounting.muon_flops), against the whole step's."""
        spent = {}
        for name, optimizer in optimizers.items():
            for p in (p for group in optimizer.param_groups for p in group["params"]):
                p.grad = torch.randn_like(p)
            times, *_ = kernel_times(optimizer.step, self.device, self.profiled)
            matmuls = sum(t for kernel, t in times.items() if kernel_kind(kernel) == "matmul")
            spent[name] = sum(times.values()), matmuls
            optimizer.zero_grad(set_to_none=True)
        (muon, matmuls), (adamw, _) = spent["muon"], spent["adamw"]
        ns = accounting.muon_flops(**cfg)
        rate = f"{ns / matmuls / 1e12:.3g} TFLOP/s" if matmuls else "no matmul kernel seen"
        return (f"Muon {1000 * muon:.2f} ms of kernels (Newton-Schulz's {ns / 1e12:.3g} TFLOP in "
                f"{1000 * matmuls:.2f} ms of matmuls, {rate}; the rest {1000 * (muon - matmuls):.2f} ms), AdamW "
                f"{1000 * adamw:.2f} ms")

    def profiled_step(self, cfg):
        """One compiled step of cfg: (its median time, {kernel: device seconds per step}, kernels per step, where the
        device waited (device_waits), the GPU meanwhile)."""
        sync = synchronizer(self.device)
        with torch_settings(cfg):
            step = train.random_step(cfg)[0]
            take_turns({"step": step}, config.UNTIMED_STEPS, sync)  # graphs, if any, are recorded here: not profiled
            turns, gpu = self.timed_turns({"step": step}, sync)
            times, launches, waits = kernel_times(step, self.device, self.profiled)
        return statistics.median(turns["step"]), times, launches, waits(), gpu

    def profile(self, name):
        """Where one compiled step's time goes at one shape: each kind of kernel's device time (KERNEL_KINDS) against
        the step's own median time; what is left is the GPU waiting for the host. Then the five longest kernels. The
        defaults' kernels are launched one at a time, without CUDA graphs, so that the profiler times each: the
        step's time and its idle share are then those of a step no default runs (graphs replay the launches). Last,
        the defaults' own step, with its graphs: how long the GPU still waits for the host in it."""
        cfg = dict(self.benchmark_cfg(name), cuda_graph=False)
        dt, times, launches, waits, gpu = self.profiled_step(cfg)
        kinds = Counter()
        for kernel, t in times.items():
            kinds[kernel_kind(kernel)] += t
        kinds["the GPU idle (waiting for the host)" if self.device == "cuda" else "not in any op"] = \
            max(dt - sum(times.values()), 0.0)
        spent = ", ".join(f"{kind} {1000 * t:.1f} ms ({t / dt:.0%})" for kind, t in kinds.most_common())
        longest = ", ".join(f"{kernel[:70]} {1000 * t:.2f} ms" for kernel, t in times.most_common(5))
        # the weights' matmuls (all but attention's two), forward and backward, over the matmul kernels' time: their
        # rate inside the step, to hold against a lone matmul's (max-autotune's log) and the peak
        per_seq = accounting.lm_forward_flops_by_component(
            *(cfg[k] for k in ("vocab_size", "context_length", "d_model", "num_layers", "d_ff")), cfg["silu_ffn"])
        weights = sum(per_seq.values()) - per_seq["attn QK^T"] - per_seq["attn AV"]
        flops = accounting.training_step_flops(weights) * cfg["batch_size"]
        rate = f"{flops / kinds['matmul'] / 1e12:.3g} TFLOP/s" if kinds["matmul"] else "no matmul kernel seen"
        spent += f"; {launches:.0f} {'kernels' if self.device == 'cuda' else 'ops'} a step"  # each one's tail costs
        spent += f"; steps back to back (the host ahead, as in train.py's loop): {waits}"
        rows = {f"profile, {name} shape: a step's {1000 * dt:.1f} ms by kind of kernel": spent + gpu,
                f"profile, {name} shape: the weights' matmuls inside the step": f"{flops / 1e12:.3g} TFLOP in "
                f"{1000 * kinds['matmul']:.1f} ms, {rate}",
                f"profile, {name} shape: the five longest kernels, per step": longest,
                f"profile, {name} shape: the defaults' step, with its CUDA graphs": self.profile_graphs(name)}
        for what, line in rows.items():
            print(f"  {what}: {line}", flush=True)
        return rows

    def profile_graphs(self, name):  # the GPU's idle time left in the defaults' step, which replays CUDA graphs
        cfg = self.benchmark_cfg(name)
        if not cfg["cuda_graph"]:
            return "skipped: CUDA graphs need a compiled step on a GPU"
        dt, times, launches, waits, gpu = self.profiled_step(cfg)
        if not times:
            return f"{1000 * dt:.1f} ms a step; the profiler saw no kernel of the graphs' replays" + gpu
        busy = sum(times.values())
        idle = max(dt - busy, 0.0)
        return (f"{1000 * dt:.1f} ms a step, kernels {1000 * busy:.1f} ms, the GPU idle (waiting for the host) "
                f"{1000 * idle:.1f} ms ({idle / dt:.0%}); {launches:.0f} kernels seen; steps back to back: {waits}"
                + gpu)

    def loop(self, name):
        """train.py's real loop at one of GPU_SHAPES, a short run on random ids (no download) in its own process:
        unlike --benchmark, which drains the GPU's queue around each step, the host runs ahead of the GPU here."""
        run, (shape, _) = LOOP[self.cpu], GPU_SHAPES[name][self.cpu]
        with tempfile.TemporaryDirectory() as tmp:
            ids = Path(tmp) / "ids.npy"
            np.save(ids, np.random.default_rng(0).integers(0, shape["vocab_size"], run["ids"], dtype=np.uint16))
            argv = [f"--data={ids}", *self.shape_flags(name), f"--max-iters={run['steps']}",
                    f"--log-interval={run['log']}", f"--eval-interval={run['evals']}", "--eval-iters=5",
                    "--num-samples=0", f"--out-dir={tmp}"]
            print("python train.py " + " ".join(argv), flush=True)
            try:
                p = subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], cwd=tmp, capture_output=True,
                                   text=True, timeout=max(self.left(), 1))
            except subprocess.TimeoutExpired:  # it was killed
                raise RuntimeError(f"train.py was stopped at the {self.budget:g} s budget") from None
            if p.returncode != 0:
                raise RuntimeError(f"train.py exited {p.returncode}: " + (p.stderr or p.stdout).strip()[-300:])
            metrics = Path(tmp) / "ids" / "metrics.jsonl"
            tps, mfu = steady(metrics, run), steady(metrics, run, "mfu")
        line = f"{tps:,.0f} tokens/s{f', MFU {mfu:.1%}' if mfu else ''} over steps {run['skip'] + 1}-{run['steps']}, "
        line += "evaluations' windows left out; "
        yardstick = self.benchmark_tps.get(name)
        line += (f"{tps / yardstick:.2f}x --benchmark's {yardstick:,.0f}" if yardstick
                 else "--benchmark's figure is missing (neither the step nor the optimizers section ran before it)")
        print(line)
        return {f"real loop (train.py), steady, vs --benchmark, {name} shape": line}

    def generate(self):
        args = argparse.Namespace(new_tokens=8 if self.cpu else 256, repeats=1 if self.cpu else 3)
        shape = GPU_SHAPES["TinyStories"][self.cpu][0]
        speed = bench_generate(args, self.device, "tiny" if self.cpu else "TinyStories", shape, compile=not self.cpu,
                               batches=GEN_BATCHES[self.cpu])
        rows = {f"generation, {row}": f"{tps:,.1f} tokens/s" for row, tps in speed.items()}
        looks = bench_stop_checks(args, self.device, shape, compile=not self.cpu)
        rows["generation, batch 1, fast path, tokens between stop checks (model.STOP_CHECK_EVERY)"] = ", ".join(
            f"{k}: {tps:,.0f}" for k, tps in looks.items()) + f" tokens/s (now {model.STOP_CHECK_EVERY})"
        for batch in GEN_BATCHES[self.cpu]:
            rows.setdefault(f"generation, batch {batch}, HF generate, static cache, {hf_step(self.device)}",
                            "skipped: transformers is not installed")
        return rows

    def kernels_table(self):
        small = ["--sizes", "10", "--reps", "2", "--dtypes", "float32"] if self.cpu else []
        with tempfile.TemporaryDirectory() as tmp:
            kernels.main(["--device", self.device, *small, "--json", f"{tmp}/k.json"])
            result = json.loads(Path(f"{tmp}/k.json").read_text())
        return {"kernels.py GELU": result.get("target") or f"ran {', '.join(result['variants'])}; no CUDA kernel"}

    def verify_accounting(self):
        bad = accounting.run_verify()  # its GPU memory check runs wherever CUDA is
        if bad:
            self.failed.append("accounting.py --verify")
        return {"accounting.py --verify": f"{counted(bad, 'mismatch')}, "
                f"{'with' if torch.cuda.is_available() else 'without'} the GPU memory check"}

    def cuda_tests(self):
        """pytest -k --tests as a process, its line for each test printed as it comes (a run cut at the
        budget still names its failures) -> the count of each outcome."""
        argv = [sys.executable, "-m", "pytest", "-v", "-rfE", "--durations=5", "-p", "no:cacheprovider", TESTS, "-k",
                self.tests]
        print(" ".join(argv[1:]), flush=True)
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "COLUMNS": "200"})  # skip reasons in full, not cut at 80 columns
        timer = threading.Timer(max(self.left(), 1), p.kill)
        timer.start()
        outcomes = Counter()
        try:
            for line in p.stdout:
                if m := TEST_LINE.match(line):
                    print(line.rstrip(), flush=True)
                    if m[1]:  # not the summary's FAILED lines, which repeat a test with its error
                        outcomes[m[1]] += 1
                elif SLOW_LINE.match(line):
                    print("  " + line.rstrip(), flush=True)
        finally:
            timer.cancel()
            p.kill()  # a no-op when it ended; the child never outlives the report
        rc = p.wait()
        counts = ", ".join(f"{n} {o.lower()}" for o, n in outcomes.items())
        if rc < 0 and self.left() <= 0:
            line = f"{counts or 'no test finished'}, cut short at the budget"
        elif rc == 5:  # pytest's "no tests collected"
            line = f"no test matched -k {self.tests!r}"
        else:  # 1: a test failed (named above); 2-4: pytest's own fault (a collection error)
            line = (counts or "no test ran") + ("" if rc in (0, 1) else f", pytest exited {rc}")
        if rc != 0:
            self.failed.append("tests")
        return {f"tests touching CUDA (pytest -k {self.tests!r})": line}

    def run(self):
        """Every section in turn (none starts once the budget is spent), then the table. -> exit code."""
        sections = {("step", "the training step, TinyStories shape"): lambda: self.step("TinyStories"),
                    ("step", "the training step, GPT-2-small shape"): lambda: self.step("GPT-2 small"),
                    ("optimizers", "the training step with Muon against AdamW"): self.optimizers,
                    ("head", "the fused head alone"): self.head,
                    ("gate", "SwiGLU's gate alone"): self.gate,
                    ("levers", "the levers, GPT-2-small shape"): lambda: self.levers("GPT-2 small"),  # issue 49's
                    ("levers", "the levers, TinyStories shape"): lambda: self.levers("TinyStories"),  # MFU target first
                    ("profile", "where a step's time goes, GPT-2-small shape"): lambda: self.profile("GPT-2 small"),
                    ("profile", "where a step's time goes, TinyStories shape"): lambda: self.profile("TinyStories"),
                    ("autotune", "max-autotune, GPT-2-small shape"): lambda: self.levers("GPT-2 small", AUTOTUNE),
                    ("autotune", "max-autotune, TinyStories shape"): lambda: self.levers("TinyStories", AUTOTUNE),
                    ("loop", "the real loop, GPT-2-small shape"): lambda: self.loop("GPT-2 small"),
                    ("loop", "the real loop, TinyStories shape"): lambda: self.loop("TinyStories"),
                    ("generation", "generation"): self.generate,
                    ("kernels", "kernels.py"): self.kernels_table,
                    ("accounting", "accounting.py --verify"): self.verify_accounting,
                    ("tests", "tests touching CUDA"): self.cuda_tests}
        self.rows["levers on by default (train.py's flags)"] = levers_by_default()
        self.watch = GpuWatch(self.device)
        try:
            return self.run_sections(sections)
        finally:
            self.watch.stop()

    def run_sections(self, sections):  # {(key, title): section} -> exit code, after the table
        chosen = [((key, title), s) for (key, title), s in sections.items() if key in self.sections]  # --sections
        for (key, title), section in sorted(chosen, key=lambda c: list(self.sections).index(c[0][0])):  # its order
            print(f"\n## {title}", flush=True)
            if self.left() <= 0:
                self.rows[title] = f"skipped: the {self.budget:g} s budget was spent"
                print(self.rows[title])
                continue
            start, before = time.perf_counter(), len(self.rows)
            try:
                self.rows.update(section())
            except Exception as e:  # whatever failed (CUDA, a compiler, a peer), the next section still runs
                self.rows[title] = f"failed: {error_line(e)}"
                self.failed.append(title)
                print(self.rows[title])
            for what, result in list(self.rows.items())[before:]:  # the table's rows so far: a report stopped from
                print(f"| {what} | {result.replace('|', '/')} |")    # outside (a rented GPU's limit) keeps them
            # the next section compiles afresh (a second shape would otherwise be compiled as dynamic shapes), and the
            # GPU memory of this one's models (held by the traceback until here, after a failure) goes back
            torch.compiler.reset()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            print(f"({title}: {time.perf_counter() - start:.0f} s{self.gpu_during(start)})", flush=True)
        return self.table()

    def table(self):
        """The one table docs/results.md's GPU section pastes: its date, commit and device above it. -> exit code."""
        device = (torch.cuda.get_device_name(0) if self.device == "cuda"
                  else f"CPU ({usable_cores()} cores), a rehearsal at tiny sizes: no figure here is one to quote")
        print("\n## The table (docs/results.md's GPU section)\n")
        print(f"`{self.command}`, {time.strftime('%Y-%m-%d')}, commit "
              f"{git_commit()}, {device}, torch {torch.__version__}, {(time.perf_counter() - self.t0) / 60:.1f} min\n")
        print("| what | result |\n|---|---|")
        for what, result in self.rows.items():
            print(f"| {what} | {result.replace('|', '/')} |")
        if self.failed:
            print(f"\nfailed: {', '.join(self.failed)}")
        return 1 if self.failed else 0


def bench_gpu(argv):
    ap = Parser(prog="bench.py gpu", description="Every GPU figure of this project in one command (at most --budget "
                "seconds on one GPU, and a section running then), ending in the table docs/results.md's GPU section "
                "quotes.")
    ap.add_argument("--cpu", action="store_true", help="rehearse on the CPU at tiny sizes; what needs a GPU "
                    "(torch.compile, bf16, compiled AdamW, CUDA kernels and tests) is skipped")
    ap.add_argument("--budget", type=float, default=480, help="seconds: no section starts after them, and the "
                    "loop's and the tests' processes are stopped at them (default 480)")
    ap.add_argument("--steps", type=int, help="timed steps per model and shape (default 30; 3 with --cpu)")
    ap.add_argument("--tests", default=CUDA_TESTS, help=f"pytest -k expression of the tests run (default {CUDA_TESTS})")
    ap.add_argument("--sections", type=lambda text: text.split(","), default=list(SECTIONS),
                    help=f"the sections run, in the order given (default all: {','.join(SECTIONS)}); e.g. "
                    "head,levers for the fast path's levers alone")
    ap.add_argument("--levers", type=lambda text: [w for w in text.split(",") if w], help="the levers section's "
                    "levers beside the defaults, by a word of their row (default all); e.g. cuda-graph,cudnn")
    args = ap.parse_args(argv)
    if args.levers == []:  # '' is in every row's name: it would choose them all
        raise UsageError("--levers is blank; name the levers by a word of their rows, such as cuda-graph.")
    if unknown := [w for w in args.levers or [] if not any(w in lever for lever, flags in LEVERS.items() if flags)]:
        raise UsageError(f"--levers {','.join(args.levers)}: {unknown[0]!r} names none of the levers "
                         f"({', '.join(' '.join(flags) for flags in LEVERS.values() if flags)}).")
    if unknown := [x for x in args.sections if x not in SECTIONS]:
        raise UsageError(f"--sections {','.join(args.sections)}: {unknown[0]!r} is not one of {','.join(SECTIONS)}.")
    if not args.cpu and not torch.cuda.is_available():
        raise UsageError("bench.py gpu needs a CUDA GPU and torch sees none here; pass --cpu to rehearse it on "
                         "the CPU.")
    if not 0 < args.budget <= 1e6:  # nan too; past 2.1e6 s, subprocess's and threading's timeouts overflow
        raise UsageError(f"--budget {args.budget:g} must be positive and at most 1e6: seconds, such as 480.")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be positive.")
    if not args.tests.strip():  # pytest -k '' selects every test, not none
        raise UsageError("--tests is blank, which pytest reads as every test; give a -k expression such as cuda.")
    args.steps, args.command = args.steps or (3 if args.cpu else 30), shlex.join(["python", "bench.py", "gpu", *argv])
    print(f"# bench.py gpu, {time.strftime('%Y-%m-%d %H:%M')}, budget {args.budget:g} s, {args.steps} timed steps"
          + (" (--cpu: a rehearsal at tiny sizes; torch.compile, bf16 autocast, compiled AdamW, the CUDA kernels, the "
             "GPU memory check and the CUDA tests' bodies are skipped)" if args.cpu else ""), flush=True)
    return GpuReport(args).run()


# ----------------------------------------------------------------------------
# Command line

def megabytes(text):  # a flag's megabytes: 0.001 or more (argparse's float would take nan, inf and -3; a corpus
    if not regex.fullmatch(r"\d*\.?\d+", text) or float(text) < 0.001:  # under a word long was cut to nothing)
        raise argparse.ArgumentTypeError(f"wants megabytes of at least 0.001 (1 kB), like 50 or 0.5, not {text!r}")
    return float(text)


# the tables that read each flag: one given to a table that does not read it is refused, not ignored (`bench.py cold
# --sizes 1` ran on its 5 MB corpus; `generate --input x` did not look at x)
READ_BY = {"input": ("train", "cold", "encode"), "sizes": ("train",), "vocab_size": ("train",),
           "encode_mb": ("encode",), "repeats": ("train", "encode", "generate", "head"), "new_tokens": ("generate",), "rows": ("head",)}


def check_room(args):
    """Refuse scale corpora that do not fit the disk before a byte is written: a full disk stops every program that
    writes to it, not this one alone."""
    flags = {"--sizes": args.sizes if args.what in ("train", "all") and not args.input else [],
             "--encode-mb": [args.encode_mb] if args.what in ("encode", "all") else []}
    new = {mb for mbs in flags.values() for mb in mbs if not corpus_path(mb).is_file()}
    free = shutil.disk_usage(next(p for p in (CACHE, *CACHE.parents) if p.exists())).free
    if sum(new) * 1e6 > free:
        raise UsageError(f"{'/'.join(f for f, mbs in flags.items() if mbs)}: the scale corpora to build need "
                         f"{sum(new):,.0f} MB in {CACHE}, and its disk has {free / 1e6:,.0f} MB free; ask for less.")


def reads(flag, text):  # a flag's --help: the tables that read it (READ_BY), then what it is
    return f"{', '.join(READ_BY[flag])}: {text}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    allow_many_compiles()  # each lever, shape and chunk count is a graph of one function: none may run eagerly
    if argv[:1] == ["step"]:  # the rest are train.py's flags
        return bench_step(argv[1:])
    if argv[:1] == ["gpu"]:  # its own flags
        return bench_gpu(argv[1:])
    tables = {"train": bench_train, "cold": bench_cold, "encode": bench_encode,
              "step": lambda args: bench_step([]), "head": bench_head, "generate": bench_generate}
    ap = Parser(prog="bench.py", description="Comparisons with other tools (`bench.py step` takes "
                "train.py's flags instead of these; `bench.py gpu --help` has its own).")
    ap.add_argument("what", nargs="?", default="all", choices=["all", *tables, "gpu"],
                    help="all: every table below but gpu (docs/results.md); train: BPE "
                    "training against HF tokenizers and rustbpe; cold: first runs, empty numba cache; encode: against "
                    "tiktoken; step: the training step against HF Llama; head: the fused head's chunk counts, time "
                    "and peak memory, then a GPT-2-small step's peak (minutes on a CPU, whatever --rows); generate: generation; gpu: every GPU figure, "
                    "no section started after --budget seconds (its own --help)")
    ap.add_argument("--input", type=user_path, help=reads("input", "a UTF-8 text file instead of the scale corpora "
                                                          "(train) or shakespeare.txt"))
    ap.add_argument("--sizes", type=lambda text: [megabytes(s) for s in text.split(",")], default="50,200",
                    help=reads("sizes", "scale corpora in MB, e.g. 50,200,2000"))
    ap.add_argument("--vocab-size", type=int, default=32_000, help=reads("vocab_size", "vocabulary size"))
    ap.add_argument("--encode-mb", type=megabytes, default=50,
                    help=reads("encode_mb", "size of the scale corpus for encode_file"))
    ap.add_argument("--repeats", type=int, default=3, help=reads("repeats", "runs per tool, alternating"))
    ap.add_argument("--new-tokens", type=int, default=256, help=reads("new_tokens", "tokens to generate"))
    ap.add_argument("--rows", type=int, default=2048, help=reads("rows", "rows of the hidden state (batch x context)"))
    args, defaults = ap.parse_args(argv), ap.parse_args([])
    for flag, readers in READ_BY.items():
        if args.what not in ("all", *readers) and getattr(args, flag) != getattr(defaults, flag):
            raise UsageError(f"--{flag.replace('_', '-')} is read by {'/'.join(readers)} only, not by bench.py "
                             f"{args.what}; drop it.")
    if args.input and args.sizes != defaults.sizes and args.what in ("train", "all"):  # train reads one of the two
        raise UsageError("--sizes: bench.py train times --input's text, not scale corpora; drop one of the two.")
    if args.input == "":  # read as no --input: the tables ran on the full-size corpora instead
        raise UsageError("--input is blank; name a UTF-8 text file, or drop --input for the scale corpora.")
    for flag, least in {"vocab_size": MIN_TEXT_VOCAB, "repeats": 1, "new_tokens": 1, "rows": 1}.items():
        if getattr(args, flag) < least:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)} is below {least}"
                             + (f": the 256 byte values and {EOT} come first" if least > 1 else ""))
    if args.new_tokens > (room := accounting.TINYSTORIES["context_length"]):  # then each token re-runs the window
        raise UsageError(f"--new-tokens {args.new_tokens} is past the {room} tokens the TinyStories shape's context "
                         "holds after the prompt, where the table times generation from the cache; ask for at most "
                         f"{room}.")
    V, (have, what) = GPT2_SMALL["vocab_size"], memory_bytes("cpu", 1)  # past it: killed, not refused, before
    if args.what in ("head", "all") and (need := 3 * accounting.FP32_BYTES * args.rows * V) > have:
        raise UsageError(f"--rows {args.rows:,}: the eager head alone holds three {args.rows:,} x {V:,} float32 arrays "
                         f"(logits, their softmax, their gradient), {need / 2**30:.1f} GiB, more than {what} "
                         f"({have / 2**30:.1f} GiB); pass fewer --rows.")
    check_room(args)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}, "
          f"{usable_cores()} CPUs, Python {sys.version.split()[0]}", flush=True)
    for what in tables if args.what == "all" else [args.what]:
        tables[what](args)
        print(flush=True)
    return 0


if __name__ == "__main__":
    end_quietly_on_closed_pipe()
    cli.catch_ctrl_c()  # a stop from here on: KeyboardInterrupt, then one line (exit_code)
    cli.exit_quietly(exit_code("bench.py", main, "only whole files were left."))
