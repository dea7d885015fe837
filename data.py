"""Data for train.py: --data (a corpus name, a text file or token ids) -> token ids, read from their file in place.

In reading order: 1. corpora (Python's built-in docs, the CS336 datasets fetched once through download.py's
resumable downloads, a local file's train/valid split; GPT-2's tokenizer files, fetched on demand), 2. a BPE
tokenizer (bpe.py) and both splits as .npy ids (uint16; uint32 past 65,536 tokens), 3. prepare_data(), 4. checks
that the ids fit the model, the unigram baseline.
Every file is written whole or not at all (files.atomic_file), so a rerun skips what exists. It lives apart from
train.py because none of it is the training lecture: downloads, caches and file formats, shared with experiments.py.
"""
import codecs
import contextlib
import errno
import gzip
import hashlib
import operator
import os
import re
import shlex
import shutil
import sys
import sysconfig
import time
import urllib.request
import weakref
from pathlib import Path

import numpy as np

from bpe import Tokenizer, special_tokens_of, tokenizer_files, train_bpe
from bpe_fast import encode_file
from cli import DataError, UsageError, counted, disk_is_full, os_error_sentence, say, short_repr
from download import NET_ERRORS, download
from files import (atomic_file, changed_while_read, copy_file, dir_lock, file_sha256, is_ids, new_folders, packed,
                   read_exactly, read_into, same_file)

EOT = "<|endoftext|>"  # the document separator of every CS336 corpus


# ----------------------------------------------------------------------------
# 1. Corpora: built-in, downloaded, local

HF = "https://huggingface.co"  # HF_ENDPOINT overrides it (a mirror, or a local server in the tests)
DATASETS = {  # name -> its (train, valid) files, under HF
    "tinystories": ("datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
                    "datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt"),
    "owt": ("datasets/stanford-cs336/owt-sample/resolve/main/owt_train.txt.gz",
            "datasets/stanford-cs336/owt-sample/resolve/main/owt_valid.txt.gz"),
}
BUILTIN = ("python", "pydoc")  # corpora every Python carries, offline (builtin_corpus)
TEXT_SPLITS = ("train.txt", "valid.txt")  # a corpus's folder (but a downloaded one's, named as the dataset names them)
TOKEN_FILES = ("vocab.json", "merges.txt", "train.npy", "valid.npy")  # its bpe<vocab size>/ folder: tokenizer, ids
VALID_FRACTION = 0.1  # the share of a text file, or of a --data .npy, that becomes validation data
READ = 1 << 24  # bytes (or ids) per read: a corpus is split, unpacked and hashed, ids scanned, in pieces, never whole


def text_names(source):  # a corpus folder's train and valid text files: a dataset's own names (unpacked), or ours
    return [Path(f).name.removesuffix(".gz") for f in DATASETS[source]] if source in DATASETS else list(TEXT_SPLITS)


def pydoc_topics():
    """Python's reference-manual topics (the text behind `help('if')`): about 0.5 MB of English that every Python
    carries, one document each."""
    try:
        from pydoc_data.topics import topics  # stdlib: present offline on standard Pythons
    except ImportError:
        raise DataError("this Python has no pydoc_data module (some distributions strip it); "
                        "pass --data PATH.txt with any English text file instead.") from None
    return [topics[k] for k in sorted(topics)]


def stdlib_sources():
    """The standard library's top-level modules, one document each (about 5 MB of Python source, in every Python)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]


def builtin_corpus(source, out_dir):
    """--data pydoc (the topics) or python (the topics and the standard library's modules, the default: ten times
    the text, so its run sees each training token about twice, where pydoc alone is seen 24 times and memorized).
    Whole documents go to one split, every 10th to validation, so validation text is unseen."""
    docs = pydoc_topics() + (stdlib_sources() if source == "python" else [])
    texts = [EOT.join(d for i, d in enumerate(docs) if (i % 10 == 5) == valid) for valid in (False, True)]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = tuple(out_dir / name for name in TEXT_SPLITS)
    for path, text in zip(paths, texts):
        if not path.exists():  # written before: kept
            with atomic_file(path, "w") as f:
                f.write(text)
    return paths


def gunzip(src, dest):  # src.gz -> dest, whole or not at all
    with gzip.open(src, "rb") as f, atomic_file(dest) as g:
        shutil.copyfileobj(f, g, READ)


def hf_url(rel):
    """rel's address under HF_ENDPOINT (a mirror, a test's server; set but empty: as unset) or HF. UsageError if
    urllib cannot parse it (no scheme, a broken IPv6 host): a ValueError, not the network's OSError."""
    base = (os.environ.get("HF_ENDPOINT") or HF).rstrip("/")
    try:
        return urllib.request.Request(f"{base}/{rel}").full_url
    except ValueError as e:
        raise UsageError(f"HF_ENDPOINT={short_repr(base)} is not a URL to download from ({e}); set it to a mirror's "
                         f"address ({HF}, say), or unset it.") from None


