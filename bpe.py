"""
Byte-level BPE, the tokenizer of GPT-2, from scratch (CS336 assignment 1, section 2).

Training starts from the 256 byte values and repeatedly fuses the most frequent adjacent pair into a new token;
encoding replays the learned merges in order. In reading order: why bytes (Unicode and UTF-8), the GPT-2
pre-tokenizer, the naive trainer (the definition), the incremental trainer, train_bpe, GPT-2's file format, the
Tokenizer with a plain encode, the command line. The engine, bpe_fast.py, takes over big jobs at a few marked
calls; test_all.py checks that it gives the same pre-tokens, merges and ids.

Run:  python bpe.py train corpus.txt --vocab-size 10000 --special-tokens '<|endoftext|>' --out tok
      python bpe.py encode corpus.txt --tokenizer tok --out ids.npy
"""

import heapq
import json
import os
import re
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import cli  # the standard library only, so it loads first: a Ctrl-C while numba loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("bpe.py")
import files  # noqa: E402 (the standard library only, as cli)
import machine  # noqa: E402
machine.numba_cache_fallback(os.path.dirname(os.path.abspath(__file__)))     # before numba loads
import numpy as np
import regex

import bpe_fast
from bpe_fast import encode_file

# -----------------------------------------------------------------------------
# 1. Why bytes: Unicode and UTF-8 (handout 2.1-2.2)

def unicode_answers():
    r"""The handout's problems unicode1 and unicode2, answered by running them (test_all.py runs these lines).
    unicode1: chr(0) is U+0000, NULL, a control character with no glyph; its repr shows the escape, while printing
    writes the one invisible character, so in text it is carried along unseen (and to BPE it is just byte 0).
    >>> chr(0), "this is a test" + chr(0) + "string"
    ('\x00', 'this is a test\x00string')

    unicode2 (a): UTF-8 spends one byte on an ASCII character where UTF-16 and UTF-32 spend 2 and 4, most of them
    zeros, so on mostly-ASCII text (code, English, markup) its sequences are the shortest (a kana takes 3 bytes
    against UTF-16's 2), it has no byte order to mark, and most text is UTF-8 already.
    >>> [len("hello! こんにちは!".encode(e)) for e in ("utf-8", "utf-16-le", "utf-32-le")]
    [23, 26, 52]

    (b) decoding byte by byte fails on any character of several bytes, since no byte of one is a character alone:
    >>> "".join(bytes([b]).decode("utf-8") for b in "é".encode("utf-8"))
    Traceback (most recent call last):
    UnicodeDecodeError: 'utf-8' codec can't decode byte 0xc3 in position 0: unexpected end of data

    (c) b"\xc3\x28": 0xc3 opens a character of two bytes, whose second must be a continuation byte (0x80-0xbf):
    >>> b"\xc3\x28".decode("utf-8")
    Traceback (most recent call last):
    UnicodeDecodeError: 'utf-8' codec can't decode byte 0xc3 in position 0: invalid continuation byte
    """


# -----------------------------------------------------------------------------
# 2. Pre-tokenization and special tokens

