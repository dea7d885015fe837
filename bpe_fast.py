"""
The tokenizer's engine: what makes bpe.py fast, kept apart so that bpe.py reads as a lesson.
bpe.py calls it at a few marked places and test_all.py checks it against bpe.py's
definitions (same pre-tokens, counts, merges and ids). It holds, in order:
1. a compiled scanner that finds GPT2_PAT's pre-tokens in UTF-8 bytes;
2. the file (and encode_iterable's stream) cut where no pre-token straddles a cut, the input
   checks, the worker processes and the Ctrl-C plumbing around numba;
3. pre-token counting in the workers, into hash tables keyed by the pre-tokens' bytes;
4. the tuned merge loop (bpe.py's incremental trainer, laid out for the processor's caches);
5. the compiled encoder and its cache of pre-tokens;
6. encode_file: a text file to a .npy of ids, in parallel and in constant memory.

numba's lessons, learned here once and followed everywhere below:
- Reference counting. Every array that a compiled helper receives, or that a loop assigns
  again, is reference counted: an atomic add and subtract per array per call, which in a hot
  loop costs more than the work. So a hot loop never replaces an array (it stops when room
  runs out; its caller makes room and calls it again), and its per-item helpers are inlined.
- One way through a helper. numba removes those counts only where an inlined helper has one
  way through: no early return, no branch around a write. So those helpers return in one
  place and write with arithmetic where a branch would do (`x += flag * (new - x)`).
- Prefetch. Late merges spend their time waiting for words scattered over memory; asking
  the processor for the next words ahead of need (an LLVM intrinsic) overlaps those waits.
- Compile time, paid once on each machine, is part of the product. An assignment of one array
  slice to another (`a[i:j] = b[k:l]`) compiles numba's shape-mismatch error, which formats
  the shapes as text: seconds of each first compile. Those copies are loops (_copy). And a
  constant passed to a compiled function (`f(x, 1)`, or a counter that starts at 0) is typed
  as its literal value, for which numba compiles the callee once more: so it is np.int64(1).
"""

import codecs
import contextlib
import ctypes
import functools
import io
import multiprocessing.pool  # also binds multiprocessing
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import pickle
import re
import signal
import sys
import tempfile
import time
from itertools import chain

import numpy as np
import regex
from llvmlite import ir
from numba import config, njit, types
from numba.core import caching, cgutils
from numba.extending import intrinsic, register_jitable

from cli import (STOPS, DataError, counted, ctrl_c_stays_keyboard_interrupt, end_progress, raise_held_ctrl_c, say,
                 short_repr, show_progress)
from files import atomic_file, dir_lock, packed, read_exactly, read_into, same_file, unreadable
from machine import memory_bytes, usable_cores

# numba's debugging switch, NUMBA_DISABLE_JIT=1 (to step through its functions in pdb), leaves each @njit function
# plain Python: no .signatures, no @intrinsic (_prefetch), and loops that would take hours on a big job. There the
# engine steps aside: bpe.py counts, merges and encodes with its own plain code, which gives the same results, and
# only a pre-token too long for bpe.py's plain encoder still comes here, run as Python.
JIT = not config.DISABLE_JIT

# -----------------------------------------------------------------------------
# 1. The scanner: GPT2_PAT's pre-tokens in UTF-8 bytes
#
# It needs only the class of each character. The classes come from the regex package itself, so that the scanner and
# GPT2_PAT agree on the Unicode version; a test checks them on random text of every kind.
_OTHER, _LETTER, _NUMBER, _SPACE = 0, 1, 2, 3
_APOSTROPHE, _BLANK = ord("'"), ord(" ")
_S, _D, _M, _T, _L, _V, _R, _E = (ord(c) for c in "sdmtlvre")


@functools.cache
def _char_classes():
    """(0x110000,) uint8: the class of every code point, as regex sees \\p{L}, \\p{N} and \\s."""
    # every code point in order, surrogates too, as one string: decoding an array is faster than joining chr()s
    every = np.arange(0x110000, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    classes = np.zeros(0x110000, np.uint8)
    for cls, pat in ((_LETTER, r"\p{L}+"), (_NUMBER, r"\p{N}+"), (_SPACE, r"\s+")):
        for m in regex.finditer(pat, every):
            classes[m.start():m.end()] = cls
    return classes


@njit(cache=True, inline="always")
def _class_at(data, i, classes):
    """(class, byte length) of the character that starts at data[i] (valid UTF-8)."""
    b = np.int64(data[i])
    if b < 0x80:
        c, k = b, 1
    elif b < 0xE0:
        c, k = (b & 0x1F) << 6 | (data[i + 1] & 0x3F), 2
    elif b < 0xF0:
        c, k = (b & 0x0F) << 12 | (data[i + 1] & 0x3F) << 6 | (data[i + 2] & 0x3F), 3
    else:
        c, k = ((b & 0x07) << 18 | (data[i + 1] & 0x3F) << 12 | (data[i + 2] & 0x3F) << 6
                | (data[i + 3] & 0x3F)), 4
    return classes[c], k


# inline="always": the compiled loops that call it once per pre-token get its body, since a
# call costs more than the scan itself. It, and _class_at, return in one place only.
@njit(cache=True, inline="always")
def _next_pretoken(data, i, n, classes):
    """End of the GPT2_PAT pre-token that starts at byte i of data[:n], trying its
    alternatives in order: b"'ll go  now" -> "'ll", " go", " ", " now"."""
    c, j = data[i], -1                     # j: the end, once known
    if c == _APOSTROPHE and i + 1 < n:                           # 's 'd 'm 't 'll 've 're
        d = data[i + 1]
        if d == _S or d == _D or d == _M or d == _T:
            j = i + 2
        elif i + 2 < n and ((d == _L and data[i + 2] == _L) or (d == _V and data[i + 2] == _E)
                            or (d == _R and data[i + 2] == _E)):
            j = i + 3
    if j < 0:
        cls, k = _class_at(data, i, classes)
        j = i + k
        if c == _BLANK and j < n:              # a space joins the letters, digits or symbols after it
            nxt, k = _class_at(data, j, classes)
            if nxt != _SPACE:
                cls, j = nxt, j + k
        more = j < n
        if cls != _SPACE:                  # ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
            while more:
                nxt, k = _class_at(data, j, classes)
                if nxt == cls:
                    j += k
                more = nxt == cls and j < n
        last = i                           # '\s+(?!\S)' then '\s+'
        while cls == _SPACE and more:
            nxt, k = _class_at(data, j, classes)
            if nxt == _SPACE:
                last, j = j, j + k
                more = j < n
            else:
                # followed by a non-space: leave the last whitespace character to the next
                # pre-token (" x" takes its space), unless it is the only one
                if last > i:
                    j = last
                more = False
    return j


# -----------------------------------------------------------------------------
# 2. Chunks, worker processes, Ctrl-C

# Places where a cut cannot change the pre-tokens: before an ASCII whitespace character that ends a
# run of whitespace (a non-space follows). The rest of the run is one pre-token either way
# ('\s+(?!\S)' backs off to end just there, as the end of a text ends it), and that character starts
# the next one whatever precedes: a space starts ' ?\p{L}+' or a sibling, a newline or a tab is one
# of its own. Two exceptions, both about special tokens, are checked by _cut_keeps_specials: the cut
# must not split one, and the non-space must not begin one, since a special token ends the text
# before it, and there '\s+(?!\S)' takes the whole run (".\n\n<|endoftext|>": "\n\n" is one token).
# A cut just before a special token is safe too, as the token ends the text before it either way.
# So CJK text, which has no spaces, is cut at its line breaks and special tokens. _STREAM_CUT is for str
# (encode_iterable), _SAFE_CUT for bytes (file chunks): there the non-space is ASCII or a UTF-8 lead
# byte of a range without Unicode whitespace. The standard library's re runs _STREAM_CUT faster than
# regex; its \S is a subset of regex's (its \s adds \x1c-\x1f), so it finds no cut regex would not.
_STREAM_CUT = re.compile(r"(?=[\t-\r ]\S)")
# Text with no such cut in 4M characters (minified JSON, CSV) is cut where a run of letters or of digits ends. Only
# ' ?\p{L}+' and the contractions hold letters, and both end at their last letter; only ' ?\p{N}+' holds digits. So a
# pre-token ends there whatever follows, and the one after starts there whatever precedes (GPT2_PAT looks only ahead).
_RUN_END = regex.compile(r"(?<=\p{L})(?!\p{L})|(?<=\p{N})(?!\p{N})")
_STREAM_LIMIT = 1 << 22         # characters encode_iterable holds before it cuts at _RUN_END
_SAFE_CUT = rb"(?=[\t-\r ][!-~\xc3-\xdf\xe4-\xef\xf0-\xf4])"
_CHUNK_BYTES = 1 << 22          # 4 MiB of text per task at most: memory follows this, not the file
_MIN_CHUNK = 1 << 18            # at least 256 KiB of text per task (at most _CHUNK_BYTES)
_BOUNDARY_WINDOW = 1 << 16      # read this much at a time when looking for a cut
# fork shares the parent's imports (numba, regex) instead of re-importing them.
_MP = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _cut_keeps_specials(buf, p, specials):
    """Cutting buf before position p splits no special token, and none begins at p + 1 (just after the
    whitespace a _STREAM_CUT or _SAFE_CUT is before). buf must hold p + 1 + the longest token, or end the text."""
    return not any(buf.find(s, max(0, p - len(s) + 1), p + len(s) - 1) != -1 or buf.startswith(s, p + 1)
                   for s in specials)


@functools.cache
def _stream_cut_re(special_tokens):
    """Where a str may be cut, before _cut_keeps_specials has its say: before a special token (a tuple of
    them), or at _STREAM_CUT, as _file_cut_re for bytes (CJK documents joined by <|endoftext|> have no other)."""
    if not special_tokens:
        return _STREAM_CUT
    # One lookahead of all of them, which re tries at once: a lookahead each was tried one by one at every character
    # (256 tokens, Llama 3's count: encode_iterable at a twentieth of encode's speed).
    return re.compile(f"(?={'|'.join(map(re.escape, special_tokens))})|{_STREAM_CUT.pattern}")


def check_text(what, text):
    """TypeError unless Tokenizer.encode (or encode_iterable, in an item) got a str: the plain and the compiled path
    would each fail in their own words, if at all (bytes, None, an int)."""
    if not isinstance(text, str):
        hint = ": decode it first" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"{what}, got {type(text).__name__}{hint}.")


def _last_cut(cut_re, buf, lo, hi, special_tokens):
    """The last cut_re match in buf[lo:hi] that splits no special token, or -1 (a match at hi is not taken: there
    the end of the window stands for the next character). The last 4K first: most text has a cut there."""
    tail = max(lo, hi - 4096)
    for a, b in ((tail, hi), (lo, tail + 1)):
        for p in reversed([m.start() for m in cut_re.finditer(buf, a, b)]):
            if 0 < p < b and _cut_keeps_specials(buf, p, special_tokens):
                return p
    return -1