def downloaded_corpus(name, out_dir):
    """The CS336 train/valid text files, fetched once into data/<name>/ (gzip is unpacked)."""
    paths = tuple(out_dir / txt_name for txt_name in text_names(name))
    # two runs started together: one downloads, the other waits, then finds the file (not both appending to a .part)
    with new_folders(out_dir), dir_lock(out_dir, waiting=f"which fills {out_dir}/ with the same data"):
        for split, rel, txt in zip(("train", "valid"), DATASETS[name], paths):
            fetched = out_dir / Path(rel).name
            newer = fetched != txt and fetched.exists() and txt.exists() \
                and fetched.stat().st_mtime_ns > txt.stat().st_mtime_ns
            if not txt.exists() or newer:  # newer: a .gz put there after the text was unpacked from the last one
                if not fetched.exists():
                    url = hf_url(rel)  # HF_ENDPOINT is read only when there is something to fetch
                    try:
                        download(url, fetched)
                    except NET_ERRORS as e:
                        raise DataError(
                            f"could not download {url} ({getattr(e, 'reason', e)}); download {fetched.name} "
                            f"yourself (the {split} split) and put it in {out_dir}/, or set HF_ENDPOINT to a "
                            "mirror.") from None
                if fetched.suffix == ".gz":
                    say(f"unpacking {fetched.name}")
                    from_cache(fetched, gunzip, fetched, txt)
    return paths