# GPT-2's pre-tokenizer (handout 2.4): contractions, optional space + letters / digits /
# punctuation, whitespace not followed by a non-space (" word" keeps its space), whitespace.
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PRETOKEN_RE = regex.compile(GPT2_PAT)
# The same pattern for ASCII text, which the standard library's re runs faster (same pre-tokens).
_ASCII_PRETOKEN_RE = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""",
                                re.ASCII)


def pretokenize(text):
    """The GPT-2 pre-tokens of text (no special tokens in it), as a list of strings."""
    return (_ASCII_PRETOKEN_RE if text.isascii() else _PRETOKEN_RE).findall(text)


def _special_split_re(special_tokens):
    """split() cuts at special tokens, longest first ('<|eot|><|eot|>' before '<|eot|>')."""
    if not special_tokens:
        return None
    alts = sorted(special_tokens, key=len, reverse=True)
    return regex.compile("(" + "|".join(regex.escape(s) for s in alts) + ")")


# -----------------------------------------------------------------------------
# 3. The naive trainer: the definition of BPE training
#
# Count every adjacent pair inside every pre-token (weighted by the pre-token's count),
# fuse the most frequent pair everywhere, repeat; a tie goes to the lexicographically
# greater pair. Slow (it recounts everything per merge) but checkable by eye: every other
# trainer is tested to learn exactly its merges.

def _merge(seq, pair, new):
    """seq with each pair, left to right, replaced by new: _merge((1, 2, 1, 2, 2), (1, 2), 9) -> (9, 9, 2)."""
    out, i = [], 0
    while i < len(seq):
        hit = seq[i:i + 2] == pair
        out.append(new if hit else seq[i])
        i += 2 if hit else 1
    return tuple(out)


def train_bpe_naive(text, vocab_size, special_tokens=()):
    """BPE training on a string, by the definition. Returns (vocab, merges) as train_bpe."""
    special_tokens = bpe_fast.checked_special_tokens(special_tokens)
    split_re = _special_split_re(special_tokens)
    words = Counter()                 # pre-token as a tuple of tokens (bytes) -> count
    for part in (split_re.split(text)[::2] if split_re else [text]):  # specials dropped
        for w in _PRETOKEN_RE.findall(part):
            words[tuple(bytes([b]) for b in w.encode("utf-8"))] += 1
    vocab = {i: bytes([i]) for i in range(256)}
    for b in bpe_fast.new_special_tokens(special_tokens):   # one of one byte has its byte's id
        vocab[len(vocab)] = b
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()             # pairs never cross pre-tokens
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))    # ties: the greater (left, right)
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged = Counter()
        for w, c in words.items():
            merged[_merge(w, best, best[0] + best[1])] += c
        words = merged
    return vocab, merges


# -----------------------------------------------------------------------------
# 4. The incremental trainer: the same merges without recounting everything
#
# Each distinct pre-token ("word") is stored once, with its count. A merge (a, b) -> t changes
# only the words that contain (a, b), and in them only the pairs around it:
# (x, a)(a, b)(b, y) -> (x, t)(t, y). So the trainer keeps, across merges:
# - counts: {pair: count}, the naive trainer's pair counts, kept up to date;
# - where: {pair: the words that contain it}; a word that has since lost the pair stays listed;
# - heap: heapq's min-heap of (-count, pair), so the greatest count is on top. A count that changes
#   is pushed again, not found and fixed (lazy deletion): a stale entry is dropped when on top.
# A merge takes its words' pairs out of the counts, merges each word and puts its pairs back.
# Big jobs take the engine's compiled loop instead (bpe_fast.py), tested to learn the same merges.

def _pop_best(heap, counts, tokens):
    """The pair to merge next, or None when none is left: every live pair of the greatest count is popped (a stale
    entry, whose count has changed since it was pushed, is dropped on the way), the greatest bytes win (the naive
    trainer's tie-break), and the others go back."""
    top, count = set(), None                           # the live pairs of the greatest count (a copy counts once)
    while heap and (count is None or heap[0][0] == count):
        c, pair = heapq.heappop(heap)
        if -c == counts[pair]:
            top.add(pair)
            count = c
    if not top:
        return None
    best = max(top, key=lambda pair: (tokens[pair[0]], tokens[pair[1]]))
    for pair in top - {best}:
        heapq.heappush(heap, (count, pair))
    return best


def _count_pairs(word, weight, counts):
    """Add weight to the count of each adjacent pair of word."""
    for pair in zip(word, word[1:]):
        counts[pair] += weight


def _merge_loop(ids, word_start, word_count, num_merges):
    """Up to num_merges merges as (lefts, rights), (M,) int64 each; merge m makes token 256 + m.
    ids: (P,) the bytes of all words end to end; word_start: (W+1,) offsets; word_count: (W,)
    occurrences. [b"low" x5, b"lowest" x2] -> first merge (o, w): 7 times, as (l, o), but greater."""
    words = [tuple(ids[s:e].tolist()) for s, e in zip(word_start[:-1], word_start[1:])]
    word_count, counts, where = word_count.tolist(), defaultdict(int), defaultdict(set)
    for w, word in enumerate(words):
        _count_pairs(word, word_count[w], counts)
        for pair in zip(word, word[1:]):
            where[pair].add(w)
    tokens = [bytes([b]) for b in range(256)]          # the bytes of each token
    heap = [(-c, p) for p, c in counts.items() if c > 0]
    heapq.heapify(heap)
    merges = []
    while len(merges) < num_merges and (pair := _pop_best(heap, counts, tokens)):
        t = len(tokens)
        merges.append(pair)
        tokens.append(tokens[pair[0]] + tokens[pair[1]])
        changes = defaultdict(int)                      # this merge's changes of counts (its own pair's: to 0)
        for w in where.pop(pair):
            _count_pairs(words[w], -word_count[w], changes)
            words[w] = _merge(words[w], pair, t)
            _count_pairs(words[w], word_count[w], changes)
            for p in zip(words[w], words[w][1:]):     # the new pairs list this word
                if t in p:
                    where[p].add(w)
        for p, d in changes.items():
            counts[p] += d
            if d and counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
    return tuple(np.array([m[k] for m in merges], np.int64) for k in (0, 1))


# -----------------------------------------------------------------------------
# 5. train_bpe

def _read_text(path, what):
    """The file as str; a missing file or a decoding error (its byte offset) is named."""
    bpe_fast.check_readable(path, what)
    with open(path, "rb") as f:
        return bpe_fast.check_utf8(f.read(), path, 0)


@cli.ctrl_c_stays_keyboard_interrupt      # numba holds a Ctrl-C back: raised on return
def train_bpe(input_path, vocab_size, special_tokens=(), num_workers=None):
    """Train byte-level BPE on a UTF-8 file, counting pre-tokens (from 1 MiB in num_workers
    processes, default one per core it may use). Returns vocab {id: bytes} (0-255 the bytes,
    then the special tokens of 2+ bytes, then one per merge) and merges [(left bytes, right bytes)] in order."""
    special_tokens = bpe_fast.checked_special_tokens(special_tokens)
    bpe_fast.check_vocab_size(vocab_size, special_tokens)
    bpe_fast.worker_count(num_workers)           # checked here too: a small file never uses them
    if bpe_fast.check_input_file(input_path) >= bpe_fast.COMPILED_COUNT_MIN and bpe_fast.JIT:
        # The engine counts with a compiled scanner in worker processes, into hash tables
        # keyed by the pre-tokens' bytes; it gives the same counts, as the loop's arrays.
        words = bpe_fast.count_words(input_path, special_tokens, num_workers, vocab_size)
        return _train_from_words(*words, vocab_size, special_tokens)
    return train_from_counts(count_pretokens(input_path, special_tokens), vocab_size, special_tokens)


def count_pretokens(input_path, special_tokens=()):
    """{pre-token string: count} over the whole file (special tokens split it, uncounted)."""
    split_re = _special_split_re(bpe_fast.checked_special_tokens(special_tokens))
    text = _read_text(input_path, "input file")
    return Counter(w for part in (split_re.split(text)[::2] if split_re else [text]) for w in pretokenize(part))


def train_from_counts(counts, vocab_size, special_tokens=(), loop=None):
    """The merge half of train_bpe, from {pre-token str: count}. loop: the merge loop to run
    (_merge_loop, or bpe_fast.merge_loop: the same merges); None picks one."""
    special_tokens = bpe_fast.checked_special_tokens(special_tokens)
    bpe_fast.check_vocab_size(vocab_size, special_tokens)
    encoded = bpe_fast.encoded_counts(counts)
    words = [w for w, _ in encoded if len(w) > 1]          # one byte has no pair
    word_count = np.array([c for w, c in encoded if len(w) > 1], dtype=np.int64)
    word_start = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum([len(w) for w in words], out=word_start[1:])
    ids = np.frombuffer(b"".join(words), dtype=np.uint8).copy()  # writable: one numba type
    return _train_from_words(ids, word_start, word_count, vocab_size, special_tokens, loop)


def _train_from_words(ids, word_start, word_count, vocab_size, special_tokens, loop=None):
    """train_from_counts from the merge loop's input arrays (see _merge_loop), special_tokens checked."""
    longest = bpe_fast.check_longest_word(word_start, "the training text")  # a huge word could exhaust memory
    specials = bpe_fast.new_special_tokens(special_tokens)   # their ids come before merges (one byte: its byte's)
    # each merge joins at least one pair of positions, so there can be no more merges than pairs
    num_merges = max(0, min(vocab_size - 256 - len(specials), len(ids) - len(word_count)))
    # A small job's first merges are _merge_loop's, as plain Python (how many: bpe_fast.interpreted_merges); if
    # pairs are left then, the engine's compiled loop (data laid out for the caches, only the pairs next to a merge
    # changed) learns the same merges, all of them from the first.
    first = 0 if loop else bpe_fast.interpreted_merges(len(ids), num_merges, longest)  # merges tried as Python
    lefts, rights = _merge_loop(ids, word_start, word_count, first) if first else (np.empty(0, np.int64),) * 2
    if len(lefts) == first < num_merges:  # none tried, or pairs left after them
        lefts, rights = (loop or bpe_fast.load_merge_loop())(ids, word_start, word_count, num_merges)
    tokens = [bytes([b]) for b in range(256)]          # internal id -> bytes
    merges = []
    for a, b in zip(lefts.tolist(), rights.tolist()):
        merges.append((tokens[a], tokens[b]))
        tokens.append(tokens[a] + tokens[b])
    return dict(enumerate(tokens[:256] + specials + tokens[256:])), merges


# -----------------------------------------------------------------------------
# 6. The GPT-2 file format, and the checks of a Tokenizer's inputs
#
# GPT-2 writes every byte as a printable character so that vocab.json and merges.txt are
# plain text: the 188 printable Latin-1 bytes stand for themselves, the other 68 (control
# characters, space, ...) move to U+0100 and up. A space becomes 'Ġ' and a newline 'Ċ',
# so "left right" in merges.txt never meets a real space.

_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_BYTE_TO_CHAR = {b: chr(b) for b in _PRINTABLE} | {
    b: chr(256 + k) for k, b in enumerate(b for b in range(256) if b not in _PRINTABLE)}
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _token_to_str(tok):
    return "".join(_BYTE_TO_CHAR[b] for b in tok)


def _str_to_token(s, where):
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in s)
    except KeyError as e:
        raise ValueError(f"{where}: character {e.args[0]!r} in token {s!r} is not in the GPT-2 byte alphabet") from None