def stream_pieces(iterable, special_tokens, piece_chars):
    """The text of iterable (of str) again, in pieces of piece_chars characters or more, each cut at
    the last _stream_cut_re match that splits no special token (past _STREAM_LIMIT characters with none, at the
    last _RUN_END). Linear: each character is searched once (by _RUN_END once per _STREAM_LIMIT), and new text joins
    the buffer only once it is as long, so the buffer is copied O(log n) times."""
    cut_re, margin = _stream_cut_re(tuple(special_tokens)), max((len(s) for s in special_tokens), default=1)
    buf, scanned, new, n_new = "", 0, [], 0   # buf[:scanned] searched
    if isinstance(iterable, (bytes, bytearray)) or not hasattr(iterable, "__iter__"):  # bytes' items: "got int"
        check_text("Tokenizer.encode_iterable takes an iterable of str", iterable)
    for text in iterable:
        check_text("Tokenizer.encode_iterable takes an iterable of str", text)   # a file opened "rb": bytes
        new.append(text)
        n_new += len(text)
        if n_new < max(piece_chars - len(buf), len(buf)):
            continue
        buf, new, n_new = buf + "".join(new), [], 0
        hi = len(buf) - margin - 1        # leave room to see a special token across it
        found = _last_cut(cut_re, buf, max(scanned - margin - 2, 0), hi, special_tokens)
        if found < 0 and len(buf) > _STREAM_LIMIT:
            found = _last_cut(_RUN_END, buf, max(hi - _STREAM_LIMIT, 0), hi, special_tokens)
            if found < 0:
                raise ValueError("encode_iterable found no place to cut 4M characters of text (no special token, "
                                 "no space before a non-space, no end of a word or number); use encode()")
        scanned = max(scanned, hi)
        if found < 0:
            continue
        yield buf[:found]
        buf, scanned = buf[found:], scanned - found
    buf += "".join(new)
    if buf:
        yield buf


_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate: in a str, not Unicode text; UTF-8 has no bytes for it


def lone_surrogate(text, offset=0):
    """The ValueError for text that UTF-8 cannot encode, naming its first lone surrogate's place (text[i], i counted
    from offset: text's place in a longer one), or None if it has none (the error was another)."""
    if m := _SURROGATE.search(text):
        return ValueError(f"text[{offset + m.start()}] is a lone surrogate {m.group()!r}, which UTF-8 cannot encode")


def names_lone_surrogates(encode):
    """encode(self, text) where a lone surrogate is lone_surrogate's ValueError, not the UnicodeEncodeError of the
    place it was met: the plain path meets it in a pre-token, the compiled one in the whole text. Raising, not
    replacing it (tiktoken), is what GPT-2's encoder does; caught as it happens, normal text takes no extra pass."""
    @functools.wraps(encode)
    def wrapper(self, text):
        try:
            return encode(self, text)
        except UnicodeEncodeError as e:
            raise (lone_surrogate(text) or e) from None
    return wrapper


def encode_stream(encode, iterable, special_tokens, piece_chars):
    """encode_iterable's ids: encode(piece) of each of stream_pieces; a lone surrogate named at its place in the
    whole text, not in its piece."""
    done = 0
    for piece in stream_pieces(iterable, special_tokens, piece_chars):
        try:
            ids = encode(piece)
        except ValueError as e:     # encode's lone_surrogate, at its place in the piece
            raise (lone_surrogate(piece, done) or e) from None
        yield from ids
        done += len(piece)


def _find_cut(f, pos, size, cut_re, special_bytes):
    """First cut_re match from byte pos of file f (size bytes) splitting no special token, or None."""
    margin = max((len(s) for s in special_bytes), default=1)
    while pos < size:
        lo = max(0, pos - margin)
        f.seek(lo)
        buf = f.read(pos - lo + _BOUNDARY_WINDOW + margin)
        for m in cut_re.finditer(buf, pos - lo):
            p = m.start()
            if p + 1 + margin > len(buf) and lo + len(buf) < size:
                break                   # too close to the window edge to judge: slide on
            if _cut_keeps_specials(buf, p, special_bytes):
                return lo + p
        pos = lo + max(pos - lo + 1, len(buf) - margin)
    return None


def _special_bytes_re(special_bytes):
    """The special tokens (bytes) as one pattern, longest first as bpe._special_split_re."""
    alts = [regex.escape(s) for s in sorted(special_bytes, key=len, reverse=True)]
    return regex.compile(b"|".join(alts)) if alts else None


def _file_cut_re(special_bytes):
    """Where a file may be cut, before _cut_keeps_specials has its say: before a special token, or at _SAFE_CUT."""
    special_re = _special_bytes_re(special_bytes)
    return regex.compile(b"|".join([special_re.pattern, _SAFE_CUT]) if special_re else _SAFE_CUT)


def _chunk_bounds(path, size, special_bytes, n_chunks):
    """Byte offsets [0, c1, ..., size] of about n_chunks pieces: each cut is the first special token
    or _SAFE_CUT from the even split on."""
    cut_re = _file_cut_re(special_bytes)
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, n_chunks):
            guess = max(size * k // n_chunks, bounds[-1] + 1)
            p = _find_cut(f, guess, size, cut_re, special_bytes)
            if p is None:                       # none up to the end: later guesses would find none either
                break
            bounds.append(p)                    # (after bounds[-1] and before size)
    bounds.append(size)
    return bounds


def check_readable(path, what):
    """FileNotFoundError saying why path cannot be read (missing, a directory, /dev/zero), as --data's check does."""
    if why := unreadable(path):
        raise FileNotFoundError(f"{what} {path}{why}")


def check_input_file(path):
    """The size of the input file, which must be a file and hold something."""
    if not isinstance(path, (str, bytes, os.PathLike)):  # an open file, None: os.stat's words (an int: a descriptor)
        raise TypeError(f"input_path must be the path of a text file (a str or pathlib.Path), got {short_repr(path)}")
    check_readable(path, "input file")
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"input file {path} is empty; give it some text")
    return size


def check_utf8(data, path, start):
    """data (read at byte start of path) decoded; ValueError names the offset of a bad byte."""
    try:
        return codecs.utf_8_decode(data, "strict", True)[0]
    except UnicodeDecodeError as e:
        if start == 0 and (how := packed(path, data)):
            raise ValueError(f"{how} and pass the text file it holds") from None
        raise ValueError(f"{path} is not valid UTF-8: bad byte 0x{data[e.start]:02x} at byte "
                         f"offset {start + e.start}; re-save the file as UTF-8") from None


def encoded_counts(counts):
    """[(UTF-8 bytes, count)] of bpe.train_from_counts's {pre-token str: count}, checked first: the merge loops
    take counts as int64 arrays, which would cut a weight of 0.5 to 0 or read "3" as 3 without a word."""
    for w, c in counts.items():
        if not isinstance(w, str) or isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise ValueError(f"counts must map each pre-token (str) to a whole number of at least 1, got {w!r}: "
                             f"{c!r}; count pre-tokens as bpe.count_pretokens does")
    return [(w.encode("utf-8"), int(c)) for w, c in counts.items()]


_MASK = getattr(signal, "pthread_sigmask", lambda how, signals: set())  # Windows has no signal masks, nor their names
SIG_BLOCK, SIG_UNBLOCK, SIG_SETMASK = (getattr(signal, name, 0) for name in ("SIG_BLOCK", "SIG_UNBLOCK", "SIG_SETMASK"))