# GPT-2's own tokenizer files (OpenAI's, MIT-licensed): what the tests and bench.py check this project's BPE against
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main"
GPT2_FILES = {  # our name -> OpenAI's name and the SHA-256 of OpenAI's bytes (tiktoken checks the same two)
    "vocab.json": ("encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "merges.txt": ("vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}
COURSE_REFERENCE = Path(__file__).resolve().parent.parent / "shared" / "reference"  # the course material, if beside
CLONE_DATA = Path(__file__).resolve().parent / "data"  # the clone's data cache (train.py's --data-dir, run from here)


def gpt2_files(data_dir=CLONE_DATA):
    """(vocab.json, merges.txt) of GPT-2: the course's copies when they are beside the clone (no network needed),
    else OpenAI's files, fetched once into data_dir/gpt2/ and kept only with OpenAI's SHA-256."""
    course = tuple(COURSE_REFERENCE / f"gpt2_{name}" for name in GPT2_FILES)
    if all(p.is_file() for p in course):
        return course
    out_dir = Path(data_dir) / "gpt2"
    paths = tuple(out_dir / name for name in GPT2_FILES)
    if not all(p.is_file() for p in paths):
        from_cache(out_dir, fetch_gpt2, out_dir, paths)
    return paths


def fetch_gpt2(out_dir, paths):
    out_dir.mkdir(parents=True, exist_ok=True)
    # parallel test workers: one fetches, the others wait for it and then find the files
    with dir_lock(out_dir, waiting=f"which fills {out_dir}/ with the same data"):
        for dest, (name, sha256) in zip(paths, GPT2_FILES.values()):
            if not dest.is_file():
                fetch_checked(f"{GPT2_URL}/{name}", dest, sha256)


def fetch_checked(url, dest, sha256):
    """url -> dest (download's resume and rename), only if the bytes have this SHA-256: a captive portal's page or a
    proxy's error is deleted, not cached."""
    got = dest.with_name(dest.name + ".download")
    try:
        download(url, got)
    except NET_ERRORS as e:
        raise DataError(f"GPT-2's vocab/merges are not cached and the network is unreachable: could not download "
                        f"{url} ({getattr(e, 'reason', e)}); save it yourself as {dest}.") from None
    if (digest := file_sha256(got)) != sha256:
        got.unlink()
        raise DataError(f"{url} sent other bytes than OpenAI's file (SHA-256 {digest[:12]}..., not {sha256[:12]}...: "
                        f"a captive portal's or a proxy's page?); nothing was kept: run again on an open network, "
                        f"or save the file yourself as {dest}.")
    os.replace(got, dest)


SEP = EOT.encode()


def sep_read():  # READ's bytes rounded down to whole separators: if they are all there is, they fill each piece
    return len(SEP) * max(1, READ // len(SEP))


def has_text(text, start, end):  # do bytes [start, end) of text hold anything besides separators?
    step = sep_read()
    pieces = (text[at:min(at + step, end)] for at in range(start, end, step))
    return any(piece.count(SEP) * len(SEP) < len(piece) for piece in pieces)


SEP_RUNS = re.compile(b"(?:%s)*" % re.escape(SEP)), re.compile(b"(?:%s)*" % re.escape(SEP[::-1]))


def text_span(text):
    """(start, end): text's bytes less the runs of separators that open and close it, which hold no text (a corpus
    that ends with thousands of them left its last 10%, the validation part, nothing to learn from). Read in pieces
    of whole separators; the closing run is matched on the reversed bytes."""
    step, start, end = sep_read(), 0, len(text)
    while start < end and (run := SEP_RUNS[0].match(piece := text[start:min(start + step, end)]).end()):
        start += run
        if run < len(piece):
            break
    while end > start and (run := SEP_RUNS[1].match(piece := text[max(start, end - step):end][::-1]).end()):
        end -= run
        if run < len(piece):
            break
    return start, end


class FileText:
    """A file's bytes as local_corpus reads them, like a read-only memory map (len, slices, find, rfind, count) but
    through plain reads of a piece at a time (read_exactly): a file cut short meanwhile (rewritten in place) is one
    sentence, where a memory map's read past its new end kills the process (SIGBUS, which Python cannot catch)."""

    def __init__(self, f, path):
        self.f, self.path, self.size = f, path, os.fstat(f.fileno()).st_size

    def __len__(self):
        return self.size

    def __getitem__(self, where):  # text[i]: a byte's value; text[a:b]: bytes
        if isinstance(where, int):
            return self[where:where + 1][0]
        start, end, _ = where.indices(self.size)
        return read_exactly(self.f, start, max(0, end - start), self.path)

    def find(self, sub, start=0):  # in pieces that overlap by len(sub) - 1, so that no match is cut in two
        for at in range(start, self.size, READ):
            if (i := self[at:at + READ + len(sub) - 1].find(sub)) >= 0:
                return at + i
        return -1

    def rfind(self, sub, start, end):
        for stop in range(end, start, -READ):
            at = max(start, stop - READ - len(sub) + 1)
            if (i := self[at:stop].rfind(sub)) >= 0:
                return at + i
        return -1

    def count(self, sub, most):  # sub's occurrences without overlaps (as re.finditer finds them), up to `most`
        n, at = 0, 0
        while n < most and (at := self.find(sub, at)) >= 0:
            n, at = n + 1, at + len(sub)
        return n


def bad_utf8_offset(text, block=READ):
    """The offset of the first byte of text (bytes or a FileText) that is not UTF-8, or None; decoded a block at a
    time, a character cut by a block's end finished by the next."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for at in range(0, len(text), block):
        pending = len(decoder.getstate()[0])  # bytes of a character the last block cut
        try:
            decoder.decode(text[at:at + block], final=at + block >= len(text))
        except UnicodeDecodeError as e:
            return at - pending + e.start
    return None


def local_corpus(path, out_dir):
    """Split a text file: whole documents from the end go to validation, cut at the last separator by the last
    VALID_FRACTION of the bytes, where there are 10 documents or more and that gives validation between half and twice
    that share; else after the last line break before that point, or (none that near) at it. Read in pieces."""
    paths = tuple(out_dir / name for name in TEXT_SPLITS)
    if all(p.exists() for p in paths):  # split before: the file is not read again
        return paths
    with open(path, "rb") as f:
        key, text = file_key(path), FileText(f, path)
        size = len(text)
        if (bad := bad_utf8_offset(text)) is not None:
            if how := packed(path, text):
                raise UsageError(f"--data {how} and pass the text file it holds.")
            raise UsageError(f"--data {path} is not UTF-8 text (bad byte at offset {bad}); re-save it as UTF-8, or "
                             "pass token ids as a .npy file.")
        start, end = text_span(text)  # the shares below are of the text between them
        if start == end:  # checked before writing: a split with nothing to learn would stay cached
            raise UsageError(f"--data {path} holds only {EOT} separators and no text; pass a file with text.")
        length = end - start
        mark, gap, cut = start + int(length * (1 - VALID_FRACTION)), 0, -1  # gap: the separator between the parts
        if text.count(SEP, 9) == 9:  # 10 documents or more
            cut, gap = text.rfind(SEP, 0, mark + len(SEP)), len(SEP)  # the last separator starting by the mark
            cut = cut if cut >= 0 else text.find(SEP, start)  # none: the first document trains
        # fewer documents, or a long one at the end (validation: 96% of a book) or across the mark (0.3%: a few notes)
        if not VALID_FRACTION / 2 <= (end - cut) / length <= 2 * VALID_FRACTION:
            cut, gap = text.rfind(b"\n", 0, mark) + 1, 0
        if end - cut > 2 * VALID_FRACTION * length:  # no line break near the mark: at the first byte of its character
            cut = mark
            while cut > 0 and text[cut] & 0xC0 == 0x80:  # 10xxxxxx continues a character
                cut -= 1
            if (at := text.rfind(SEP, max(0, cut - len(SEP) + 1), cut + len(SEP) - 1)) >= 0:  # one spans the cut
                cut = at  # before it: each part had a piece of it as text
        parts = (0, cut), (cut + gap, size)
        if not all(has_text(text, *part) for part in parts):
            raise UsageError(f"--data {path} has too little text to split into training and validation parts; "
                             "pass a longer file.")
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            for dest, (start, end) in zip(paths, parts):
                with atomic_file(dest) as out:  # whole or not at all
                    for at in range(start, end, READ):
                        out.write(text[at:min(at + READ, end)])
            if file_key(path) != key:  # rewritten in place but not shorter: the splits would mix old and new text
                raise changed_while_read(path)
        except DataError:  # changed while it was read: no split of it is kept
            for p in paths:
                p.unlink(missing_ok=True)
            raise
    return paths


# ----------------------------------------------------------------------------
# 2. Tokens: a BPE tokenizer, both splits as token-id files

def damaged_cache(path, why):  # the one sentence for a file of the cache that cannot be used: what to delete
    return UsageError(f"{path} in the data cache cannot be used ({why}); delete it and run the same command again to "
                      "rebuild it.")


# the OSErrors of a cache file that is not what it should be (a directory in its place, say): deleting it is the cure
NOT_A_CACHE_FILE = (errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ELOOP)


def from_cache(path, load, *args, **kwargs):
    """load(*args, **kwargs), which reads path of the cache: a damaged or unwritable one is one sentence
    saying what to do; the system's other errors (a file-size limit, EIO) too: the path and the system's reason, where
    "delete it" would not help. A full disk passes through: train.py reports it."""
    try:
        return load(*args, **kwargs)
    except (ValueError, EOFError, OSError, MemoryError) as e:
        if disk_is_full(e):
            raise
        if isinstance(e, MemoryError):  # the text itself (one huge word), not the cache: refused with the estimate
            raise UsageError(f"--data: {e}.") from None
        if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise UsageError(f"cannot write in the data cache ({e.strerror}: {e.filename or path}); make it "
                             "writable, or pass another --data-dir.") from None
        if isinstance(e, OSError) and e.errno is not None and e.errno not in NOT_A_CACHE_FILE:  # (one without an
            raise DataError(os_error_sentence(e)) from None  # errno is gzip's BadGzipFile: damage); exit_code's words
        raise damaged_cache(path, e) from None


MADE_FROM = "made_from.txt"  # a token folder's record of the texts it was made from: file_digest's of each


def load_tokenizer(vocab_file, merges_file):
    """A tokenizer's files -> its Tokenizer, knowing <|endoftext|> and every special token its vocab holds (bpe.py
    train --special-tokens'), as bpe.py encode reads them: a text's ids are the same made either way."""
    tok = Tokenizer.from_files(str(vocab_file), str(merges_file), [EOT])
    more = special_tokens_of(tok)  # the others its check of the merges found: they are not checked a second time
    return Tokenizer(tok.vocab, tok.merges, [EOT, *more]) if more else tok


def tokenize_corpus(train_txt, valid_txt, vocab_size, out_dir, workers=None, given=None):
    """BPE trained on the train split (or the tokenizer in the folder `given`, copied), both splits as .npy ids ->
    (tokenizer, its 2 files, 2 .npy). Made again where the texts are not those they were made from (MADE_FROM): a
    dataset's file replaced by hand, or a new .gz unpacked over it."""
    paths = [out_dir / name for name in TOKEN_FILES]
    files, npys = paths[:2], paths[2:]

    def texts():  # their bytes' digests, hashed once per file: a copied or touched text is hashed, not tokenized again
        return " ".join(file_digest(Path(p), out_dir) for p in (train_txt, valid_txt))
    made_from = None
    with contextlib.suppress(OSError, UnicodeDecodeError):  # none: made before the record was kept, or not yet
        made_from = (out_dir / MADE_FROM).read_text()
    now = None if made_from is None else texts()  # hashed now only beside a record: a failed start leaves no digests
    if now != made_from:
        say(f"{train_txt.parent} holds other text than {out_dir} was made from: tokenizing it again")
        for p in paths:
            p.unlink(missing_ok=True)
    for src, dst in zip(tokenizer_files(given) if given else (), files):  # kept beside the ids it made
        if not dst.exists():
            copy_file(src, dst)
    if not all(f.exists() for f in files):  # Tokenizer.save writes each file atomically
        say(f"training a {vocab_size}-token BPE tokenizer on {train_txt}")
        t0 = time.time()
        vocab, merges = from_cache(train_txt, train_bpe, str(train_txt), vocab_size, [EOT], workers)
        from_cache(out_dir, Tokenizer(vocab, merges, [EOT]).save, str(files[0]), str(files[1]))
        say(f"  done in {time.time() - t0:.1f}s")
    tok = from_cache(out_dir, load_tokenizer, *files)
    for txt, npy in zip((train_txt, valid_txt), npys):
        if not npy.exists():
            say(f"tokenizing {txt} -> {npy}")
            from_cache(txt, encode_file, tok, str(txt), str(npy), num_workers=workers)
    if now is None or now != made_from:  # recorded once all is made
        with contextlib.suppress(OSError), atomic_file(out_dir / MADE_FROM, "w") as f:  # a read-only cache: next time
            f.write(now or texts())
    return tok, files, npys


# ----------------------------------------------------------------------------
# 3. prepare_data: --data -> token ids, read in place

def out_of_bounds(i, n):  # numpy's IndexError, in its words
    return IndexError(f"index {i} is out of bounds for axis 0 with size {n}")


PAGE = 4096  # bytes: a strided view's ids further apart are read one by one, closer ones with the span they lie in


class TokenIds:
    """Token ids in a .npy file, like np.load(path, mmap_mode="r") (len; numpy's scalar for an int, its IndexError
    out of range; a view for a slice of any step, still in the file; numpy's array for an array of ints, get_batch's
    windows, or for np.asarray) but read with plain reads when numpy asks for the values, only those it asks for: a
    file cut short while a run reads it (np.save over it, say) is one sentence, where a memory map's read past its
    new end kills the process (SIGBUS, which Python cannot catch). Booleans, None, ... and tuples are refused."""
    ndim = 1  # numpy's array's words: ids.ndim, ids.shape, ids.size, ids.nbytes (and ids.dtype)

    def __init__(self, ids, start=0, length=None, step=1):  # ids: a memmap np.load made, or a TokenIds to view
        self.filename, self.dtype = ids.filename, ids.dtype
        self.base = ids if isinstance(ids, TokenIds) else None  # a view keeps the first alive: it closes the file
        # id i of this view is id first + i * step of the file's array, whose ids start at byte `header`
        self.header = ids.offset if self.base is None else ids.header
        self.first, self.step = (start, step) if self.base is None else (ids.first + start * ids.step, ids.step * step)
        self.length = len(ids) - start if length is None else length
        self.f = open(ids.filename, "rb", buffering=0) if self.base is None else ids.f  # each read one system call
        if self.base is None:  # closed quietly (no ResourceWarning) once it and every view of it are gone
            weakref.finalize(self, self.f.close)

    def __len__(self):
        return self.length

    shape = property(lambda self: (self.length,))
    size = property(lambda self: self.length)
    nbytes = property(lambda self: self.length * self.dtype.itemsize)

    def __getitem__(self, where):
        if isinstance(where, slice):  # a view: nothing is read
            start, stop, step = where.indices(self.length)
            n = len(range(start, stop, step))
            return TokenIds(self, start if n else 0, n, step)
        out = self.read_ids(self.checked_index(where))
        return out[()] if out.ndim == 0 else out  # an int: numpy's scalar (np.uint16, say)

    def checked_index(self, where):
        """where as an array of ints in [0, len) (a negative one counts from the end, as in numpy), or numpy's
        IndexError for one out of range; IndexError for what numpy would read otherwise (a boolean mask, None, ...,
        a tuple of indices): those are not supported."""
        n = self.length
        if isinstance(where, (int, np.integer)) and not isinstance(where, bool):  # an int of any size
            where = operator.index(where)  # a Python int: numpy 2 computes np.uint8(5) % n in uint8 (OverflowError)
            if not -n <= where < n:
                raise out_of_bounds(where, n)
            return np.asarray(where % n, np.int64)
        index = np.asarray(where if not isinstance(where, tuple) else None)  # numpy reads a tuple as one index a dim
        if index.size == 0 and isinstance(where, list):  # numpy takes [] (a float array) as no index
            index = index.astype(np.intp)
        if index.dtype.kind not in "iu":
            what = short_repr(where) if index.ndim == 0 else f"an array of {index.dtype}"  # (a mask: of bool)
            raise IndexError(f"TokenIds (the ids of {self.filename}) takes an integer, a slice or an array of integers "
                             f"as its index, not {what}; np.asarray(ids) is numpy's array, for any other.")
        lo, hi = (index.min(), index.max()) if index.size else (0, 0)
        if lo < -n or hi >= n:
            raise out_of_bounds(index.ravel()[np.argmax(((index < -n) | (index >= n)).ravel())], n)  # the first
        index = index.astype(np.int64, copy=False)
        return np.where(index < 0, index + n, index) if lo < 0 else index

    def read_ids(self, index):
        """The ids at these indices (an array of any shape, each in [0, len)): one read for each run of consecutive
        ids of the file (get_batch's windows: one each), into its place."""
        at = index if self.step == 1 else index * self.step  # from self.first, in the file's ids
        out = np.empty(index.shape, self.dtype)
        flat, dest, size = at.ravel(), out.reshape(-1), self.dtype.itemsize
        if flat.size:
            cuts = (np.flatnonzero(np.diff(flat) != 1) + 1).tolist()  # where a run ends and the next begins
            begins = [0, *cuts]
            for a, b, i in zip(begins, [*cuts, flat.size], flat[begins].tolist()):
                read_into(self.f, self.header + (self.first + i) * size, dest[a:b], self.filename)
        return out

    def __array__(self, dtype=None, copy=None):
        """The view's ids, READ at a time: each read the span of the file they lie in, where they are at most a PAGE
        apart (a memory map would read those pages too), else one read for each id."""
        step, size, out = abs(self.step), self.dtype.itemsize, np.empty(self.length, self.dtype)
        per = max(1, READ // step) if step * size <= PAGE else 1  # ids per read
        for k in range(0, self.length, per):
            n = min(per, self.length - k)
            low = k if self.step > 0 else k + n - 1  # the id of these n whose byte comes first in the file
            at = self.header + (self.first + low * self.step) * size
            if self.step == 1:  # straight into place
                read_into(self.f, at, out[k:k + n], self.filename)
            else:
                span = read_into(self.f, at, np.empty((n - 1) * step + 1, self.dtype), self.filename)
                out[k:k + n] = span[::step] if self.step > 0 else span[::-step]
        return out.astype(dtype, copy=False) if dtype else out


def pieces(ids):  # the ids READ at a time, as arrays
    return (np.asarray(ids[i:i + READ]) for i in range(0, len(ids), READ))


def read_tokenizer(directory, text=False):
    """The tokenizer saved in directory (vocab.json, merges.txt), knowing <|endoftext|> (added if it lacks it), and
    its two files; (None, None) where neither is, unless text (a run of text had one). ValueError or OSError if it
    does not load, one file missing too."""
    files = tokenizer_files(directory)
    if not (text or any(f.exists() for f in files)):
        return None, None
    if not all(f.exists() for f in files):  # half a tokenizer, or a text run's none: a damaged one
        have, lack = sorted(files, key=lambda f: not f.exists())
        raise ValueError(f"{directory} has {have.name} but no {lack.name}" if have.exists() else
                         f"{directory} holds no tokenizer, though it trained on text")
    try:
        return load_tokenizer(*files), files
    except FileNotFoundError as e:  # bpe.py's: one is a directory or a FIFO, which a caller must not take for no run
        raise ValueError(str(e)) from None


def ids_tokenizer(source, tokenizer=None):
    """The tokenizer that decodes --data PATH.npy's ids (or encodes a text --data), and its files: --tokenizer DIR's
    (bpe.py train's --out), else the one beside the ids, else (None, None). UsageError if it does not load, or DIR
    holds none."""
    where = f"in --tokenizer {tokenizer}" if tokenizer else f"beside --data {source}"
    role = "decodes the samples" if is_ids(source) else "encodes the text and decodes the samples"
    try:
        tok, files = read_tokenizer(tokenizer or Path(source).parent)
    except (ValueError, OSError) as e:
        raise UsageError(f"the tokenizer {where} (which {role}) does not load: {e}; fix "
                         + ("its files, or pass another --tokenizer." if tokenizer else
                            "or remove its vocab.json and merges.txt.")) from None
    if tokenizer and tok is None:
        raise UsageError(f"--tokenizer {tokenizer} holds no vocab.json and merges.txt; pass the directory that "
                         "bpe.py train wrote them to (its --out).")
    return tok, files


def ids_vocab_size(source, tokenizer, vocab_size, sized_by=None):
    """--vocab-size for --data PATH.npy, or text with --tokenizer: unless given, the size of its tokenizer
    (ids_tokenizer), if it has one. Given (or by sized_by, naming the run whose size it is), it must equal
    --tokenizer's (UsageError); one found beside the ids is held only to what samples need (config.check_samples): a
    larger model vocabulary, say, when the run makes no samples."""
    tok = ids_tokenizer(source, tokenizer)[0] if is_ids(source) or tokenizer else None  # text: BPE trained on it
    if tok is not None and tokenizer and not is_ids(source) and max(tok.vocab) >= len(tok.vocab):  # before encoding
        raise UsageError(f"--tokenizer {tokenizer} has {len(tok.vocab)} tokens but numbers one {max(tok.vocab)}, so "
                         f"the ids it makes of --data would not fit a model of its size; number its tokens 0 to "
                         f"{len(tok.vocab) - 1}.")
    if tok is not None and tokenizer and vocab_size not in (None, len(tok.vocab)):
        if sized_by:
            raise UsageError(f"--tokenizer {tokenizer} has {len(tok.vocab)} tokens, but {sized_by}'s model "
                             f"reads {vocab_size}: its weights fit its own tokenizer; drop --tokenizer.")
        raise UsageError(f"--vocab-size {vocab_size} disagrees with the {len(tok.vocab)} tokens of --tokenizer "
                         f"{tokenizer} (with {EOT}, which train.py adds where vocab.json lacks it); drop --vocab-size "
                         "(the tokenizer's size is taken).")
    return len(tok.vocab) if tok is not None and vocab_size is None else vocab_size


def open_ids(path):
    """A .npy of token ids as TokenIds: a user's (--data, --val-data) and the cache's alike. ValueError, saying what
    the file holds instead, unless np.save wrote it from a non-empty 1-D integer array."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"PK"):  # np.load would return a zip's NpzFile
        raise ValueError("it is a zip archive (np.savez or torch.save?), not a .npy")
    if magic != b"\x93NUMPY":  # np.load would take it for a pickle, and tell to allow pickles
        raise ValueError("it is not a .npy file (no numpy header: text, a pickle, or ndarray.tofile's raw bytes?)")
    try:
        ids = np.load(path, mmap_mode="r")
    except (ValueError, EOFError) as e:
        raise ValueError(f"it cannot be read as a .npy file ({e})") from None
    if ids.ndim != 1 or ids.dtype.kind not in "ui":  # text's ids: uint16 or uint32
        raise ValueError(f"it holds {ids.dtype} of shape {ids.shape}, not the 1-D integer array of token ids")
    if len(ids) == 0:  # nothing to train on or measure; a token file of the cache is never empty: damage
        raise ValueError("it holds no token ids")
    return TokenIds(ids)


def same_ids(a, b):
    """Do two id arrays hold the same ids, in any dtype? Compared READ ids at a time: a copy is read once, and two
    different files of one length differ in their first piece, as a rule."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(pieces(a), pieces(b)))


def load_ids(source, val_data, tokenizer=None):
    """--data PATH.npy: ids as they are (validation: --val-data or the last VALID_FRACTION), plus
    their tokenizer (--tokenizer DIR, or the one saved beside them), if any, to decode the samples."""
    loaded = {"--val-data": None}
    for flag, path in (("--data", source), ("--val-data", val_data)):
        if not path:
            continue
        try:
            loaded[flag] = open_ids(path)
        except (ValueError, OSError) as e:
            raise UsageError(f"{flag} {path}: {e}; pass a non-empty 1-D array of token ids saved by np.save.") from None
    train, valid = loaded["--data"], loaded["--val-data"]
    if valid is not None and (same_file(source, val_data) or same_ids(train, valid)):  # a link or a copy: a slip
        raise UsageError(f"--val-data {val_data} holds the ids of --data {source}: validation would measure the ids "
                         "the model trains on; pass held-out ids, or drop --val-data (the last 10% of --data is held "
                         "out).")
    if valid is None:  # still views of the file: nothing is loaded
        cut = int(len(train) * (1 - VALID_FRACTION))
        train, valid = train[:cut], train[cut:]
    return train, valid, *ids_tokenizer(source, tokenizer)


def prepare_data(source, data_dir, vocab_size, val_data=None, workers=None, tokenizer=None):
    """--data -> (train ids, valid ids, tokenizer or None, its files or None). Text becomes token files under
    data_dir once, by a BPE trained on it, or by --tokenizer's (a folder; --init-from's run); ids are read in
    place (TokenIds), so no corpus is ever loaded whole."""
    if is_ids(source):
        return load_ids(source, val_data, tokenizer)
    where = cache_dir(source, data_dir)
    if source in BUILTIN:
        texts = builtin_corpus(source, where)
    elif source in DATASETS:
        texts = downloaded_corpus(source, where)
    else:
        texts = local_corpus(Path(source).resolve(), where)
    # (a failure may leave an empty cache folder: removing it could pull it from under another run filling it)
    (out := token_dir(where, vocab_size, tokenizer)).mkdir(parents=True, exist_ok=True)
    with dir_lock(out, waiting=f"which makes the same token files in {out}/"):  # two runs of one text: one BPE
        tok, files, npys = tokenize_corpus(*texts, vocab_size, out, workers, tokenizer)
    train, valid = (from_cache(npy, open_ids, npy) for npy in npys)
    return train, valid, tok, files


def cache_dir(source, data_dir):
    """The folder under data_dir that holds --data's text splits and, in bpe<vocab size>/, its tokens."""
    if source in BUILTIN:  # the topics and the library change between Python versions, patch releases too
        return Path(data_dir) / f"{source}-py{'.'.join(map(str, sys.version_info[:3]))}"
    if source in DATASETS:
        return Path(data_dir) / source
    p = Path(source).resolve()  # a changed file gets a fresh cache: the folder name hashes its path, size and time
    return Path(data_dir) / f"{p.stem}-{file_key(p)}"


def token_dir(where, vocab_size, tokenizer=None):
    """The folder of a corpus's cache (where) for its tokens: bpe<vocab size>/ for the BPE trained on it, or
    tok-<digest>/ for the tokenizer in the folder `tokenizer`, named by its files' bytes."""
    if tokenizer is None:
        return where / f"bpe{vocab_size}"
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in tokenizer_files(tokenizer))).hexdigest()
    return where / f"tok-{digest[:12]}"


def is_cached(source, data_dir, vocab_size, tokenizer=None):
    """prepare_data finds every file it would write already there, so a read-only --data-dir will do."""
    where = cache_dir(source, data_dir)
    tokens = [token_dir(where, vocab_size, tokenizer) / name for name in TOKEN_FILES]
    return all(p.is_file() for p in (*(where / name for name in text_names(source)), *tokens))


def file_key(path):
    """A file's identity without reading it: its path, inode, size, and modification and change
    times. The change time (ctime) moves on every write and no tool can set it back, so a file
    rewritten with its old size and `touch -r` to its old mtime still gets a new key."""
    st = Path(path).stat()
    key = f"{Path(path).resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return hashlib.sha1(os.fsencode(key)).hexdigest()[:8]  # fsencode: a file name need not be UTF-8


def file_digest(path, memo_dir):
    """'size:sha256' of a file's bytes, hashed once: kept in memo_dir under the file's name and
    key, so a rerun reads one line instead of hashing gigabytes again."""
    memo = memo_dir / f"{path.name}-{file_key(path)}.sha256"
    with contextlib.suppress(OSError, UnicodeDecodeError):  # none yet, or a damaged one: hashed again
        if re.fullmatch(r"\d+:[0-9a-f]{64}", kept := memo.read_text()):
            return kept
    h = hashlib.sha256()
    with open(path, "rb") as f:  # the bytes it held when opened: one cut short meanwhile is one sentence
        size = os.fstat(f.fileno()).st_size
        for at in range(0, size, READ):
            h.update(read_exactly(f, at, min(READ, size - at), path))
    digest = f"{size}:{h.hexdigest()}"
    with contextlib.suppress(OSError):  # a read-only cache: hash again next time
        memo_dir.mkdir(parents=True, exist_ok=True)
        with atomic_file(memo, "w") as f:
            f.write(digest)
    return digest


def fingerprint(train, valid, tok_files, data_dir):
    """What a run trains on, for --resume to compare: digests of the token files (a cached one's kept beside
    it, a --data .npy's in data_dir) and of the tokenizer files that decode them."""
    files = dict.fromkeys(Path(ids.filename).resolve() for ids in (train, valid))  # one .npy split in two: once
    cache = Path(data_dir).resolve()
    tokens = [file_digest(f, f.parent if cache in f.parents else cache) for f in files]
    return {"tokens": tokens, "tokenizer": [file_sha256(f) for f in tok_files or ()]}


# ----------------------------------------------------------------------------
# 4. Do the ids fit the model? And the baseline to beat

def check_ids(train, valid, context_length, vocab_size, made_by=None, init_from=None, bpe_here=None):
    """Raises UsageError unless the ids (1-D integers: open_ids) are below the vocab size and longer than a
    window; returns the largest id (the tokenizer that decodes samples must know it). made_by: for the token
    files of text (prepare_data's cache), the size of the tokenizer that made them: an id outside it is damage;
    init_from: the run whose model (of vocab_size tokens) reads the ids; bpe_here: the Tokenizer of a BPE trained
    on the text, which made them (a text of few, long words becomes few ids: a smaller --vocab-size makes more)."""
    splits = ("train", train), ("validation", valid)
    n, name = min((len(ids), name) for name, ids in splits)  # the shorter split bounds the window
    if n <= context_length:  # a window is context_length ids and the one after, the last one's target
        # the most ids any vocabulary makes of the split: one a byte (a special token's bytes count as one each too)
        ids = np.asarray(dict(splits)[name][:n]).tolist() if bpe_here else []
        most = sum(len(bpe_here.vocab.get(i, b"")) for i in ids)
        fix = (f"lower --context-length to {n - 1} or less, or " if n > 1 else "") + "use more data" + (
            f" or a smaller --vocab-size than {vocab_size:,} (shorter tokens, more of them)"
            if most > context_length else "")
        raise UsageError(f"the {name} data has {counted(n, 'token id')}, too few for a window of --context-length "
                         f"{context_length} and its next token; {fix}.")
    top = 0
    for name, ids in splits:
        ranges = [(int(piece.min()), int(piece.max())) for piece in pieces(ids)]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        if made_by is not None and (lo < 0 or hi >= made_by):
            bad = lo if lo < 0 else hi  # a negative id too: np.save over the cache, not encode_file, made it
            raise damaged_cache(ids.filename, f"it holds token id {bad}, but its tokenizer has {made_by} tokens")
        if lo < 0:
            raise UsageError(f"the {name} data ({ids.filename}) holds a negative token id ({lo}); token ids start "
                             "at 0.")
        if hi >= vocab_size:  # --vocab-size, a tokenizer's size (given or beside the ids), or --init-from's model's
            fix = (f"--init-from {init_from}'s model; pass ids its tokenizer made (bpe.py encode FILE --tokenizer "
                   f"{shlex.quote(init_from)} --out IDS.npy, where it has one)" if init_from else f"the vocabulary; use "
                   f"the tokenizer that made the ids, or with none beside them a --vocab-size above {hi}")
            raise UsageError(f"the {name} data ({ids.filename}) holds token id {hi}, at or above the {vocab_size} "
                             f"tokens of {fix}.")
        top = max(top, hi)
    return top


def check_data(cfg, train, valid, tok):
    """check_ids for a run's flags (cfg) and prepare_data's result: text's token ids are those its tokenizer made."""
    made_by = None if is_ids(cfg["data"]) else len(tok.vocab)
    return check_ids(train, valid, cfg["context_length"], cfg["vocab_size"], made_by, cfg["init_from"],
                     bpe_here=tok if made_by is not None and cfg["tokenizer"] is None else None)  # not --tokenizer's


def unigram_loss(train, valid, vocab_size, limit=100_000_000):
    """The baseline a model must beat: cross-entropy (nats/token) of the validation ids under
    the train ids' unigram distribution, add-one smoothed, from the first `limit` train ids.
        L = -sum_v q(v) log p(v),  p(v) = (count_train(v) + 1) / (N + V),  q = valid frequencies"""
    counts, q = (sum(np.bincount(piece, minlength=vocab_size) for piece in pieces(ids))
                 for ids in (train[:limit], valid))  # both non-empty (check_ids), so each sum is an array
    p = (counts + 1) / (counts.sum() + vocab_size)
    return float(-(q * np.log(p)).sum() / q.sum())