_BOM = "\ufeff"    # a byte-order mark that a Windows editor puts first in vocab.json or merges.txt: not a token


def _short(text, count=True):
    """text for a message, its middle cut out when long (a token can be a megabyte), then followed by its length."""
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]}" + (f" ({len(text):,} chars)" if count else "")


def _show(tok):
    """A token (bytes, or str as the files write it) for a message."""
    return _short(repr(_token_to_str(tok) if isinstance(tok, bytes) else tok))


def _load_vocab_file(path):
    """A GPT-2 vocab.json as {id: bytes}; a token written twice is refused (json would keep one of its ids)."""
    raw = files.load_json(_read_text(path, "vocab file").removeprefix(_BOM), path, key="token")
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object mapping token strings to ids")
    vocab = {}
    for n, (s, i) in enumerate(raw.items()):
        vocab[bpe_fast.check_id(i, lambda: f"{path}: token {_show(s)}")] = _str_to_token(s, path)
        if len(vocab) != n + 1:
            raise ValueError(f"{path}: id {i} is used by two tokens")
    return vocab


def _check_merges(merges, vocab, special_tokens, in_file=None):
    """The one check that merges fit a vocab {id: bytes} (a token at two ids: the lower one's): (1) left, right
    and left + right of every merge are in the vocab; (2) in id order, the vocab's merged tokens (2+ bytes, two
    tokens of lower id joined, not a declared special token) are what the merges make, in order. So train_bpe's files
    and GPT-2's (<|endoftext|> after the merges) pass; swapped, missing or cut merges fail. in_file(k) names merge
    k's line in a file (in_file(None): the file); in memory, merges may be the first few of the vocab's.
    Returns the special tokens not declared: the vocab's tokens of 2+ bytes that no merge makes."""
    where, vocab_name = in_file or (lambda k: f"merge #{k}"), "the vocab file" if in_file else "the vocab"
    token_id = {t: i for i, t in sorted(vocab.items(), reverse=True)}  # the inverse, lowest id wins
    made, disagree = [left + right for left, right in merges], "; vocab and merges disagree"
    for k, (left, right) in enumerate(merges):
        for tok in (left, right, made[k]):
            if tok not in token_id:
                raise ValueError(f"{where(k)}: token {_show(tok)} is not in {vocab_name}{disagree}")
    specials = {s.encode("utf-8") for s in special_tokens}
    # a special token never takes part in a merge (with none: is no token's start, which most merged tokens are)
    operands = {t for pair in merges for t in pair} or {u[:n] for u in token_id for n in range(1, len(u))}
    lengths = sorted({len(b) for b in token_id})

    def made_of_two(t, i):           # t joins two tokens whose ids are below i
        return any(token_id.get(t[:n], i) < i and token_id.get(t[n:], i) < i for n in lengths if 0 < n < len(t))

    k, undeclared = 0, []
    for i, t in sorted(vocab.items()):
        if len(t) < 2 or token_id[t] != i:             # a byte, or a repeat of a token
            continue
        if k < len(made) and t == made[k]:
            if max(token_id[merges[k][0]], token_id[merges[k][1]]) > i:
                raise ValueError(f"{where(k)}: the merge makes {_show(t)} (id {i}) from a "
                                 f"token of higher id{disagree} (merges out of order)")
            k += 1
        elif t in specials or not made_of_two(t, i) or k == 0 and t not in operands:
            undeclared += [] if t in specials else [t]  # a special token, declared or not (train_bpe's: before merges)
        elif k < len(made):
            raise ValueError(f"{where(k)}: the merge makes {_show(made[k])} but the next "
                             f"merged token in {vocab_name} is id {i} {_show(t)}{disagree} (a "
                             "merge missing or out of order, or a special token not declared)")
        elif in_file:
            raise ValueError(f"{where(None)} ends after {k} merges but {vocab_name} has more "
                             f"merged tokens from id {i} {_show(t)} on{disagree} (merges cut "
                             "short, or a special token not declared)")
        else:
            break                                      # the rest is for later merges
    if k < len(made):
        raise ValueError(f"{where(k)}: the merge makes {_show(made[k])}, id "
                         f"{token_id[made[k]]} in {vocab_name}, out of id order{disagree}")
    return undeclared