def _worker_start(start):
    """In a new worker: SIGTERM (the pool's terminate) ends it quietly, not by the parent's handler; on
    Linux it dies with the parent (killed by the out-of-memory killer), not later with a BrokenPipeError.
    Then initializer(*args) of start = (initializer, *args), or of the file named start (see _worker_pool)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(AttributeError, OSError, TypeError):    # no prctl outside Linux
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)                    # 1: PR_SET_PDEATHSIG
    _MASK(SIG_UNBLOCK, {signal.SIGTERM})
    if isinstance(start, str):
        with open(start, "rb") as f:
            start = pickle.load(f)
    initializer, *args = start
    if initializer is not None:
        initializer(*args)


def _end_pool(handler, notifier, workers, start):
    """Leave a pool, and again at the exit if a stop cut that short (a Ctrl-C's handler may run at any call):
    its workers killed, never Pool.terminate, which waits forever for what a killed worker held. One killed while
    it sent a result (megabytes of ids or counts) leaves part of it in the result pipe, for a reader thread that
    waits for the rest; an idle one killed (by the out-of-memory killer, even after the last result) holds the
    task queue's lock, which terminate takes. The pool's other threads end by themselves."""
    handler._state = multiprocessing.pool.TERMINATE
    notifier.put(None)                 # the thread that replaces dead workers wakes and ends first
    handler.join()
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join()
    if isinstance(start, str) and os.path.exists(start):
        os.remove(start)


class _Pool(multiprocessing.pool.Pool):
    """A Pool left by killing its workers (_end_pool), and whose wait for results ends if one dies."""

    def __enter__(self):               # a stop held while the workers started is raised here: __exit__ ends them
        try:
            _MASK(SIG_SETMASK, self.mask)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        old = _MASK(SIG_BLOCK, STOPS)   # a stop now waits for the workers' end
        try:
            self._state = multiprocessing.pool.TERMINATE
            _end_pool(*self.end)
            self._terminate.cancel()   # only now: cut short, it runs again at the exit
        finally:
            _MASK(SIG_SETMASK, old)

    def _repopulate_pool(self):      # called by __init__ only: the workers it starts, for imap_checked
        super()._repopulate_pool()
        self.started = list(self._pool)

    def imap_checked(self, func, tasks, ordered=True):
        """imap (or imap_unordered), whose wait ends in DataError (the machine's fault) if a worker dies: Pool
        would start another, but the dead one's task would be lost, or the task queue's lock it held."""
        results = (self.imap if ordered else self.imap_unordered)(func, tasks)

        def checked():                           # a generator: the tasks above are sent now
            while True:
                try:
                    yield results.next(timeout=0.5)
                except StopIteration:
                    return
                except multiprocessing.TimeoutError:   # nothing for a while: is every worker alive?
                    code = next((w.exitcode for w in self.started if w.exitcode is not None), None)
                    if code is not None:
                        raise DataError(f"a worker process died (exit code {code}; -9 is a kill, often the "
                                        "system's out-of-memory killer); use fewer workers or free some memory, "
                                        "and run the same command again.") from None
        return checked()


def _worker_pool(n, initializer=None, initargs=()):
    """A pool of n workers, to enter at once: `with _worker_pool(n) as pool`. Ctrl-C and SIGTERM are blocked
    while they start (raised in fork's hooks, they would be dropped; spawn's take seconds) until the pool is
    entered, whose exit ends them. The workers keep Ctrl-C blocked: the parent stops them."""
    start, spawn = (initializer, *initargs), _MP.get_start_method() != "fork"
    if spawn and os.name == "posix":   # spawn's helper process unblocks Ctrl-C and SIGTERM as it starts: start it first
        multiprocessing.resource_tracker.ensure_running()
    old = _MASK(SIG_BLOCK, STOPS)
    try:
        if spawn:
            # Spawn writes each worker's arguments (megabytes of tokenizer) into its pipe and waits there until that
            # worker's new Python has started and read them: the workers would start one after another. A file, once:
            fd, start = tempfile.mkstemp(suffix=".pickle")
            with os.fdopen(fd, "wb") as f:
                pickle.dump((initializer, *initargs), f)
        pool = _Pool(n, _worker_start, (start,), context=_MP)
    except BaseException:              # (a full disk while writing the file, say): no file and no mask left behind
        _MASK(SIG_SETMASK, old)
        if isinstance(start, str):
            os.remove(start)
        raise
    pool._terminate.cancel()           # Pool.terminate at the exit: replaced by _end_pool
    pool.end, pool.mask = (pool._worker_handler, pool._change_notifier, pool._pool, start), old
    pool._terminate = multiprocessing.util.Finalize(pool, _end_pool, pool.end, exitpriority=15)
    return pool


_compile_noted = False    # the first-compile line was printed in this process


def _cache_index(dispatcher):  # the path of dispatcher's index in numba's disk cache (None: it has no disk cache)
    return getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None), "_index_path", None)


def _note_first_compile(dispatcher):
    """Say in one line that numba compiles dispatcher now, when its disk cache has nothing for it."""
    global _compile_noted
    index = _cache_index(dispatcher)
    if JIT and not _compile_noted and not dispatcher.signatures and index and not os.path.exists(index):
        say("compiling the tokenizer's fast path once for this machine (up to half a minute)")
        _compile_noted = True


def _numba_cache_made_safe(cache_file):
    """numba's disk cache (an index *.nbi, code *.nbc), made safe for what killed jobs and parallel tests do:
    - it reads the files with pickle and let a damaged one's error through: a truncated index (a killed
      writer, a full disk) failed every compiled call. Here a file it cannot read is a miss: compiled again.
    - a save reads the index, takes the first free file number and writes both back, unlocked: two
      processes saving two signatures of one function at once could take the same number, and the index
      then points one signature at the other's code. Here saves take turns (a lock on the cache's folder)."""
    def miss_on_error(read, miss):
        @functools.wraps(read)
        def read_or_miss(self, *args):
            try:
                return read(self, *args)
            except Exception:     # pickle fails on bad bytes in many ways (EOFError, UnpicklingError, ...)
                return miss
        return read_or_miss

    def in_turn(save):
        @functools.wraps(save)
        def save_in_turn(self, *args):
            with contextlib.ExitStack() as turn:
                with contextlib.suppress(OSError):  # a folder it cannot open: unlocked, as numba's own
                    turn.enter_context(dir_lock(self._cache_path, waiting=""))
                return save(self, *args)
        return save_in_turn
    cache_file._load_index = miss_on_error(cache_file._load_index, {})
    cache_file.load = miss_on_error(cache_file.load, None)
    cache_file.save = in_turn(cache_file.save)


_numba_cache_made_safe(caching.IndexDataCacheFile)


def new_special_tokens(special_tokens):
    """The bytes of the (checked) special tokens that take ids after the 256 bytes, in order. One of one byte (ASCII)
    is that byte's token already and keeps its id, as a Tokenizer finds it: a second id would be the same token twice,
    which vocab.json cannot hold (Hugging Face's trainer, too, gives a special token its vocab has no second id)."""
    return [b for b in (s.encode("utf-8") for s in special_tokens) if len(b) > 1]


def check_vocab_size(vocab_size, special_tokens, name="vocab_size"):
    """ValueError unless vocab_size is an integer with room for the 256 bytes and the (checked) special tokens.
    name: how the sentence names it (a command line's flag)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {vocab_size!r}")
    n_base = 256 + len(new_special_tokens(special_tokens))
    if vocab_size < n_base:
        raise ValueError(f"{name} {vocab_size} is smaller than 256 bytes + {counted(n_base - 256, 'special token')}"
                         f" = {n_base}; raise it")


def checked_merges(vocab, merges):
    """merges as a list, once the vocab's tokens are bytes and each merge a pair of them: str there (text, not a
    token's bytes) failed later as "token 'a' is not in the vocab", which is not what is wrong. ValueError names
    the first that is not; a TypeError, a vocab that is no dict (a path: from_files reads files) or merges no list."""
    if not hasattr(vocab, "items"):  # the dict's .items() read in Tokenizer: an AttributeError of None or a path
        hint = ": Tokenizer.from_files reads vocab and merges files" if isinstance(vocab, (str, os.PathLike)) else ""
        raise TypeError(f"vocab must be a dict {{id: bytes}}, got {short_repr(vocab)}{hint}")
    try:
        merges = list(merges)
    except TypeError:  # None: "'NoneType' object is not iterable"
        raise TypeError(f"merges must be a list of (bytes, bytes) pairs, got {short_repr(merges)}") from None
    if (set(map(type, vocab.values())) <= {bytes} and set(map(type, merges)) <= {tuple} and  # the usual: at C speed
            set(map(len, merges)) <= {2} and set(map(type, chain.from_iterable(merges))) <= {bytes}):
        return merges
    if bad := next(((i, t) for i, t in vocab.items() if not isinstance(t, bytes)), None):
        raise ValueError(f"vocab tokens must be bytes such as b'a'; id {bad[0]} is {short_repr(bad[1])}")
    for k, m in enumerate(merges):
        if not (isinstance(m, (tuple, list)) and len(m) == 2 and all(isinstance(t, bytes) for t in m)):
            raise ValueError(f"merges must be pairs of bytes such as (b'a', b'b'); merge #{k} is {short_repr(m)}")
    return merges


def checked_special_tokens(special_tokens):
    """The special-token strings, checked, duplicates dropped (order kept). One of one byte is that byte's token."""
    if isinstance(special_tokens, str):
        raise ValueError("special_tokens must be a list of strings, not a single string "
                         f"(did you mean [{special_tokens!r}]?)")
    special_tokens = list(special_tokens or ())
    for s in special_tokens:  # a lone surrogate is how a shell's $'\xff' arrives
        why = ("not a string" if not isinstance(s, str) else "the empty string" if not s else
               "not valid UTF-8 (a lone surrogate)" if lone_surrogate(s) else "")
        if why:
            raise ValueError(f"special token {s!r} is {why}; fix or remove it")
    return list(dict.fromkeys(special_tokens))


def check_id(i, where):
    """i as an int if it is a token id: an integer in [0, 2^32), the range of the uint32
    token files and of the engine's pair keys (a bool is no id). where() names the token."""
    if (type(i) is int or isinstance(i, np.integer)) and 0 <= i < 1 << 32:
        return int(i)
    raise ValueError(f"{where()} has id {i!r}; a token id is an integer from 0 to 2^32 - 1")


def checked_ids(ids, vocab):
    """decode's ids as a list of ints in vocab: a list, numpy array, torch tensor or any iterable of integers. Arrays
    and tensors are duck-typed by .tolist() (bpe.py does not import torch); floats and bools are refused: True would
    decode as id 1."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    try:
        ids = list(ids)          # an iterator must survive the error path's second look
    except TypeError:
        raise ValueError(f"cannot decode {short_repr(ids)}: decode takes a sequence of token ids") from None
    if not set(map(type, ids)) <= {int}:  # numpy's and torch's scalars (list(tensor) gives 0-d tensors) as Python's
        ids = [i.tolist() if hasattr(i, "tolist") else i for i in ids]
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise ValueError(f"cannot decode {short_repr(i)} ({type(i).__name__}): token ids must be integers")
    if not vocab.keys() >= set(ids):
        unknown = next(i for i in ids if i not in vocab)
        raise ValueError(f"cannot decode token id {unknown}: the vocab has ids 0..{max(vocab)} ({len(vocab)} tokens)")
    return ids


def worker_count(num_workers):
    """num_workers checked (a whole number from 1), or one per usable core for None."""
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer))
                                    or num_workers < 1):
        raise ValueError(f"num_workers must be a whole number of at least 1 (None: one per usable core), got "
                         f"{num_workers!r}")
    return num_workers or usable_cores()


def peak_memory():  # "; peak RSS N MB (largest worker M MB)" for bpe.py train's report, "" without getrusage
    try:
        import resource                        # Unix only: imported here, so that the library loads on Windows
    except ImportError:
        return ""
    unit = 1 << 20 if sys.platform == "darwin" else 1 << 10    # ru_maxrss: bytes on macOS, kB on Linux
    me, kids = (resource.getrusage(who).ru_maxrss / unit for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return f"; peak RSS {me:.0f} MB (largest worker {kids:.0f} MB)"


def _plan_chunks(input_path, special_tokens, num_workers, tasks_per_worker):
    """(size, workers, chunk offsets): about tasks_per_worker chunks per worker, of _MIN_CHUNK to _CHUNK_BYTES."""
    size = check_input_file(input_path)
    num_workers = worker_count(num_workers)
    chunk = min(_CHUNK_BYTES, max(_MIN_CHUNK, size // (tasks_per_worker * num_workers)))
    return size, num_workers, _chunk_bounds(input_path, size, [s.encode() for s in special_tokens],
                                            -(-size // chunk))


# -----------------------------------------------------------------------------
# 3. Counting pre-tokens in worker processes, into hash tables keyed by their bytes
#
# bpe.count_pretokens for big files, compiled: the scanner finds each pre-token and a hash
# table keyed by its bytes counts it (no Python str per pre-token). A table is three arrays
# (open addressing, linear probing): word w (a distinct pre-token) is word_bytes[rec[2w]:
# rec[2w + 2]], seen rec[2w + 1] times, so a look-up touches few cache lines; slots[hash & mask]
# holds tag << 32 | w (-1: empty), the tag being other bits of the hash, so most wrong slots
# are passed without reading their word. Each worker counts its own run of chunks, up to 4 MiB
# at a time, into one table; the parent merges those few tables.
COMPILED_COUNT_MIN = 1 << 20   # smaller files are counted by bpe.py: no scanner to compile or load


@register_jitable
def _copy(dst, at, src):
    """dst[at:at + len(src)] = src, as a loop: the slice assignment would compile its shape check (see the top)."""
    for k in range(src.shape[0]):
        dst[at + k] = src[k]


@njit(cache=True, inline="always")
def _hash_bytes(data, i, j):
    """64-bit FNV-1a of data[i:j], mixed so that the low bits (the slot) depend on every byte."""
    h = np.int64(-3750763034362895579)               # FNV offset basis, as int64
    for k in range(i, j):
        h = (h ^ np.int64(data[k])) * np.int64(1099511628211)
    h ^= h >> 29
    h *= np.int64(-4658895280553007687)
    return h ^ (h >> 32)


@njit(cache=True)
def _word_table_new(n_words, n_bytes):
    """(slots, rec, word_bytes) with room for n_words words of n_bytes in all."""
    cap = 16
    while cap < 2 * n_words + 2:                   # at most half full
        cap *= 2
    return (np.full(cap, -1, np.int64), np.zeros(2 * n_words + 3, np.int64),
            np.empty(max(n_bytes, 16), np.uint8))


@njit(cache=True)
def _word_table_reserve(table, n, extra_bytes):
    """The table with room for one more word of extra_bytes bytes, its slots at most half full."""
    slots, rec, word_bytes = table
    rec = _grow(rec, 2 * n + 3)
    word_bytes = _grow(word_bytes, rec[2 * n] + extra_bytes)
    if 2 * (n + 1) > slots.shape[0]:
        slots = _word_table_slots(np.full(2 * slots.shape[0], -1, np.int64), rec, word_bytes, n)
    return slots, rec, word_bytes


@njit(cache=True)
def _word_table_slots(slots, rec, word_bytes, n):
    """The empty slots array with words 0..n-1 put in (their hashes computed again)."""
    mask = slots.shape[0] - 1
    for w in range(n):
        h = _hash_bytes(word_bytes, rec[2 * w], rec[2 * w + 2])
        s = h & mask
        while slots[s] >= 0:
            s = (s + 1) & mask
        slots[s] = ((h >> 33) & 0x7FFFFFFF) << 32 | w     # tag << 32 | w (see above)
    return slots


@njit(cache=True, inline="always")
def _word_table_find(slots, rec, word_bytes, src, i, j, h):
    """The slot of the word src[i:j] (hash h), or the empty slot where it would go."""
    mask = slots.shape[0] - 1
    s, tag, found = h & mask, (h >> 33) & 0x7FFFFFFF, False
    while not found and slots[s] >= 0:            # one return, at the end (see the top of this file)
        w = slots[s] & 0xFFFFFFFF
        a = rec[2 * w]
        found = slots[s] >> 32 == tag and rec[2 * w + 2] - a == j - i
        k = 0
        while found and k < j - i:
            found = word_bytes[a + k] == src[i + k]
            k += 1
        s = (s + 1 - found) & mask
    return s


@njit(cache=True)
def _word_table_put(slots, rec, word_bytes, s, n, src, i, j, h, c):
    """Put src[i:j] (hash h) in the empty slot s as word n, seen c times (the table has room)."""
    a = rec[2 * n]
    slots[s] = ((h >> 33) & 0x7FFFFFFF) << 32 | n
    _copy(word_bytes, a, src[i:j])
    rec[2 * n + 1], rec[2 * n + 2] = c, a + j - i


@njit(cache=True)
def _count_while_room(data, i, e, classes, slots, rec, word_bytes, n):
    """Count the pre-tokens of data[i:e] into the table (n words so far) until a new word does not
    fit. Returns (i, n): i = e when done, else where that word starts (see the top of this file)."""
    room = True
    while room and i < e:
        j = _next_pretoken(data, i, e, classes)
        h = _hash_bytes(data, i, j)
        s = _word_table_find(slots, rec, word_bytes, data, i, j, h)
        if slots[s] >= 0:
            rec[2 * (slots[s] & 0xFFFFFFFF) + 1] += 1
        else:
            room = (2 * (n + 1) <= slots.shape[0] and 2 * n + 3 <= rec.shape[0]
                    and rec[2 * n] + j - i <= word_bytes.shape[0])
            if room:
                _word_table_put(slots, rec, word_bytes, s, n, data, i, j, h, np.int64(1))
                n += 1
        i = j if room else i
    return i, n


@njit(cache=True)
def _count_segments(data, segments, classes, table, n):
    """Count the pre-tokens of data[a:b], for each row (a, b) of segments, into the table (n words)."""
    slots, rec, word_bytes = table
    for r in range(segments.shape[0]):
        i, e = segments[r, 0], segments[r, 1]
        while i < e:
            i, n = _count_while_room(data, i, e, classes, slots, rec, word_bytes, n)
            if i < e:                      # make room for one more word, then go on
                slots, rec, word_bytes = _word_table_reserve((slots, rec, word_bytes), n, e - i)
    return (slots, rec, word_bytes), n


@njit(cache=True)
def _word_tables_merge(table, n, o_rec, o_word_bytes):
    """Add the words of another table (its rec and word_bytes) into this one (n words)."""
    slots, rec, word_bytes = table
    for w in range((o_rec.shape[0] - 1) // 2):
        i, j, c = o_rec[2 * w], o_rec[2 * w + 2], o_rec[2 * w + 1]
        h = _hash_bytes(o_word_bytes, i, j)
        s = _word_table_find(slots, rec, word_bytes, o_word_bytes, i, j, h)
        if slots[s] >= 0:
            rec[2 * (slots[s] & 0xFFFFFFFF) + 1] += c
        else:                              # only new words pay for growing the arrays
            slots, rec, word_bytes = _word_table_reserve((slots, rec, word_bytes), n, j - i)
            s = _word_table_find(slots, rec, word_bytes, o_word_bytes, i, j, h)
            _word_table_put(slots, rec, word_bytes, s, n, o_word_bytes, i, j, h, c)
            n += 1
    return (slots, rec, word_bytes), n


def _words_of_table(rec, word_bytes):
    """The merge loop's input (ids, word_start, word_count): the words of 2 bytes or more, end to end."""
    length = np.diff(rec[0::2])
    keep = length > 1
    word_start = np.zeros(np.count_nonzero(keep) + 1, np.int64)
    np.cumsum(length[keep], out=word_start[1:])
    return word_bytes[np.repeat(keep, length)], word_start, rec[1::2][keep]


def _trimmed(table, n):
    """(rec, word_bytes) of a table of n words, as views of their used part (pickled, a view sends only that)."""
    slots, rec, word_bytes = table
    return rec[:2 * n + 1], word_bytes[:rec[2 * n]]


def _count_range(args):
    """Worker: the table (rec, word_bytes) of the chunks bounds[0]:bounds[1]:... of the file, read into one buffer."""
    path, bounds, special_tokens = args
    special_re = _special_bytes_re([s.encode("utf-8") for s in special_tokens])
    classes = _char_classes()
    buf = np.empty(max(b - a for a, b in zip(bounds, bounds[1:])), np.uint8)
    table, n = _word_table_new(1 << 16, 1 << 20), 0
    with open(path, "rb") as f:
        for a, b in zip(bounds, bounds[1:]):
            data = read_into(f, a, buf[:b - a], path)  # cut short since it was planned: stale bytes, so refused
            check_utf8(data, path, a)             # the scanner trusts its input to be UTF-8
            spans = chain.from_iterable(m.span() for m in special_re.finditer(data)) if special_re else ()
            segments = np.array([0, *spans, b - a], np.int64).reshape(-1, 2)   # between special tokens
            table, n = _count_segments(data, segments, classes, table, n)
    return _trimmed(table, n)


def count_words(input_path, special_tokens, num_workers=None, vocab_size=None):
    """bpe.count_pretokens (special tokens checked) in compiled code, as the merge loop's arrays
    (_words_of_table). One contiguous run of chunks per worker; the compiled merge loop loads in
    this process while the workers count, if numba's disk cache holds it or vocab_size needs more
    merges than Python runs. Otherwise bpe.py decides from the counts: a small job on a new machine
    never waits for the merge loop's compile (the longest of the engine's) to run it as Python."""
    _, num_workers, bounds = _plan_chunks(input_path, special_tokens, num_workers, 1)
    n_runs = min(num_workers, len(bounds) - 1)
    cut = [round(k * (len(bounds) - 1) / n_runs) for k in range(n_runs + 1)]
    tasks = [(input_path, bounds[a:b + 1], special_tokens) for a, b in zip(cut, cut[1:])]
    _note_first_compile(_count_segments)
    table = _word_table_new(1, 1)          # compiled (or loaded) with tiny jobs: before the fork, for the workers
    _count_segments(np.zeros(1, np.uint8), np.zeros((1, 2), np.int64), _char_classes(), table, 0)
    parallel = n_runs > 1
    with _worker_pool(n_runs) if parallel else contextlib.nullcontext() as workers:
        results = workers.imap_checked(_count_range, tasks, False) if parallel else map(_count_range, tasks)
        if parallel:                       # the workers have started counting: load the parent's half
            _word_tables_merge(table, 0, *_trimmed(table, 0))
        # (before the counting only the merges are known: 0 positions and 0 bytes ask about them alone)
        merges, index = (vocab_size or 0) - 256 - len(new_special_tokens(special_tokens)), _cache_index(merge_loop)
        if compiled_merge_pays(0, merges, 0) or index and os.path.exists(index):
            load_merge_loop()
        raise_held_ctrl_c()                # a stop held while those loaded: the workers may be gone
        tables = list(results)
    # The biggest table, with room for the words of all (fewer if they share words), takes
    # in the others: its own words need no look-up, only their slots.
    tables.sort(key=lambda t: len(t[0]))
    n_max = sum((len(rec) - 1) // 2 for rec, word_bytes in tables)
    slots, rec, word_bytes = _word_table_new(n_max, sum(len(word_bytes) for rec, word_bytes in tables))
    base_rec, base_bytes = tables.pop()
    n = (len(base_rec) - 1) // 2
    rec[:len(base_rec)], word_bytes[:len(base_bytes)] = base_rec, base_bytes
    table = (_word_table_slots(slots, rec, word_bytes, n), rec, word_bytes)
    del base_rec, base_bytes
    while tables:
        table, n = _word_tables_merge(table, n, *tables.pop())
    return _words_of_table(*_trimmed(table, n))


# -----------------------------------------------------------------------------
# 4. The tuned merge loop
#
# bpe._merge_loop's algorithm (pair counts, the words of each pair, a max-heap with lazy
# deletion), laid out for the processor's caches, all in numpy arrays:
# - words: one int32 array of records [length, last merge that visited it, count (two
#   31-bit halves), tokens...]; a word is named by the offset of its record, so a visit
#   reads one place in memory. A word shrinks in place as it merges.
# - the pair table: open addressing, one (cap, 4) int64 row per slot, [key = left << 32 |
#   right, count, first entry of its word list, last word listed]: one lookup, one slot.
#   A pair never grows again once its count is 0 (only pairs of the newest token grow),
#   so a full table is rebuilt without those.
# - word lists: (N, 2) int32 rows [word, next entry]. The starting lists (byte pairs) are
#   one contiguous run per pair; the lists of a new token's pairs are prepended as its merge
#   makes them, then packed into one run each. A merge gathers its list first and prefetches
#   the words ahead of the loop over them; merge m marks the words it visited. When the rows
#   run out, the live lists are copied out contiguously and the rest is dropped.
# - one merge's changes: (x, a) loses, (x, ab) gains, ... go into a small table of their
#   own first (it stays in cache) and reach the big pair table once per pair at the end;
#   only the neighbours of a merged pair change, not the whole word.
# - the heap holds one entry per pair: a popped entry whose count is stale goes back with
#   its true count, and it compares counts itself, calling the bytes tie-break only on a tie.
# The helpers are register_jitable: compiled into _merge_loop.

_EMPTY = -1
_AHEAD = 8        # how many words ahead the merge loop prefetches


@intrinsic
def _prefetch(typingctx, a, i):
    """Ask the processor to bring a[i] into the cache (compiled code only)."""
    def codegen(context, builder, sig, args):
        p = builder.gep(context.make_array(sig.args[0])(context, builder, args[0]).data, [args[1]])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        # read (0), keep in all cache levels (3), data (1)
        builder.call(f, [builder.bitcast(p, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.void(a, types.intp), codegen


@register_jitable(inline='always')
def _key(left, right):
    return (int(left) << 32) | int(right)


@register_jitable(inline='always')
def _hash_home(tab, key):
    """The slot where the search for key starts."""
    h = (key >> 32) * 0x9E3779B1 + (key & 0xFFFFFFFF) * 0x85EBCA77   # < 2^53: no overflow
    return (h ^ (h >> 29)) & (tab.shape[0] - 1)


@register_jitable
def _hash_slot(tab, key):
    """Slot holding key, or the empty slot where it would go (linear probing)."""
    mask = tab.shape[0] - 1
    i = _hash_home(tab, key)
    while True:
        k = tab[i, 0]
        if k == _EMPTY or k == key:
            return i
        i = (i + 1) & mask


@register_jitable
def _pair_table_new(cap):
    """An empty pair table of cap slots (a power of two): every row [empty, 0, -1, -1]."""
    tab = np.full((cap, 4), -1, np.int64)
    tab[:, 1] = 0
    return tab


@register_jitable
def _pair_table_room(tab, n_keys, more):
    """(tab, n_keys) with room for more keys at most half full: a full table is rebuilt without its
    dead keys (count 0), at twice the size if that is still needed."""
    if 2 * (n_keys + more) <= tab.shape[0]:
        return tab, n_keys
    live = np.sum(tab[:, 1] > 0)
    cap = 1024
    while cap < 4 * (live + more):
        cap *= 2
    new = _pair_table_new(cap)
    for i in range(tab.shape[0]):
        if tab[i, 0] != _EMPTY and tab[i, 1] > 0:
            s = _hash_slot(new, tab[i, 0])
            _copy(new[s], 0, tab[i])
    return new, live


@register_jitable
def _grow(a, need):
    """a, or a copy with at least twice as many rows, so that row need-1 fits."""
    if need <= a.shape[0]:
        return a
    b = np.empty((max(need, 2 * a.shape[0]),) + a.shape[1:], a.dtype)
    _copy(b.reshape(-1), 0, a.reshape(-1))
    return b


@register_jitable
def _copy_lists(tab, slots, lists, out, base):
    """Copy the word list of each pair tab[s], s in slots (first entry: tab[s, 2]), into out as one
    contiguous run, entries numbered from base; tab[s, 2] then names the copy. Returns the count."""
    n = 0
    for s in slots:
        e = tab[s, 2]
        tab[s, 2] = base + n if e != -1 else -1
        while e != -1:
            out[n, 0], out[n, 1] = lists[e, 0], base + n + 1
            n, e = n + 1, lists[e, 1]
            if e == -1:
                out[n - 1, 1] = -1             # the end of this list
    return n


@register_jitable
def _compact_lists(tab, lists):
    """(lists, n_entries): the word lists of the live pairs copied, each contiguous, into a new
    array half free; the entries of merged and dead pairs (most, after the first merges) are dropped."""
    live, n = (tab[:, 0] != _EMPTY) & (tab[:, 1] > 0), 0
    for s in range(tab.shape[0]):
        tab[s, 2] = tab[s, 2] if live[s] else -1
        e = tab[s, 2]
        while e != -1:
            n, e = n + 1, lists[e, 1]
    new = np.empty((max(1024, 2 * n), 2), np.int32)
    return new, _copy_lists(tab, np.nonzero(live)[0], lists, new, 0)


@register_jitable(inline='always')
def _word_count(words, w):
    return int(words[w + 2]) | (int(words[w + 3]) << 31)


@register_jitable
def _start_pairs(words):
    """(tab, n_keys, lists, n_entries) for the words as bytes: byte pairs counted in a dense
    256 x 256 array, each pair's list laid out as one contiguous run."""
    count = np.zeros(65536, np.int64)
    n_words = np.zeros(65536, np.int64)        # words containing the pair
    last = np.full(65536, -1, np.int64)
    w = 0
    while w < words.shape[0]:
        cw = _word_count(words, w)
        for i in range(w + 4, w + 4 + words[w] - 1):
            p = 256 * words[i] + words[i + 1]
            count[p] += cw
            if last[p] != w:
                last[p], n_words[p] = w, n_words[p] + 1
        w += 4 + words[w]
    run = np.zeros(65537, np.int64)            # pair p's run: run[p] to run[p + 1]
    _copy(run, 1, np.cumsum(n_words))
    lists = np.empty((max(1024, 2 * run[65536]), 2), np.int32)
    fill = run[:65536].copy()
    last[:] = -1
    w = 0
    while w < words.shape[0]:
        for i in range(w + 4, w + 4 + words[w] - 1):
            p = 256 * words[i] + words[i + 1]
            if last[p] != w:
                last[p] = w
                lists[fill[p], 0], lists[fill[p], 1] = w, fill[p] + 1
                fill[p] += 1
        w += 4 + words[w]
    n_keys = np.sum(count > 0)
    tab = _pair_table_room(_pair_table_new(1), 0, n_keys)[0]     # empty, with room for n_keys
    for p in range(65536):
        if count[p] > 0:
            lists[run[p + 1] - 1, 1] = -1      # the end of the run
            s = _hash_slot(tab, _key(p // 256, p % 256))
            tab[s, 0], tab[s, 1], tab[s, 2], tab[s, 3] = (_key(p // 256, p % 256), count[p],
                                                           run[p], last[p])
    return tab, n_keys, lists, run[65536]


@register_jitable
def _bytes_cmp(tok_bytes, start, length, x, y):
    """Compare the byte strings of tokens x and y like Python bytes: -1, 0 or 1."""
    sx, sy, lx, ly = start[x], start[y], length[x], length[y]
    k, n = 0, min(lx, ly) if x != y else 0
    while k < n and tok_bytes[sx + k] == tok_bytes[sy + k]:
        k += 1
    if k < n:
        return 1 if tok_bytes[sx + k] > tok_bytes[sy + k] else -1
    return 0 if lx == ly else (1 if lx > ly else -1)


@register_jitable
def _pair_gt(ki, kj, tok_bytes, start, length):
    """The tie-break of equal counts: key ki's pair is the greater pair of byte strings."""
    r = _bytes_cmp(tok_bytes, start, length, ki >> 32, kj >> 32)
    if r == 0:
        r = _bytes_cmp(tok_bytes, start, length, ki & 0xFFFFFFFF, kj & 0xFFFFFFFF)
    return r > 0


@register_jitable
def _sift_down(heap, i, n, tok_bytes, start, length):
    """Move row i of a heap of n rows down until both children rank below it."""
    k = -1
    while k != i:
        if k >= 0:
            heap[i, 0], heap[k, 0], heap[i, 1], heap[k, 1] = heap[k, 0], heap[i, 0], heap[k, 1], heap[i, 1]
            i = k
        l, r, k = 2 * i + 1, 2 * i + 2, i          # k: the largest of i and its children
        if l < n and (heap[l, 0] > heap[k, 0] or heap[l, 0] == heap[k, 0] and
                      _pair_gt(heap[l, 1], heap[k, 1], tok_bytes, start, length)):
            k = l
        if r < n and (heap[r, 0] > heap[k, 0] or heap[r, 0] == heap[k, 0] and
                      _pair_gt(heap[r, 1], heap[k, 1], tok_bytes, start, length)):
            k = r


@register_jitable
def _heap_push(heap, n, c, key, tok_bytes, start, length):
    """Append [c, key] to a heap of n rows (the caller makes room) and sift it up."""
    heap[n, 0], heap[n, 1] = c, key
    i = n
    while i > 0:
        p = (i - 1) // 2
        if heap[i, 0] < heap[p, 0] or heap[i, 0] == heap[p, 0] and \
                not _pair_gt(heap[i, 1], heap[p, 1], tok_bytes, start, length):
            break
        heap[i, 0], heap[p, 0], heap[i, 1], heap[p, 1] = heap[p, 0], heap[i, 0], heap[p, 1], heap[i, 1]
        i = p


@register_jitable
def _start_heap(tab, n_keys, tok_bytes, start, length):
    """A heap of every pair in the table."""
    heap = np.empty((max(1024, 2 * n_keys), 2), np.int64)
    n = 0
    for s in range(tab.shape[0]):
        if tab[s, 0] != _EMPTY:
            _heap_push(heap, n, tab[s, 1], tab[s, 0], tok_bytes, start, length)
            n += 1
    return heap, n


@register_jitable
def _bigger_changes(rows, used, n_used):
    """The changes table at twice the size, its n_used keys re-inserted."""
    new_rows, new_used = _pair_table_new(2 * rows.shape[0]), np.empty(rows.shape[0], np.int64)
    for k in range(n_used):
        s = _hash_slot(new_rows, rows[used[k], 0])
        _copy(new_rows[s], 0, rows[used[k]])
        new_used[k] = s
    return new_rows, new_used


@register_jitable(inline='always')
def _change(rows, used, n_used, key, d, w, lists, n_entries):
    """Add d to the count of pair key in one merge's table of changes (rows as in the pair table,
    used: the slots taken); if w >= 0, list word w under key (once in a row). No branch (see the
    top of this file). Returns (n_used, n_entries)."""
    s = _hash_slot(rows, key)
    new_key = int(rows[s, 0] == _EMPTY)
    first, last = int(rows[s, 2]), int(rows[s, 3])
    listed = int(w >= 0) & int(last != w)
    used[n_used] = s                       # kept only if the key is new
    lists[n_entries, 0], lists[n_entries, 1] = w, first      # kept only if listed
    rows[s, 0], rows[s, 1] = key, rows[s, 1] + d
    rows[s, 2], rows[s, 3] = first + listed * (n_entries - first), last + listed * (w - last)
    return n_used + new_key, n_entries + listed


@register_jitable(inline='always')
def _merge_word(w, a, b, t, tok, rows, used, n_used, lists, n_entries):
    """Replace every (a, b) in the word at offset w of tok (the words array) by t, left to right,
    in place; the neighbours' counts move into the changes table. Returns (n_used, n_entries)."""
    begin, end, cw = w + 4, w + 4 + tok[w], _word_count(tok, w)
    r = begin
    while r < end - 1 and (tok[r] != a or tok[r + 1] != b):
        r += 1
    o = r                                        # tok[begin:o] is the merged word so far
    while r < end:
        if r < end - 1 and tok[r] == a and tok[r + 1] == b:
            if o > begin:                        # (x, a) -> (x, t); x may be t already
                x = tok[o - 1]
                n_used, n_entries = _change(rows, used, n_used, _key(x, a), -cw, -1, lists, n_entries)
                n_used, n_entries = _change(rows, used, n_used, _key(x, t), cw, w, lists, n_entries)
            if r < end - 2:                      # (b, y) -> (t, y)
                y = tok[r + 2]
                n_used, n_entries = _change(rows, used, n_used, _key(b, y), -cw, -1, lists, n_entries)
                n_used, n_entries = _change(rows, used, n_used, _key(t, y), cw, w, lists, n_entries)
            tok[o] = t
            r += 2
        else:
            tok[o] = tok[r]
            r += 1
        o += 1
    tok[w] = o - begin
    return n_used, n_entries


@register_jitable
def _merge_words(visit, k, n_visit, m, a, b, t, words, rows, used, n_used, lists, n_entries):
    """Merge (a, b) into t in the words visit[k:n_visit] (merge m), until a word's changes might
    not fit (n tokens: 2n changed pairs at most). Returns (k, n_used, n_entries), k = n_visit when
    done: it never replaces an array (see the top of this file)."""
    while k < n_visit:
        if k + _AHEAD < n_visit:
            _prefetch(words, visit[k + _AHEAD])
            _prefetch(words, visit[k + _AHEAD] + 16)      # a word's second cache line
        w = visit[k]
        if words[w + 1] != m:                 # not listed twice
            if 2 * (n_used + 2 * words[w]) > rows.shape[0] or \
                    n_entries + words[w] > lists.shape[0]:
                return k, n_used, n_entries
            words[w + 1] = m
            n_used, n_entries = _merge_word(w, a, b, t, words, rows, used, n_used, lists,
                                            n_entries)
        k += 1
    return k, n_used, n_entries


@register_jitable
def _apply_changes(rows, used, n_used, t, tab, n_keys, heap, n_heap, tok_bytes, start, length):
    """Move one merge's changes into the pair table (and the new token t's pairs into the heap),
    emptying the changes table. Returns (tab, n_keys, heap, n_heap)."""
    tab, n_keys = _pair_table_room(tab, n_keys, n_used)
    heap = _grow(heap, n_heap + n_used)
    for k in range(n_used):                  # the slots are scattered: ask for them all first
        _prefetch(tab, 4 * _hash_home(tab, rows[used[k], 0]))
    for k in range(n_used):
        key, d = rows[used[k], 0], rows[used[k], 1]
        s = _hash_slot(tab, key)
        if key >> 32 == t or key & 0xFFFFFFFF == t:
            if d > 0:
                _copy(tab[s], 0, rows[used[k]])
                n_keys += 1
                _heap_push(heap, n_heap, d, key, tok_bytes, start, length)
                n_heap += 1
        else:
            tab[s, 1] += d
        rows[used[k], 0], rows[used[k], 1], rows[used[k], 2], rows[used[k], 3] = _EMPTY, 0, -1, -1
    return tab, n_keys, heap, n_heap


@register_jitable
def _gather_list(lists, e, visit):
    """(visit, n): the words of the list from entry e, in an array, so that they can be prefetched."""
    n, f = 0, e
    while f != -1:
        n, f = n + 1, lists[f, 1]
    visit = _grow(visit, n)
    n = 0
    while e != -1:
        visit[n], e = lists[e, 0], lists[e, 1]
        n += 1
    return visit, n


@register_jitable
def _add_token_bytes(tok_bytes, n_tok_bytes, start, length, a, b, t):
    """Append the bytes of token t = ab to tok_bytes; returns (tok_bytes, n_tok_bytes)."""
    la, lb = length[a], length[b]
    tok_bytes = _grow(tok_bytes, n_tok_bytes + la + lb)
    _copy(tok_bytes, n_tok_bytes, tok_bytes[start[a]:start[a] + la])
    _copy(tok_bytes, n_tok_bytes + la, tok_bytes[start[b]:start[b] + lb])
    start[t], length[t] = n_tok_bytes, la + lb
    return tok_bytes, n_tok_bytes + la + lb


@register_jitable
def _word_records(ids, word_start, word_count):
    """The words as one int32 array of records (see the top of this section)."""
    n_words = word_count.shape[0]
    if ids.shape[0] + 4 * n_words >= 2 ** 31:
        raise ValueError("too many distinct pre-tokens for the merge loop's int32 offsets")
    words = np.empty(ids.shape[0] + 4 * n_words, np.int32)
    for k in range(n_words):
        w, n = word_start[k] + 4 * k, word_start[k + 1] - word_start[k]
        words[w], words[w + 1] = n, -1
        words[w + 2], words[w + 3] = word_count[k] & 0x7FFFFFFF, word_count[k] >> 31
        _copy(words, w + 4, ids[word_start[k]:word_start[k + 1]])
    return words


def _merge_loop(ids, word_start, word_count, num_merges):
    """Up to num_merges merges as (lefts, rights), (M,) int64 each, as bpe._merge_loop."""
    words = _word_records(ids, word_start, word_count)
    tab, n_keys, lists, n_entries = _start_pairs(words)
    # Bytes of every token, for the tie-break: token x is tok_bytes[start[x]:start[x] + length[x]].
    n_tok = 256 + num_merges
    start = np.zeros(n_tok, np.int64)
    length = np.zeros(n_tok, np.int64)
    tok_bytes = np.empty(max(1024, 4 * n_tok), np.uint8)
    for x in range(256):
        tok_bytes[x], start[x], length[x] = x, x, 1
    n_tok_bytes = 256
    heap, n_heap = _start_heap(tab, n_keys, tok_bytes, start, length)

    lefts = np.empty(num_merges, np.int64)
    rights = np.empty(num_merges, np.int64)
    rows, used = _pair_table_new(1024), np.empty(512, np.int64)   # one merge's changes
    visit = np.empty(1024, np.int32)          # one merge's words
    m = 0
    while m < num_merges and n_heap > 0:
        c, key = heap[0, 0], heap[0, 1]
        n_heap -= 1
        heap[0, 0], heap[0, 1] = heap[n_heap, 0], heap[n_heap, 1]
        _sift_down(heap, 0, n_heap, tok_bytes, start, length)
        s = _hash_slot(tab, key)
        if tab[s, 1] != c:                   # stale: re-queue with the true count
            if tab[s, 1] > 0:               # (the pop made room)
                _heap_push(heap, n_heap, tab[s, 1], key, tok_bytes, start, length)
                n_heap += 1
            continue

        a, b, t = key >> 32, key & 0xFFFFFFFF, 256 + m      # t: the new token ab
        lefts[m], rights[m] = a, b
        tok_bytes, n_tok_bytes = _add_token_bytes(tok_bytes, n_tok_bytes, start, length, a, b, t)
        if 8 * n_entries > 7 * lists.shape[0]:    # nearly full: drop the dead entries
            lists, n_entries = _compact_lists(tab, lists)
        visit, n_visit = _gather_list(lists, tab[s, 2], visit)
        tab[s, 2] = -1
        n_used, first, k = 0, n_entries, 0
        while k < n_visit:
            k, n_used, n_entries = _merge_words(visit, k, n_visit, m, a, b, t, words, rows,
                                                used, n_used, lists, n_entries)
            if k < n_visit:                   # make room for word visit[k]'s changes
                w = visit[k]
                while 2 * (n_used + 2 * words[w]) > rows.shape[0]:
                    rows, used = _bigger_changes(rows, used, n_used)
                lists = _grow(lists, n_entries + words[w])
        # This merge's new lists interleave in lists[first:n_entries]: made contiguous, a later
        # merge walking one streams it in instead of waiting for memory at each entry.
        packed = np.empty((n_entries - first, 2), np.int32)
        _copy_lists(rows, used[:n_used], lists, packed, first)
        _copy(lists.reshape(-1), 2 * first, packed.reshape(-1))
        tab, n_keys, heap, n_heap = _apply_changes(rows, used, n_used, t, tab, n_keys, heap,
                                                   n_heap, tok_bytes, start, length)
        s = _hash_slot(tab, key)             # (tab may have been rebuilt)
        tab[s, 1] = 0                        # every occurrence is merged now
        m += 1
    return lefts[:m], rights[:m]


# Compiled once per machine and cached on disk by numba; loading it from there still costs
# more than a small job takes in bpe.py's loop as plain Python (see bpe._train_from_words).
merge_loop = njit(cache=True)(_merge_loop)


# Memory of the merge loop per byte of the longest pre-token: a merge records every place it
# changes, in one huge word most of its bytes (measured on single words of 0.5 to 4 MB).
LONG_WORD_BYTES = 210


def check_longest_word(word_start, where):
    """The length of the longest pre-token; MemoryError, before the merge loop allocates, when it needs more
    than there is."""
    longest = int(np.diff(word_start).max(initial=0))
    need, (have, what) = LONG_WORD_BYTES * longest, memory_bytes("cpu", 1)
    if need > have:
        raise MemoryError(f"{where} holds a pre-token of {longest:,} bytes (text with no space, digit or punctuation "
                         f"break); merging it needs about {need / 2**30:,.1f} GiB, more than {what} "
                         f"({have / 2**30:,.1f} GiB); break that text into lines or words, or leave it out")
    return longest


def merge_loop_loaded():
    """The compiled merge loop is loaded in this process (then any job may use it)."""
    return bool(merge_loop.signatures)


# Up to this much work bpe.py's merge loop runs as plain Python: a 130 KB file and 1,000 merges never
# wait for numba. Positions: the bytes of the distinct pre-tokens that have a pair.
INTERPRET_MAX_POSITIONS = 140_000
INTERPRET_MAX_MERGES = 1_000
INTERPRET_MAX_WORD = 1_000     # bytes: each merge may walk the longest word, at Python's speed


def interpreted_merges(positions, merges, longest):
    """How many of a job's merges bpe.py's loop learns as plain Python first (if pairs are left after them, the
    compiled loop learns all from the start): every one without numba's JIT (see JIT); on a small job up to
    INTERPRET_MAX_MERGES, so that a small text that runs out of pairs by then, whatever its vocabulary's size, never
    waits for the compile; none once the compiled loop is loaded, or where the job is too big for Python."""
    small = positions <= INTERPRET_MAX_POSITIONS and longest <= INTERPRET_MAX_WORD
    return merges if not JIT else 0 if merge_loop_loaded() or not small else min(merges, INTERPRET_MAX_MERGES)


def compiled_merge_pays(positions, merges, longest):  # will the compiled loop learn any of these merges?
    return interpreted_merges(positions, merges, longest) < merges


def load_merge_loop():
    """merge_loop, loaded once from numba's disk cache or compiled (saying so) on a tiny job."""
    if not merge_loop_loaded():
        _note_first_compile(merge_loop)
        merge_loop(np.zeros(1, np.uint8), np.array([0, 1], np.int64), np.ones(1, np.int64), 0)
    return merge_loop


# -----------------------------------------------------------------------------
# 5. The compiled encoder
#
# bpe.Tokenizer._encode_plain (regex pre-tokens, a dict cache, one pre-token merged at a
# time) is the definition; _encode_kernel does the same work in one pass over the UTF-8
# bytes: cut the next pre-token (_next_pretoken), look its bytes up in a cache of pre-token
# -> ids, and on a miss merge it by rank and remember it. All its state lives in a few
# numpy arrays held by an Encoder, so that a call costs little more than its own bytes:
#   pairs  (2C,) int64   hash table of the merges: [key, value] per slot, key = left << 32 | right,
#                        value = rank << 32 | merged id (-1: empty slot)
#   state  int64         [0, 256) the id of each byte; then (named below) the cache's entries,
#                        bytes and ids used, slots in use, slots to start with; from _SLOTS_AT
#                        on, 3 words per slot: hash of the pre-token, byte offset << 24 |
#                        length, id offset << 24 | number of ids (0: empty)
#   byte_pairs (65536,)  the same values for the pairs of two bytes, by direct index
#   cache_bytes          the cached pre-tokens' bytes (uint8), each after its length and its
#                        number of ids (a byte each)
#   cache_ids            their ids (uint32)
# The cache uses only the first slots of state, and doubles them (putting every entry back)
# as it fills: state is np.zeros, whose pages cost only once touched, and a fresh Tokenizer
# that encodes a few thousand words then touches a few pages, not all of them. When the
# slots cannot double or the cache's arrays are full it is emptied, so memory stays bounded.
_CACHE_SLOTS = 1 << 18   # hash slots of the compiled cache; it holds at most half as many words
_CACHE_FIRST_SLOTS = 1 << 12  # slots in use by a new (or emptied) cache
_CACHE_BYTES = 1 << 21   # bytes of cached pre-tokens
_CACHE_IDS = 1 << 20     # ids of cached pre-tokens
_N_ENTRIES, _N_BYTES, _N_IDS, _N_SLOTS, _FIRST_SLOTS, _SLOTS_AT = 256, 257, 258, 259, 260, 264
_SHORT_WORD = 16         # longer pre-tokens merge with a heap instead of rescanning all pairs
_CACHED_WORD = 255       # longer pre-tokens are merged every time, never cached
_NO_MERGE = 1 << 62
# Below this many characters (in one call, or so far on a Tokenizer) bpe.py's plain encode
# finishes before numba could load the compiled one from its disk cache (a first compile,
# once per machine, costs far more); once loaded in the process it is used for every call.
COMPILED_MIN_CHARS = 1 << 20
_compiled_encoder_loaded = False


@register_jitable
def _mix(h):
    """Slot hash of uint64 keys (a numpy array, or one key compiled); the caller keeps the low bits."""
    h = h * np.uint64(0x9E3779B97F4A7C15)
    return h ^ (h >> np.uint64(29))


def _merge_table(lefts, rights, values):
    """The merges' hash table (see above), filled by linear probing in numpy: in each round every
    pair not yet placed tries its next slot, and the first pair of each free slot takes it."""
    keys = (lefts.astype(np.uint64) << np.uint64(32) | rights.astype(np.uint64)).view(np.int64)
    cap = 1 << max(4, (2 * len(keys)).bit_length())
    table = np.full(2 * cap, -1, np.int64)
    slot = (_mix(keys.view(np.uint64)) & np.uint64(cap - 1)).astype(np.int64)
    todo = np.arange(len(keys))
    while len(todo):
        s = slot[todo]
        win = np.zeros(len(todo), bool)
        win[np.unique(s, return_index=True)[1]] = True
        win &= table[2 * s + 1] < 0
        table[2 * s[win]], table[2 * s[win] + 1] = keys[todo[win]], values[todo[win]]
        todo = todo[~win]
        slot[todo] = (slot[todo] + 1) & (cap - 1)
    return table


@njit(cache=True, inline="always")
def _merge_value(pairs, a, b):
    """rank << 32 | merged id of the merge (a, b), or _NO_MERGE."""
    key = np.int64(a) << 32 | np.int64(b)
    mask = (pairs.shape[0] >> 1) - 1
    s = np.int64(_mix(np.uint64(key)) & np.uint64(mask))
    while pairs[2 * s + 1] >= 0 and pairs[2 * s] != key:     # one return (see the top of this file)
        s = (s + 1) & mask
    v = pairs[2 * s + 1]
    return _NO_MERGE if v < 0 else v


@njit(cache=True)
def _merge_short(tok, k, n, pairs, rank):
    """BPE of tok[k:k+n] in place, as bpe.Tokenizer._merge_pretoken. rank[t]: the value of the pair
    at t (the caller fills rank[:n - 1]); a round looks up again only the pairs next to a new
    token, and finds the next round's lowest on the way. Returns the new n."""
    best = _NO_MERGE
    for t in range(n - 1):
        best = min(best, rank[t])
    while best != _NO_MERGE:
        w, t, prev_new, low = 0, 0, False, _NO_MERGE
        while t < n:                      # w writes, t reads: w <= t, so in place is safe
            new = t + 1 < n and rank[t] == best
            tok[k + w] = (best & 0xFFFFFFFF) if new else tok[k + t]
            t += 2 if new else 1
            if w > 0:                     # the pair (w-1, w): kept unless a side is new
                rank[w - 1] = _merge_value(pairs, tok[k + w - 1], tok[k + w]) \
                    if new or prev_new else rank[t - 2]
                low = min(low, rank[w - 1])
            prev_new = new
            w += 1
        n, best = w, low
    return n


@njit(cache=True, inline="always")
def _minheap_push(heap, h, x):
    heap[h] = x
    while h > 0 and heap[(h - 1) >> 1] > heap[h]:
        p = (h - 1) >> 1
        heap[h], heap[p] = heap[p], heap[h]
        h = p


@njit(cache=True, inline="always")
def _minheap_pop(heap, h):
    """Remove the smallest of heap[:h] (h >= 1) and return it; the heap then has h - 1."""
    top, h = heap[0], h - 1
    heap[0] = heap[h]
    i, c = 0, 1
    while c < h:
        c += c + 1 < h and heap[c + 1] < heap[c]      # the smaller child
        if heap[i] <= heap[c]:
            break
        heap[i], heap[c] = heap[c], heap[i]
        i, c = c, 2 * c + 1
    return top


@njit(cache=True)
def _merge_long(tok, k, n, pairs, work):
    """The same rounds as _merge_short for a longer pre-token (a CJK run can be hundreds of bytes),
    without rescanning it: the tokens form a linked list and every pair waits in a min-heap keyed
    rank << 32 | position, checked when popped against the pair now there (lazy deletion). A round pops
    all places of the lowest rank, then pushes the new tokens' pairs. work: (>= 8n,) int64, rank first."""
    value, ids, nxt, prv = work[:n], work[n:2 * n], work[2 * n:3 * n], work[3 * n:4 * n]
    changed, heap = work[4 * n:5 * n], work[5 * n:8 * n]
    value[n - 1] = _NO_MERGE
    h = 0
    for t in range(n):
        ids[t], nxt[t], prv[t] = tok[k + t], t + 1, t - 1
    nxt[n - 1] = -1
    for t in range(n - 1):
        if value[t] != _NO_MERGE:
            _minheap_push(heap, h, (value[t] >> 32) << 32 | t)
            h += 1
    while h > 0:
        r, m = heap[0] >> 32, 0
        while h > 0 and heap[0] >> 32 == r:       # every place of the pair of rank r
            t = _minheap_pop(heap, h) & 0xFFFFFFFF
            h -= 1
            v, u = value[t], nxt[t]
            if v == _NO_MERGE or v >> 32 != r:    # a stale entry: that pair has changed
                continue
            ids[t], ids[u], nxt[t] = v & 0xFFFFFFFF, -1, nxt[u]
            value[t] = value[u] = _NO_MERGE
            if prv[t] >= 0:
                value[prv[t]] = _NO_MERGE
            if nxt[u] >= 0:
                prv[nxt[u]] = t
            changed[m] = t
            m += 1
        for q in range(m):                         # the pairs the new tokens make
            t = changed[q]
            for a, b in ((prv[t], t), (t, nxt[t])):
                if a >= 0 and b >= 0:
                    v = value[a] = _merge_value(pairs, ids[a], ids[b])
                    if v != _NO_MERGE:
                        _minheap_push(heap, h, (v >> 32) << 32 | a)
                        h += 1
    w, t = 0, 0
    while t >= 0:
        tok[k + w] = ids[t]
        w, t = w + 1, nxt[t]
    return w


@njit(cache=True, inline="always")
def _cache_put(state, h, b, n, c, m):
    """Put the entry (hash h, n bytes at cache_bytes[b:], m ids at cache_ids[c:]) in a free slot."""
    mask = state[_N_SLOTS] - 1
    s = h & mask
    while state[_SLOTS_AT + 3 * s + 1] != 0:
        s = (s + 1) & mask
    at = _SLOTS_AT + 3 * s
    state[at], state[at + 1], state[at + 2] = h, b << 24 | n, c << 24 | m


@njit(cache=True)
def _cache_double(state, cache_bytes):
    """Double the cache's slots in use and put every entry back, found in cache_bytes (where each
    word's bytes follow its length and number of ids): growing allocates nothing."""
    state[_SLOTS_AT:_SLOTS_AT + 3 * state[_N_SLOTS]] = 0
    state[_N_SLOTS] *= 2
    b, c = 0, 0
    while b < state[_N_BYTES]:
        n, m = np.int64(cache_bytes[b]), np.int64(cache_bytes[b + 1])
        _cache_put(state, _hash_bytes(cache_bytes, b + 2, b + 2 + n), b + 2, n, c, m)
        b, c = b + 2 + n, c + m


@njit(cache=True)
def _encode_new(data, i, j, pairs, byte_pairs, state, cache_bytes, cache_ids, out, k, work, h):
    """Ids of a pre-token data[i:j] not in the cache (hash h), written at out[k:], then remembered
    unless it is long (a full cache is emptied first). Returns the end. work: the merges' scratch."""
    n = j - i
    for t in range(n):
        out[k + t] = state[data[i + t]]
    if 8 * n > work.shape[0]:           # a longer word (never cached) has its own
        work = np.empty(8 * n, np.int64)
    for t in range(n - 1):              # its pairs are pairs of bytes: one look-up each
        work[t] = byte_pairs[np.int64(data[i + t]) << 8 | data[i + t + 1]]
    m = _merge_short(out, k, n, pairs, work) if n <= _SHORT_WORD else _merge_long(out, k, n, pairs, work)
    end = k + m
    if n > _CACHED_WORD:
        return end
    full = 2 * (state[_N_ENTRIES] + 1) > state[_N_SLOTS]
    if full and 6 * state[_N_SLOTS] <= state.shape[0] - _SLOTS_AT:
        _cache_double(state, cache_bytes)
    if 2 * (state[_N_ENTRIES] + 1) > state[_N_SLOTS] or state[_N_BYTES] + 2 + n > cache_bytes.shape[0] \
            or state[_N_IDS] + m > cache_ids.shape[0]:
        state[_N_ENTRIES:_N_IDS + 1] = 0                 # empty: back to the first slots
        state[_SLOTS_AT:_SLOTS_AT + 3 * state[_N_SLOTS]] = 0
        state[_N_SLOTS] = state[_FIRST_SLOTS]
    b, c = state[_N_BYTES], state[_N_IDS]
    cache_bytes[b], cache_bytes[b + 1] = n, m                        # m <= n <= _CACHED_WORD: a byte each
    _copy(cache_bytes, b + 2, data[i:j])
    _copy(cache_ids, c, out[k:end])
    _cache_put(state, h, b + 2, n, c, m)
    state[_N_ENTRIES] += 1
    state[_N_BYTES] += 2 + n
    state[_N_IDS] += m
    return end


@njit(cache=True)
def _encode_kernel(data, specials, pairs, byte_pairs, state, cache_bytes, cache_ids, classes):
    """(N,) uint32 ids of the valid UTF-8 bytes data, whose special tokens are the rows (start, end,
    id) of specials. The cache look-up is written out in the loop: a call would cost more."""
    out = np.empty(data.shape[0] + specials.shape[0], np.uint32)  # one id per byte at most
    work = np.empty(8 * _CACHED_WORD, np.int64)
    mask = state[_N_SLOTS] - 1
    k, i = np.int64(0), np.int64(0)
    for r in range(specials.shape[0] + 1):
        end = specials[r, 0] if r < specials.shape[0] else data.shape[0]
        while i < end:
            j = _next_pretoken(data, i, end, classes)
            if j == i + 1:                             # one byte: its id
                out[k] = state[data[i]]
                k, i = k + 1, j
                continue
            h = _hash_bytes(data, i, j)
            s, m = h & mask, -1
            while m < 0:                               # probe until the word or an empty slot
                at = _SLOTS_AT + 3 * s
                where = state[at + 1]
                if where == 0:
                    break
                if state[at] == h and where & 0xFFFFFF == j - i:
                    b = (where >> 24) - i
                    t = i
                    while t < j and cache_bytes[b + t] == data[t]:
                        t += 1
                    if t == j:
                        c, m = state[at + 2] >> 24, state[at + 2] & 0xFFFFFF
                        for t in range(m):             # a loop: a slice costs more
                            out[k + t] = cache_ids[c + t]
                s = (s + 1) & mask
            if m < 0:
                k = _encode_new(data, i, j, pairs, byte_pairs, state, cache_bytes, cache_ids, out, k,
                                work, h)
                mask = state[_N_SLOTS] - 1                  # the cache may have grown
            else:
                k += m
            i = j
        if r < specials.shape[0]:
            out[k] = specials[r, 2]
            k, i = k + 1, specials[r, 1]
    return out[:k]


class Encoder:
    """The compiled encoder of one tokenizer: byte_ids[b] is the id of byte b, merge_rank
    {(left id, right id): (rank, merged id)}, special_ids {special token bytes: id}."""

    def __init__(self, byte_ids, merge_rank, special_ids):
        pairs = np.array(list(merge_rank), np.int64).reshape(-1, 2)
        values = np.array([rank << 32 | t for rank, t in merge_rank.values()], np.int64)
        self.pairs = _merge_table(pairs[:, 0], pairs[:, 1], values)
        byte_ids = np.array(byte_ids, np.int64)
        order = np.argsort(byte_ids)
        byte = order[np.minimum(np.searchsorted(byte_ids[order], pairs), 255)]   # (M, 2): the byte of each side
        both = (byte_ids[byte] == pairs).all(axis=1)                              # if both are bytes
        self.byte_pairs = np.full(1 << 16, _NO_MERGE, np.int64)
        self.byte_pairs[byte[both, 0] << 8 | byte[both, 1]] = values[both]
        self.state = np.zeros(_SLOTS_AT + 3 * _CACHE_SLOTS, np.int64)
        self.state[:256] = byte_ids
        self.state[_N_SLOTS] = self.state[_FIRST_SLOTS] = min(_CACHE_FIRST_SLOTS, _CACHE_SLOTS)
        self.cache_bytes = np.zeros(_CACHE_BYTES, np.uint8)
        self.cache_ids = np.zeros(_CACHE_IDS, np.uint32)
        # UTF-8 is self-synchronizing: the special tokens' matches in the bytes are those in the text.
        self.special_ids, self.special_re = special_ids, _special_bytes_re(list(special_ids))

    def encode(self, data):
        """(N,) uint32 ids of the UTF-8 bytes data (valid UTF-8)."""
        global _compiled_encoder_loaded
        if not _compiled_encoder_loaded:
            _note_first_compile(_encode_kernel)
        found = any(s in data for s in self.special_ids)       # (none when there are no special tokens)
        specials = np.array([(m.start(), m.end(), self.special_ids[m.group()])
                             for m in (self.special_re.finditer(data) if found else ())], np.int64)
        with np.errstate(over="ignore"):  # the hashes wrap by design: numpy's scalars warn (NUMBA_DISABLE_JIT=1)
            ids = _encode_kernel(np.frombuffer(data, np.uint8), specials.reshape(-1, 3), self.pairs,
                                 self.byte_pairs, self.state, self.cache_bytes, self.cache_ids,
                                 _char_classes())
        _compiled_encoder_loaded = True
        return ids


def compiled_encoder_pays(n_chars):
    """Encode n_chars (so far, on one Tokenizer) compiled: it is loaded, or the text pays for loading it (never
    under NUMBA_DISABLE_JIT=1: see JIT)."""
    return JIT and (_compiled_encoder_loaded or n_chars >= COMPILED_MIN_CHARS)


def load_compiled_encoder():
    """Compile the encoder (or load it from numba's disk cache) once per process."""
    if not _compiled_encoder_loaded:
        Encoder(list(range(256)), {}, {}).encode(b"ab")


# -----------------------------------------------------------------------------
# 6. encode_file: a text file to a .npy of ids, in parallel and in constant memory

_worker_tokenizer = None


def _init_encode_worker(tok):
    global _worker_tokenizer
    _worker_tokenizer = tok


def _encode_chunk(args):
    """Worker: the ids of one chunk as an array, by the compiled encoder or bpe.py's plain one."""
    path, start, end, dtype, compiled = args
    with open(path, "rb") as f:
        data = read_exactly(f, start, end - start, path)  # a file cut short since it was planned: one sentence
    text = check_utf8(data, path, start)               # names the offset of a bad byte
    try:
        if compiled:                                   # it reads the bytes: no re-encoding
            return _worker_tokenizer._engine.encode(data).astype(dtype), end - start
        return np.array(_worker_tokenizer._encode_plain(text), dtype=dtype), end - start
    except MemoryError:   # one huge pre-token (no space, digit or punctuation in megabytes): its merges' scratch
        raise MemoryError(f"{path}: bytes {start:,} to {end:,} need more memory than there is to encode (text with "
                          "no place to cut, likely one pre-token of megabytes); break that text into lines or words, "
                          "or leave it out") from None


def _npy_header(dtype, n):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
        "shape": (n,)})
    return buf.getvalue()


@ctrl_c_stays_keyboard_interrupt
def encode_file(tokenizer, input_path, out_path, num_workers=None, progress=True):
    """Tokenize a UTF-8 file into out_path (np.save format, uint16 when every id fits, else uint32),
    written atomically, in chunks encoded by worker processes. Returns the number of tokens."""
    # About 4 tasks per worker: enough to balance them, few enough to keep per-task overhead small.
    size, num_workers, bounds = _plan_chunks(input_path, tokenizer.special_tokens, num_workers, 4)
    if same_file(input_path, out_path):       # (checked here: the output is written while the input is read)
        raise ValueError(f"the output {out_path} is the input file {input_path}; writing the ids there would "
                         "destroy the text, so give another output path")
    dtype = np.uint16 if max(tokenizer.vocab) < (1 << 16) else np.uint32
    compiled = compiled_encoder_pays(size)
    tasks = [(input_path, a, b, dtype, compiled) for a, b in zip(bounds, bounds[1:])]
    _init_encode_worker(tokenizer)
    # The output is opened before any work: a place that cannot be written fails now, not after a chunk.
    with atomic_file(out_path) as f:
        f.write(_npy_header(dtype, 0))        # the real header needs the count: written last
        t0, shown = time.perf_counter(), None  # (before the first chunk: its time counts)
        results, workers = map(_encode_chunk, tasks), contextlib.nullcontext()
        if num_workers > 1 and len(tasks) > 1:
            # Encode the first chunk here first: the forked workers then start with the encoder loaded
            # and its pre-tokens in the cache instead of each loading and recomputing them.
            first = _encode_chunk(tasks[0])
            raise_held_ctrl_c()                # a stop held while the encoder loaded: before forking
            workers = _worker_pool(min(num_workers, len(tasks) - 1), _init_encode_worker, (tokenizer,))
            results = chain([first], workers.imap_checked(_encode_chunk, tasks[1:]))
        n_tokens, n_bytes = 0, 0
        scale, unit = (1e6, "MB") if size >= 1e6 else (1e3, "kB")  # a small file in kB, not "0.0/0.0 MB"
        with workers:                          # leaving the pool ends its workers
            try:
                for ids, nb in results:
                    f.write(ids.tobytes())  # not tofile: its OSError on a full disk carries no errno
                    n_tokens += len(ids)
                    n_bytes += nb
                    if progress:
                        mb_s = n_bytes / 1e6 / max(time.perf_counter() - t0, 1e-9)
                        shown = show_progress(f"encoded {n_bytes / scale:.1f}/{size / scale:.1f} {unit}, "
                                              f"{counted(n_tokens, 'token')}, {mb_s:.1f} MB/s",
                                              shown, last=n_bytes == size)
            finally:
                if progress and n_bytes:
                    end_progress()
        header = _npy_header(dtype, n_tokens)
        assert len(header) == len(_npy_header(dtype, 0)), "npy header length changed"
        f.seek(0)
        f.write(header)
    return n_tokens