def _read_merges_file(path):
    """A GPT-2 merges.txt as ([(left, right)], in_file): in_file(k) names merge k's line (None: the
    file) for the errors of _check_merges, which Tokenizer runs once."""
    merges, linenos = [], []
    for lineno, line in enumerate(_read_text(path, "merges file").removeprefix(_BOM).splitlines(), 1):
        if (lineno == 1 and line.startswith("#version")) or line == "":
            continue
        if len(parts := line.split(" ")) != 2 or not all(parts):
            raise ValueError(f"{path} line {lineno}: expected 'left right', got {line!r}")
        merges.append(tuple(_str_to_token(p, f"{path} line {lineno}") for p in parts))
        linenos.append(lineno)
    return merges, lambda k: path if k is None else f"{path} line {linenos[k]}"


# -----------------------------------------------------------------------------
# 7. Tokenizer

_CACHE_LIMIT = 1 << 16   # pre-tokens remembered; bounded so that streaming stays O(1)
_PLAIN_WORD_CHARS = 1_000   # a longer pre-token goes to the engine: the definition rescans it once per merge
_STREAM_CHARS = 1 << 14  # encode_iterable encodes the text in batches of about this size


class Tokenizer:
    """Encode text to ids and back with a given vocab {id: bytes} and ordered merges. Bytes and special tokens may
    have any ids; merged tokens take theirs in the order of the merges that make them (train_bpe's and GPT-2's do),
    which is how a vocab and merges that do not belong together are told apart."""

    def __init__(self, vocab, merges, special_tokens=None, *, _in_file=None):
        """_in_file: set when vocab and merges come from files (from_files): then the merges must
        make every merged token, and an error names the file and line (see _check_merges)."""
        self.merges = bpe_fast.checked_merges(vocab, merges)  # their types, before vocab.items()
        self.vocab = {bpe_fast.check_id(i, lambda: f"vocab token {_short(repr(b))}"): b  # a copy
                      for i, b in vocab.items()}
        self.special_tokens = bpe_fast.checked_special_tokens(special_tokens)
        have, new = set(self.vocab.values()), [s.encode("utf-8") for s in self.special_tokens]  # (distinct)
        # as the handout asks: special tokens the vocab lacks are appended, after its highest id
        self.vocab.update(enumerate([b for b in new if b not in have], max(self.vocab, default=-1) + 1))
        token_id = {b: i for i, b in sorted(self.vocab.items(), reverse=True)}  # lowest id wins
        if (missing := next((b for b in range(256) if bytes([b]) not in token_id), None)) is not None:
            raise ValueError(f"the vocab lacks the single byte 0x{missing:02x}; a byte-level vocab needs all 256")
        self._undeclared = _check_merges(self.merges, self.vocab, self.special_tokens, _in_file)
        self._byte_ids = [token_id[bytes([b])] for b in range(256)]
        self._special_ids = {s: token_id[s.encode("utf-8")] for s in self.special_tokens}
        self._split_re = _special_split_re(self.special_tokens)
        # {(left id, right id): (rank, merged id)}, rank = place in merges (the first, if repeated)
        self._merge_rank = {}
        for rank, (left, right) in enumerate(self.merges):
            self._merge_rank.setdefault((token_id[left], token_id[right]), (rank, token_id[left + right]))
        self._cache, self._plain_chars = {}, 0
        self._engine = bpe_fast.Encoder(self._byte_ids, self._merge_rank,    # (see encode)
                                        {s.encode("utf-8"): i for s, i in self._special_ids.items()})

    @classmethod
    def from_files(cls, vocab_filepath, merges_filepath, special_tokens=None):
        vocab = _load_vocab_file(vocab_filepath)
        merges, in_file = _read_merges_file(merges_filepath)
        return cls(vocab, merges, special_tokens, _in_file=in_file)

    def save(self, vocab_filepath, merges_filepath):
        """GPT-2 format; both files are written whole before either replaces the old one, if from_files reads them
        (given the same special_tokens: GPT-2's files cannot mark one that is two of the vocab's tokens joined)."""
        inv = {_token_to_str(self.vocab[i]): i for i in sorted(self.vocab)}
        if len(inv) < len(self.vocab):         # a token at two ids (in memory): inv keeps the higher, a file only one
            i, t = min((i, t) for i, t in self.vocab.items() if inv[_token_to_str(t)] != i)
            raise ValueError(f"not saved: token {_show(t)} has ids {i} and {inv[_token_to_str(t)]}; vocab.json has one")
        # merges cut short in memory: from_files would refuse them
        _check_merges(self.merges, self.vocab, self.special_tokens, lambda k: f"not saved: {merges_filepath}")
        lines = ["#version: 0.2"] + [f"{_token_to_str(l)} {_token_to_str(r)}" for l, r in self.merges]
        with files.atomic_files([vocab_filepath, merges_filepath]) as (vocab_tmp, merges_tmp):
            with files.atomic_file(vocab_tmp, "w") as f:
                f.write(json.dumps(inv, ensure_ascii=False, indent=0))
            with files.atomic_file(merges_tmp, "w") as f:
                f.write("\n".join(lines) + "\n")

    def _merge_pretoken(self, word):
        """BPE of one pre-token: merge the adjacent pair of lowest rank, at every place it
        occurs (left to right), until no pair is a merge. GPT-2: "lowest" -> "low", "est"."""
        ids = tuple(self._byte_ids[b] for b in word.encode("utf-8"))
        no_merge = (len(self.merges), 0)
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: self._merge_rank.get(p, no_merge))
            if pair not in self._merge_rank:
                break
            ids = _merge(ids, pair, self._merge_rank[pair][1])
        return ids

    def _encode_plain(self, text):
        """The definition: special tokens split the text, each pre-token is merged on its own
        (and remembered in a small cache); the engine merges one over _PLAIN_WORD_CHARS."""
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        ids = []
        for k, part in enumerate(self._split_re.split(text) if self._split_re else [text]):
            if k % 2:                          # split() puts each special token at odd k
                ids.append(self._special_ids[part])
                continue
            for word in pretokenize(part):
                if len(word) > _PLAIN_WORD_CHARS:     # the engine merges it with a heap of its pairs: the same ids
                    ids += self._engine.encode(word.encode("utf-8")).tolist()
                    continue
                if word not in self._cache:
                    self._cache[word] = self._merge_pretoken(word)
                ids += self._cache[word]
        return ids

    @cli.ctrl_c_stays_keyboard_interrupt
    @bpe_fast.names_lone_surrogates           # ValueError naming text[i], on either path
    def encode(self, text):
        """Ids of text."""
        bpe_fast.check_text("Tokenizer.encode takes str", text)
        if bpe_fast.compiled_encoder_pays(self._plain_chars + len(text)):
            # The engine encodes in one compiled pass over the UTF-8 bytes, with its own scanner, the merges in a
            # hash table and a cache of pre-tokens in arrays: the same ids. It takes over once loading it pays (this
            # Tokenizer has seen bpe_fast.COMPILED_MIN_CHARS), and in a process that has loaded it, for every text
            # after; _encode_plain is the definition.
            return self._engine.encode(text.encode("utf-8")).tolist()
        self._plain_chars += len(text)
        return self._encode_plain(text)

    def encode_iterable(self, iterable):
        """Lazily yield the ids of "".join(iterable), in constant memory: the engine cuts the
        stream into pieces of about _STREAM_CHARS where the pre-tokens cannot change, so the ids
        equal encode's (ValueError if 4M characters pass with no space and no end of a word or number)."""
        yield from bpe_fast.encode_stream(self.encode, iterable, self.special_tokens, _STREAM_CHARS)

    def decode(self, ids):
        """Text of ids (a list, array or tensor of ints); bytes that are not UTF-8 become U+FFFD."""
        ids = bpe_fast.checked_ids(ids, self.vocab)
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def special_tokens_of(vocab, merges=(), in_file=None):
    """The special tokens bpe.py train (or GPT-2) put in a vocab: its tokens of 2+ bytes that no merge makes, as text.
    vocab may be a Tokenizer (data.py's): then those not given to it, which its own check of the merges found."""
    own = vocab._undeclared if isinstance(vocab, Tokenizer) else _check_merges(merges, vocab, [], in_file)
    return [t.decode() for t in own if t.decode(errors="replace").encode() == t]


# -----------------------------------------------------------------------------
# 8. Command line

def tokenizer_files(directory):  # where bpe.py train, a token cache and a run keep a tokenizer
    return Path(directory) / "vocab.json", Path(directory) / "merges.txt"


def _cmd_train(args):
    specials = bpe_fast.checked_special_tokens(args.special_tokens)
    bpe_fast.check_vocab_size(args.vocab_size, specials, "--vocab-size")
    if os.path.exists(args.out) and not os.path.isdir(args.out):  # refused before training, not after it
        raise ValueError(f"--out {args.out} is {files.not_a_file(args.out) or 'a file'}, not a directory; pass one")
    made = sorted(p.name for p in Path(args.out).glob("*") if p.suffix in (".npy", ".pt"))  # ids, a checkpoint
    if made and all(f.exists() for f in tokenizer_files(args.out)):  # a run's folder, a token cache's
        raise ValueError(f"--out {args.out} holds {made[0]}, made with the tokenizer there; pass another --out")
    if any(files.same_file(args.input, f) for f in tokenizer_files(args.out)):
        raise ValueError(f"the input {args.input} is a file training writes into --out {args.out}; pass another --out")
    if why := next((f"{p}{w}" for p in tokenizer_files(args.out) if (w := files.unwritable(p))), None):
        raise ValueError(f"--out: {why}; pass another --out")
    t0 = time.perf_counter()
    vocab, merges = train_bpe(args.input, args.vocab_size, args.special_tokens, args.num_workers)
    dt = time.perf_counter() - t0
    with files.new_folders(args.out):  # a failure (a full disk) leaves no folder it made
        Tokenizer(vocab, merges, args.special_tokens).save(*tokenizer_files(args.out))
    longest = max((a + b for a, b in merges), key=len, default=b"")  # a special token is given, not learned
    text = longest.decode("utf-8", "replace")
    made = (f"; longest merged token {cli.counted(len(longest), 'byte')} ({cli.counted(len(text), 'character')}): "
            f"{_short(repr(text), count=False)}" if merges else "")  # the token's middle cut: it can be a MB
    cli.say(f"trained {cli.counted(len(merges), 'merge')} in {dt:.2f} s{bpe_fast.peak_memory()}{made}; "
            f"wrote {args.out}/vocab.json and merges.txt")
    if len(vocab) < args.vocab_size:  # every pre-token is one token already: no pair is left to merge
        cli.say(f"note: {len(vocab):,} tokens, not --vocab-size {args.vocab_size:,}: the text has no pair left to merge")
    if one := [s for s in specials if len(s.encode()) == 1]:
        cli.say(f"note: vocab.json cannot mark a one-byte special token ({', '.join(map(repr, one))}) as special: "
                f"encode with --special-tokens {shlex.join(specials)} to split there")  # its default finds the others


def _cmd_encode(args):
    vocab_file, merges_file = tokenizer_files(args.tokenizer)
    if not (vocab_file.exists() or merges_file.exists()):  # a wrong folder, or a file: "vocab file ...: no such file"
        raise ValueError(f"--tokenizer {args.tokenizer} holds no vocab.json and merges.txt; pass the directory bpe.py "
                         "train wrote them to (its --out)")
    if files.same_file(args.out, vocab_file) or files.same_file(args.out, merges_file):
        raise ValueError(f"--out {args.out} is a file of the tokenizer {args.tokenizer}; pass another --out")
    if not files.is_ids(args.out):        # train.py --data goes by the name
        raise ValueError(f"--out {args.out} must end in .npy: train.py --data reads any other file as text")
    if why := files.unwritable(args.out):  # refused before the work, not after it
        raise ValueError(f"--out {args.out}{why}; pass another --out")
    vocab, (merges, in_file) = _load_vocab_file(vocab_file), _read_merges_file(merges_file)
    beside = [f.read_bytes() for f in tokenizer_files(Path(args.out).absolute().parent) if f.is_file()]
    if len(beside) == 2 and beside != [vocab_file.read_bytes(), merges_file.read_bytes()]:  # a token cache, a run
        raise ValueError(f"--out {args.out} is beside another tokenizer's vocab.json and merges.txt, which train.py "
                         f"would take its ids for; pass another --out, or --tokenizer {Path(args.out).parent}")
    if args.special_tokens is None:  # the vocab's own, as train's --special-tokens and GPT-2's <|endoftext|> made them
        args.special_tokens = special_tokens_of(vocab, merges, in_file)
    specials, tokens = bpe_fast.checked_special_tokens(args.special_tokens), set(vocab.values())
    if missing := [s for s in specials if s.encode() not in tokens]:  # appended: ids past the files' vocab
        raise ValueError(f"--special-tokens {missing[0]!r} is not a token of {vocab_file}, so its id would be past "
                         "the tokenizer's; train a tokenizer with it (bpe.py train --special-tokens)")
    tok = Tokenizer(vocab, merges, specials, _in_file=in_file)  # from_files, as read
    t0 = time.perf_counter()
    # The engine encodes the file in worker processes, chunk by chunk, into a .npy written atomically: encode's ids.
    with files.new_folders(os.path.dirname(os.path.abspath(args.out))):  # a missing folder made, as train's --out
        n = encode_file(tok, args.input, args.out, args.num_workers)
    dt, size = time.perf_counter() - t0, os.path.getsize(args.input)
    cli.say(f"wrote {cli.counted(n, 'token')} to {args.out}; {size / max(n, 1):.2f} bytes/token; "
            f"{size / 1e6 / dt:.2f} MB/s over {dt:.2f} s\ntrain on them (samples decoded): "
            + shlex.join(["python", "train.py", "--data", args.out, "--tokenizer", args.tokenizer]))


def main(argv=None):
    ap = cli.Parser(prog="bpe.py", description="Byte-level BPE: train a tokenizer or encode a text file.")
    sub = ap.add_subparsers(dest="cmd", metavar="{train,encode}", required=True)
    tr = sub.add_parser("train", help="learn merges from a UTF-8 text file")
    tr.add_argument("--vocab-size", type=int, required=True, help="tokens: the 256 bytes, the special tokens, merges")
    en = sub.add_parser("encode", help="tokenize a text file into a .npy of ids")
    en.add_argument("--tokenizer", type=cli.user_path, required=True, help="directory with vocab.json, merges.txt")
    for p, out, specials in [(tr, "directory for vocab.json and merges.txt", "default: none"),
                             (en, "output .npy path", "default: the vocab's own (no merge makes them); the flag with "
                                                      "no tokens: none, all text")]:
        p.add_argument("input", type=cli.user_path, help="a UTF-8 text file")
        p.add_argument("--special-tokens", nargs="*", type=cli.user_text, help=specials)  # UTF-8 on every locale
        p.add_argument("--out", type=cli.user_path, required=True, help=out)
        p.add_argument("--num-workers", "--workers", type=int, metavar="N", help="processes; default: one per core")
    try:
        args = ap.parse_args(argv)
    except cli.UsageError as e:  # `--special-tokens A small.txt` took the input for a second special token
        words = sys.argv[1:] if argv is None else list(argv)
        after = words[words.index("--special-tokens") + 1:] if "--special-tokens" in words else []
        if "required: input" not in str(e) or not after or after[0].startswith("-"):
            raise
        raise cli.UsageError(f"{e}; --special-tokens takes every word after it: put the input file before it.") from None
    if args.num_workers is not None and args.num_workers < 1:
        raise cli.UsageError("--num-workers (--workers) must be at least 1.")
    args.num_workers = args.num_workers and min(args.num_workers, machine.usable_cores())  # more would be no faster
    here = "a folder (. for this one)"
    for flag, path, what in (("the input", args.input, "a text file"), ("--tokenizer", vars(args).get("tokenizer"), here),
                             ("--out", args.out, here if args.cmd == "train" else "a .npy file")):
        if path == "":  # no path, but Path('') is this folder: train wrote its files here unasked
            raise cli.UsageError(f"{flag} is an empty path; pass {what}.")

    def command():
        with cli.usage_errors():  # a missing input, a malformed tokenizer file: exit 2
            return {"train": _cmd_train, "encode": _cmd_encode}[args.cmd](args)
    code = cli.exit_code(f"bpe.py {args.cmd}", command, "no partial file was left.")  # files are written atomically
    if code:
        sys.exit(code)


if __name__ == "__main__":
    cli.catch_ctrl_c()
    cli.escaping_stdout()  # a terminal that cannot show the longest token (latin-1, ascii)
    cli.exit_quietly(cli.exit_code("bpe.py", main, "no partial file was left."))
