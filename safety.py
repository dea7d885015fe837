"""
Run safety: what keeps a user's files whole and turns each mistake or fault into one sentence. Optional
reading: train.py calls it once at each boundary, and every file but metrics.jsonl (appended) and a download
(a .part) writes through atomic_file. It imports only the standard library at its top (bpe.py must not load
torch); what asks torch imports it there (_torch).

1. A command line's errors and exit codes, and the atomic write
2. The flags: CHECKS, one row per mistake, checked before anything is read or written
3. The run directory: one writer (a lock), an old run replaced only on --overwrite, the files beside ckpt.pt
4. A run's torch and C-library settings; --resume: the checkpoint must fit the model, config and data (its RNG
   states make it exact); --sample reads it
5. The loop's faults (Ctrl-C, SIGTERM or SIGHUP at a step boundary, a NaN, a full disk); torchrun's group
"""
import argparse
import collections
import contextlib
import ctypes
import datetime
import errno
import functools
import hashlib
import importlib.util
import io
import json
import math
import os
import re
import reprlib
import select
import signal
import stat
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path


def _torch():  # imported here, not at the top: bpe.py imports this file and must not load torch
    import torch
    return torch


TORCHRUN_VARS = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0}  # torchrun sets them (with MASTER_ADDR, MASTER_PORT)


def env_int(name):  # a torchrun variable as a whole number, its default when unset, None when it is not one
    text = os.environ.get(name, str(TORCHRUN_VARS[name])).strip()  # at most 18 digits: int() refuses 4,300 and more
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


RANK = env_int("RANK") or 0  # this process's rank under torchrun (0 alone)
RANK = RANK if RANK < (env_int("WORLD_SIZE") or 1) else 0  # a RANK out of range is refused (CHECKS): rank 0 says so


def bad_environment():
    """Why torchrun's variables in the environment cannot be used, as a sentence, or "": set by hand
    (WORLD_SIZE=2 alone would wait forever for its peers) or not whole numbers."""
    bad = next((f"{k}={short_repr(os.environ[k])} is not a number 0, 1, 2, ..." for k in TORCHRUN_VARS
                if env_int(k) is None), "")
    if not bad and env_int("WORLD_SIZE") == 0:
        bad = "WORLD_SIZE=0 asks for no processes"
    elif not bad and env_int("WORLD_SIZE") > 1 and not all(os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")):
        bad = f"WORLD_SIZE={env_int('WORLD_SIZE')} is set but MASTER_ADDR and MASTER_PORT are not"
    elif not bad and env_int("RANK") >= env_int("WORLD_SIZE"):
        bad = f"RANK={env_int('RANK')} is not below WORLD_SIZE={env_int('WORLD_SIZE')}"
    return bad and f"the environment's {bad}; launch with torchrun, or unset {', '.join(TORCHRUN_VARS)}."


def usable_cores():  # the cores this process may run on (taskset's, a Slurm job's share), not all the machine's
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


SIGHUP = getattr(signal, "SIGHUP", None)  # a closed terminal or ssh session (none on Windows)
STOPS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, SIGHUP) if s)  # Ctrl-C, kill's or a scheduler's stop, SIGHUP


def on_stops(handler):
    """handler for each of STOPS; returns {signal: the handler it replaced}. A SIGHUP that nohup set to be ignored
    stays ignored: the user asked the run to outlive its terminal."""
    return {s: signal.signal(s, handler) for s in STOPS if s != SIGHUP or signal.getsignal(s) != signal.SIG_IGN}


_hung_up = []  # hang_up() was called


def hang_up():
    """The terminal is gone (a SIGHUP came, or a print failed with EIO), and the programs of its session may go with
    it: stdout and stderr, where they are that terminal or a pipe whose reader left, go to /dev/null from here on
    (say() does it for a reader that leaves later), so that a stopping run still saves its checkpoint and ends with
    its own exit code, not a print's error. A log file, or a pipe still read, keeps its lines."""
    _hung_up.append(True)
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0)):  # a hung-up tty, no reader
            os.dup2(null, fd)  # what Python still holds to print is flushed there as it exits
    os.close(null)


def say(*args, sep=" ", end="\n", file=None):  # print, at once; a terminal that is gone (EIO) is not an error
    try:  # one write: print writes the text and its end apart, and a Ctrl-C between them joined the next line to it
        (file := file or sys.stdout).write(sep.join(map(str, args)) + end)
        file.flush()
    except OSError as e:
        if e.errno != errno.EIO and not (e.errno == errno.EPIPE and _hung_up):  # EPIPE alone: the reader left
            raise  # (`| head`), which exit_code ends quietly
        hang_up()  # EIO: a SIGHUP follows (or never comes: a job the shell let go on), and is handled there


def log(*args, **kwargs):  # only rank 0 talks, so that torchrun's N processes print one story
    if RANK == 0:
        say(*args, **kwargs)


def fmt_time(s):  # seconds -> "12m05s", "3h07m"; None (not known yet) -> "-"
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def fmt_count(x):  # 3 significant digits and a unit: 950, 12.3k, 172k, 1.72M (a progress line has 80 columns)
    scale, unit = next((s, u) for s, u in ((1, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"))
                       if float(f"{x / s:.3g}") < 1000 or u == "G")  # 999.6 rounds to 1000: that is 1k
    return f"{x / scale:.3g}{unit}"


COLUMNS = 79  # a progress line fits an 80-column terminal (a character in the last column wraps on some)
ETA_INTERVALS = 5  # the logging intervals whose median seconds per step is the ETA's speed


class Eta:
    """The time a run has left: the median seconds per step of the last ETA_INTERVALS logging intervals (recent, as
    a shared machine's speed changes, and a slow interval, a checkpoint's save or another program's burst, moves it
    little) times the steps left, plus the evaluations left at the last one's seconds. The first `untimed` steps of
    a process and its first evaluation are not timed (torch.compile's would say hours)."""

    def __init__(self, untimed):
        self.untimed, self.steps, self.interval, self.rates = untimed, 0, [0.0, 0], []
        self.evals, self.eval_seconds = 0, 0.0

    def stepped(self, seconds):  # one step took `seconds`
        self.steps += 1
        if self.steps > self.untimed:
            self.interval = [self.interval[0] + seconds, self.interval[1] + 1]

    def evaluated(self, seconds):  # one evaluation took `seconds`
        self.evals += 1
        self.eval_seconds = seconds if self.evals > 1 else 0.0

    def seconds_left(self, step, last, eval_interval):
        """At log step `step` of `last`, which ends the interval: the ETA, or None before any time. The loop evaluates
        before each step that is a multiple of eval_interval, and once more at the end."""
        if self.interval[1]:
            self.rates = [*self.rates[1 - ETA_INTERVALS:], self.interval[0] / self.interval[1]]
            self.interval = [0.0, 0]
        evals_left = (last - 1) // eval_interval - (step - 1) // eval_interval + 1
        return statistics.median(self.rates) * (last - step) + evals_left * self.eval_seconds if self.rates else None


LONG_CPU_RUN = 3 * 3600  # seconds: a CPU run that needs longer is told so, once (tinystories' is days on a CPU)


def note_long_run(cfg, seconds_left, tty):
    """At the first ETA (seconds_left, None before it): a CPU run that would need more than LONG_CPU_RUN is told so
    in one line, with what trains in minutes on a CPU. Returns True once the ETA is known (asked no more)."""
    if seconds_left is not None and seconds_left > LONG_CPU_RUN and cfg["device"].startswith("cpu"):
        log(("\n" if tty else "") + f"note: at this speed the run needs about {fmt_time(seconds_left)} more on the "
            f"CPU ({cfg['max_iters']:,} steps of {cfg['batch_size'] * cfg['context_length']:,} tokens), a job for a "
            "GPU. On a CPU, `python train.py` (the built-in corpus) trains in minutes, or pass a smaller --max-iters; "
            "Ctrl-C stops this run with a checkpoint.")
    return seconds_left is not None


PROGRESS_EVERY = 10.0  # seconds between progress lines when stderr is a log file, not a terminal


def show_progress(text, shown, last=False):
    """Progress on stderr: a terminal redraws one line in place (end_progress ends it), a log file gets the first
    line, one each PROGRESS_EVERY seconds after `shown` (None: never shown) and the last. Returns when shown."""
    now, tty = time.monotonic(), sys.stderr.isatty()
    if tty or last or shown is None or now - shown >= PROGRESS_EVERY:
        say("\r" + text if tty else text, end="" if tty else "\n", file=sys.stderr)
        shown = now
    return shown


def end_progress():  # a terminal's progress line ends before what is printed next (an error, say)
    if sys.stderr.isatty():
        say(file=sys.stderr)


# ----------------------------------------------------------------------------
# 1. A command line's errors and exit codes, and the atomic write

class UsageError(Exception):  # a mistake in the flags or the inputs: the command prints it and exits with 2
    pass


class DataError(Exception):  # the run failed, not its flags (offline, disk full, a NaN, a killed worker): exit 1
    pass


def not_a_file(path):  # "a directory", "a FIFO", "a socket", "a device" (/dev/null), "a symlink loop"; "" for a file
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symlink loop" if e.errno == errno.ELOOP else ""
    kinds = [(stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")]
    return next((name for is_kind, name in kinds if is_kind(mode)), "a device")


TMP_MARK = ".cs336tmp"  # temporaries are ".NAME.cs336tmpPID" (temporary_path): a pattern no one else uses, so that
# clearing what a killed writer left deletes only files this project named


def temporary(name, of=None):  # is this file name one of the project's temporaries (of the file named `of`)?
    stem, mark, pid = name.rpartition(TMP_MARK)
    return name.startswith(".") and bool(mark) and pid.isdigit() and of in (None, stem[1:])


def writer_gone(name):
    """Has the process that named the temporary `name` ended, so that it will never finish it? os.kill(pid, 0) asks
    the kernel whether that PID exists: a live writer's always does, so its temporary is never deleted; a PID that
    another process took since only keeps a dead writer's temporary until that one ends too (the safe side, and no
    clock or start time to compare). PIDs are this machine's: two machines writing one file of a shared disk at the
    same moment are not provided for."""
    if os.name != "posix":  # on Windows os.kill(pid, 0) would send a Ctrl-C (0 is CTRL_C_EVENT there)
        return False
    try:
        os.kill(int(name.rpartition(TMP_MARK)[2]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: another user's live process; a number no PID can be
        pass
    return False


def clear_temporaries(directory, of=None):
    """Delete the temporaries in directory (of the file named `of`, or all) that a writer killed mid-write (SIGKILL,
    a power cut) left: those whose writer is gone."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for e in [e for e in entries if temporary(e.name, of) and e.is_file(follow_symlinks=False)]:
            if writer_gone(e.name):
                with contextlib.suppress(OSError):  # another run cleared it first
                    os.remove(e.path)


def temporary_path(path):
    """The hidden name path is written under until it is whole, ".NAME.cs336tmpPID" beside it; what a killed
    writer of path left there is cleared first, so a rerun leaves no temporary behind (a token file's is as big)."""
    directory, name = os.path.split(path)
    clear_temporaries(directory, name)
    return os.path.join(directory, f".{name}{TMP_MARK}{os.getpid()}")


def replace_target(path):
    """(the file a write to path replaces, its temporary beside it): a symlink is written through (its
    target is replaced, the link stays). A path that is not a regular file is refused: renaming over
    /dev/null would replace the device itself."""
    path = os.path.realpath(path)
    if kind := not_a_file(path):
        raise ValueError(f"{path} is {kind}, not a regular file: give the path of a file to write")
    return path, temporary_path(path)


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """Write a whole file or nothing: a temporary file replaces path (replace_target's) by a rename only
    if the block ends cleanly. A file object already open (a buffer, stdout) is written as it is."""
    if not isinstance(path, (str, os.PathLike)):
        yield path
        return
    path, tmp = replace_target(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" file
        os.replace(tmp, path)
    except OSError as e:          # a full disk fails f.write, which names no file: name path
        if e.errno is not None and e.filename in (None, tmp):  # not an OSError with no errno (gzip's BadGzipFile)
            e.filename = path
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_files(paths):
    """Several files whole, and none replaced before all are written: yields a temporary path for each
    (replace_target's) for any writer to fill, atomic_file included; only if the block ends cleanly are
    they renamed onto their files, in order, else removed. Only a stop between two renames mixes old and new."""
    real, tmps = zip(*map(replace_target, paths))  # every path refused or accepted before a byte is written
    if twice := next((p for p, r in zip(paths, real) if real.count(r) > 1), None):  # the last write would win
        raise ValueError(f"{twice} and another of the files to write are one file (a symlink); make them separate")
    try:
        yield list(tmps)
        for tmp, path in zip(tmps, real):
            os.replace(tmp, path)
    except OSError as e:  # a full disk names the temporary a writer filled: name its file
        if e.filename in tmps:
            e.filename = real[tmps.index(e.filename)]
        raise
    finally:
        for tmp in filter(os.path.exists, tmps):
            os.remove(tmp)


def changed_while_read(path):  # the one sentence for a file that another program rewrote while this one read it
    return DataError(f"{path} changed while it was read; let whatever writes it finish, then run the same command "
                     "again.")


def read_into(f, at, buf, path):
    """Fill buf (a bytearray, a numpy array) from byte at of the open file f (path), or changed_while_read if it
    holds fewer bytes now. The reader of a file that another program may cut short (the user's text or ids) reads
    it so, not through a memory map: there a read past the new end kills the process (SIGBUS, which Python cannot
    catch); here it comes back short. Returns buf."""
    f.seek(at)
    if f.readinto(buf) < memoryview(buf).nbytes:
        raise changed_while_read(path)
    return buf


def read_exactly(f, at, n, path):  # n bytes from byte at, as read_into reads them
    return read_into(f, at, bytearray(n), path)


def numba_cache_fallback(source_dir):
    """Before numba loads: where it can keep compiled code neither beside the source (a read-only checkout) nor in
    the user's cache (no writable home), a temporary directory instead; numba would refuse to load the file."""
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "numba"
    if not os.environ.get("NUMBA_CACHE_DIR") and not any(map(writable, (Path(source_dir) / "__pycache__", user_cache))):
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"numba-cache-{os.getuid()}")


def quiet_while_starting(name):
    """A Ctrl-C, a SIGTERM (kill, a scheduler's stop) or a SIGHUP (the terminal closed) while torch loads: one line,
    not an import's traceback."""
    def stop(signum, frame):
        if signum == SIGHUP:
            hang_up()
        say(f"{name}: interrupted while starting; nothing was written.", file=sys.stderr)
        os._exit(130)
    on_stops(stop)


def escaping_stdout():
    """A character the terminal cannot show (latin-1, ascii) printed as an escape, not an error. A stdout closed at
    the start (`>&-`, a daemon's) is /dev/null: Python leaves sys.stdout None there, and the first print raised."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")
    sys.stdout.reconfigure(errors="backslashreplace")


def end_quietly_on_closed_pipe():
    """For a script that only prints: `python accounting.py | head` ends it as it ends cat, when the reader leaves,
    not with a BrokenPipeError traceback (train.py, which writes files, catches that error instead)."""
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def reader_left():  # the reader of stdout left (`| head`): exit code 1, quietly (no traceback, as `cat` ends)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout as it exits
    return 1


def disk_is_full(e):  # is e the error of a full disk, or of a user's exhausted quota?
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_words(e):  # a full disk's OSError for a sentence: a file's write names it (atomic_file), stdout's none
    return f"the disk is full: could not write {e.filename or 'stdout'}; free some space and rerun"


def os_error_words(e):  # an OSError no check foresaw, for a sentence: the path and the system's reason
    return (f"{e.filename}: {e.strerror}; fix that path or pick another" if e.filename else
            f"the system said: {e}; fix that")


def error_line(e):  # an exception in one line: a compiler's error is pages long, its first line saying "error" counts
    text = str(e).partition("You can suppress this exception")[0]  # torch's advice (suppress_errors) is no error
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().endswith(" raised:")]
    lines = lines or [type(e).__name__]  # torch 2.5's "backend='inductor' raised:" heads the line that says why
    return f"{type(e).__name__}: {next((line for line in lines if 'error' in line.lower()), lines[0])[:200]}"


def out_of_memory(e):
    """What an allocation that failed asked for, for a sentence, or None when e is no such failure: a MemoryError,
    or torch's RuntimeError from a CPU ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 40000
    bytes") or a GPU ("CUDA out of memory. Tried to allocate 2.00 GiB")."""
    text = str(e)
    if not (isinstance(e, MemoryError) or isinstance(e, RuntimeError) and re.search(
            r"out of memory|can't allocate memory", text)):
        return None
    size = re.search(r"[Tt]ried to allocate (?:(\d+) bytes|([\d.]+ [KMGT]iB))", text)
    return ("" if size is None else f" (an allocation of {int(size[1]) / 2**30:,.2f} GiB)" if size[1] else
            f" (an allocation of {size[2]})")


LESS_MEMORY = {  # a command's ways to ask for less memory, for out_of_memory's sentence
    "train.py": "ask for less: a smaller --batch-size or model, or the same batch in more --grad-accum steps or with "
                "--activation-checkpointing (a run with a ckpt.pt goes on with those two and --resume).",
}


def exit_code(name, command, interrupted):
    """command()'s exit code; a fault is one sentence: 2 a usage mistake, 1 a machine's fault (memory running out
    too) or an unforeseen OSError, 130 a Ctrl-C."""
    try:
        code = command()
        if sys.stdout:  # what print left in its buffer fails here on a full disk, not as Python exits ("ignored")
            sys.stdout.flush()
        return code
    except (UsageError, DataError) as e:
        log(f"{name}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except BrokenPipeError:
        return reader_left()
    except OSError as e:  # a full disk (stdout's too), or what no check foresaw (a directory under /proc): exit 1
        why = f"{disk_full_words(e)}." if disk_is_full(e) else f"{os_error_words(e)}, then run the same command again."
        log(f"{name}: error: {why}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Exception) as e:
        # a Ctrl-C before the loop's own handler (data, model), a second one in it, or the error a library's clean-up
        # raised in its place (torch.save's zip writer, cut short mid-file, says "unexpected pos")
        if interrupted_by_ctrl_c(e):
            log(f"{name}: interrupted; {interrupted}", file=sys.stderr)
            return 130
        if (asked := out_of_memory(e)) is None:
            raise
        less = LESS_MEMORY.get(name, f"ask for less (a smaller input, batch or model); {interrupted}")
        log(f"{name}: error: out of memory{asked}; {less}", file=sys.stderr)
        return 1


def interrupted_by_ctrl_c(e):  # a KeyboardInterrupt, or an exception raised while one was being handled
    while e is not None and not isinstance(e, KeyboardInterrupt):
        e = e.__context__
    return e is not None


_SHORT = reprlib.Repr()  # a value read from a file, for a sentence: long strings, long lists, deep nesting cut short
_SHORT.maxstring = _SHORT.maxother = 80
short_repr = _SHORT.repr


def load_json(text, where, key="key"):
    """json.loads(text), or ValueError naming where: malformed JSON, JSON nested deeper than Python's recursion limit
    (json.loads raises RecursionError), or an object with a key written twice: json.loads would keep its last value
    only, so vocab.json would lose a token's other id without a word. key: what a key is there ("token")."""
    def once_each(pairs):
        obj = dict(pairs)
        if len(obj) < len(pairs):
            twice = next(k for k, n in collections.Counter(k for k, _ in pairs).items() if n > 1)
            raise ValueError(f"{where}: the {key} {short_repr(twice)} is written twice (JSON would keep its last value "
                             "only)")
        return obj
    try:
        return json.loads(text, object_pairs_hook=once_each)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} line {e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: its JSON is nested too deeply to read") from None


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's complaints end like ours: one sentence, exit code 2
        raise UsageError(f"{message} (see python {self.prog} --help)")


PRESET = "preset"  # a flag's default that depends on --data: train.py's PRESETS fill it in


def flags_parser(prog, description, flags, presets):
    """A table of (flag, type, default, help) rows and section titles -> its Parser. bool: a switch (one that is on
    by default also gets --no-...); default PRESET: None, filled in later, and --help lists each preset's value."""
    p = group = Parser(prog=prog, description=description)
    for row in flags:
        if isinstance(row, str):  # a section title
            group = p.add_argument_group(row)
        elif row[1] is bool:  # --fast is on by default, so it also gets a --no-fast
            group.add_argument(row[0], action=argparse.BooleanOptionalAction if row[2] else "store_true",
                               default=row[2], help=row[3])
        else:
            name, kind, default, text = row
            shown = "" if default in (None, "") else f" (default: {default})"
            if default is PRESET:  # e.g. "(default: small 2048; tinystories 10000; owt 32000)"
                key = name[2:].replace("-", "_")
                shown = f" (default: {'; '.join(f'{n} {v[key]}' for n, v in presets.items() if v[key] is not None)})"
            group.add_argument(name, type=kind, default=None if default is PRESET else default, help=text + shown)
    return p


# ----------------------------------------------------------------------------
# 2. The flags: CHECKS, one row per mistake, checked before anything is read or written

RUN_FILES = ("ckpt.pt", "metrics.jsonl", "config.json", "samples.txt", "vocab.json", "merges.txt", "loss.png")
RUN_MARKERS = RUN_FILES[:3]  # a directory holding one of these holds a run
MIN_TEXT_VOCAB = 256 + 1  # BPE on text: every byte, and the end-of-text token
FLOAT32_TINY = 2.0 ** -126  # float32's smallest normal number: AdamW's eps is added in float32, where less can be 0
FLOAT32_MAX = (2 - 2.0 ** -23) * 2.0 ** 127  # float32's largest number: AdamW's numbers are float32, where more is inf
NUMBER_RULES = [  # (must ..., is_wrong(value), applies(flag key, value)); torch takes 64-bit integers (a seed also
    # unsigned, and seed + 1 seeds evaluation); NaN passes every comparison, so finiteness comes first
    ("be a finite number", lambda v: not math.isfinite(v), lambda k, v: type(v) is float),
    (f"not be a subnormal number (0 < |x| < {sys.float_info.min:.3g}: a CPU run flushes it to 0)",
     lambda v: 0 < abs(v) < sys.float_info.min, lambda k, v: type(v) is float),
    ("lie in [-2**63, 2**64 - 1)", lambda v: not -2**63 <= v < 2**64 - 1, lambda k, v: k == "seed"),
    ("be below 2**63", lambda v: v >= 2**63, lambda k, v: type(v) is int and k != "seed"),
    ("be positive", lambda v: v <= 0, lambda k, v: k in (
        "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "batch_size",
        "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval",
        "benchmark_steps", "workers", "sample_tokens", "eps")),  # eps: what optim.py's optimizers refuse (eps <= 0)
    ("not be negative", lambda v: v < 0, lambda k, v: k in (
        "lr", "min_lr", "warmup_iters", "weight_decay", "grad_clip", "temperature", "num_samples")),
    (f"be at least {FLOAT32_TINY:.3g}, float32's smallest normal number (AdamW adds eps in float32, where a smaller "
     "one can be 0 and a zero gradient's update 0/0)", lambda v: v < FLOAT32_TINY, lambda k, v: k == "eps"),
    ("lie in [0, 1)", lambda v: not 0 <= v < 1, lambda k, v: k in ("beta1", "beta2")),
    ("lie in (0, 1]", lambda v: not 0 < v <= 1, lambda k, v: k == "top_p"),
    # AdamW's numbers; float32 makes a larger --temperature or --grad-clip inf, the formula's limit (uniform sampling,
    # no clipping), and RoPE's tables are made in float64
    (f"be at most {FLOAT32_MAX:.3g}, float32's largest number (AdamW computes in float32, where a larger one is inf)",
     lambda v: v > FLOAT32_MAX, lambda k, v: k in ("lr", "min_lr", "eps", "weight_decay")),
]


def bad_number(c):  # the first numeric flag that breaks its NUMBER_RULES row, as a sentence, or ""; unset (None) passes
    return next((f"--{k.replace('_', '-')} must {words}, got {v}." for words, wrong, applies in NUMBER_RULES
                 for k, v in c.items() if v is not None and applies(k, v) and wrong(v)), "")


def adamw_overflow(c):
    """Why AdamW's float32 numbers could overflow with these flags (numpy warned, then the loss was NaN), or "": its
    step size a_t = lr sqrt(1 - beta2^t) / (1 - beta1^t) is at most lr / (1 - beta1), its decay 1 - lr weight_decay."""
    step, decay = c["lr"] / (1 - c["beta1"]), c["lr"] * c["weight_decay"]
    if step > FLOAT32_MAX:
        return (f"--lr {c['lr']} is too large: AdamW's bias correction scales its step size by up to 1 / (1 - "
                f"--beta1), to {step:.3g}, above float32's largest number {FLOAT32_MAX:.3g}, where the run computes; "
                "lower --lr.")
    if decay > FLOAT32_MAX:
        return (f"--lr {c['lr']} x --weight-decay {c['weight_decay']} = {decay:.3g}, AdamW's decay, is above float32's "
                f"largest number {FLOAT32_MAX:.3g}, where the run computes; lower one of them.")
    return ""


def writable(path):
    """Can the directory be created, or written if it exists? Not where a symlink (a loop, a dangling one) is in its
    place, nor under a directory this user may not look into (another user's home: stat says permission denied).
    "" names no directory (Path("") would read it as ".", and os.makedirs("") fails)."""
    if os.fspath(path) == "":
        return False
    try:
        path = next(p for p in (Path(path), *Path(path).parents) if p.exists() or p.is_symlink())
    except PermissionError:
        return False
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def same_file(a, b):  # do paths a and b name one existing file, by any spelling (a link, "../x")?
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def unreadable(path):  # why --data/--val-data cannot be read, or "" if it can
    if kind := not_a_file(path):  # a FIFO or /dev/zero would be read forever
        return f" is {kind}, not a file"
    if not os.path.isfile(path):
        return ": no such file"
    return "" if os.access(path, os.R_OK) else " is not readable (permission denied)"


def run_dir(c):
    return Path(c["out_dir"]) / c["run_name"]


def run_data(d):  # the --data that made the run in directory d, as its config.json says, or None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return json.loads((d / "config.json").read_text(encoding="utf-8")).get("data")


def run_dir_problem(c):
    """Why the run directory cannot take this run, as a sentence, or "". --benchmark, --export and --sample
    write none. A directory with files but no run (none of RUN_MARKERS) may hold the user's files."""
    if c["benchmark"] or c["export"] is not None or c["sample"]:
        return ""
    d = run_dir(c)
    has_run = any((d / f).exists() for f in RUN_MARKERS)
    in_the_way = next((f"{d / name} is {not_a_file(d / name)}" for name in RUN_FILES if not_a_file(d / name)), "")
    if not writable(d):
        return (f"--out-dir {c['out_dir']}: cannot write {c['out_dir']}/{c['run_name']}; pick a writable --out-dir "
                "or another --run-name.")
    if in_the_way:
        return f"{in_the_way} where the run writes a file; move it away or pick another --run-name."
    if has_run and (pid := lock_holder(d)) not in (None, os.getpid()):  # another process writes it now: say so
        return in_use(d, pid)
    if has_run and not (c["resume"] or c["overwrite"]):
        old = run_data(d)
        other = old is not None and old != c["data"]  # another file of the same name: x.txt and x.py both go to out/x
        return (f"{d} already holds a run{f' of --data {old}' if other else ''}; pass --resume to continue it, "
                "--overwrite to replace it, or another --run-name"
                + (f" (--run-name {Path(c['data']).name.replace('.', '_')}, say)" if other else "") + ".")
    if d.is_dir() and not has_run and any(not temporary(f) for f in os.listdir(d)):
        return (f"{c['out_dir']}/{c['run_name']} holds files but no run (no ckpt.pt, metrics.jsonl or config.json), so "
                "it is not a run directory and nothing in it is replaced; pick another --run-name.")
    return ""


NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits in bytes: one name in a path, a whole path
NAME_ROOM = 33  # what the project adds to a name it derives: data.py's "-<key>.sha256", atomic_file's ".cs336tmp<pid>"


def too_long(c):
    """The first path flag the file system would refuse (ENAMETOOLONG) once the project adds its
    suffixes, as a sentence, or "": a name over NAME_MAX - NAME_ROOM bytes, or a path near PATH_MAX."""
    for flag in ("data", "val_data", "data_dir", "out_dir", "run_name"):
        if not c[flag] or (flag == "data" and not c["data_is_file"]):  # --data pydoc, tinystories, owt: no path
            continue
        longest = max((len(os.fsencode(part)) for part in Path(c[flag]).parts), default=0)
        if longest > NAME_MAX - NAME_ROOM or len(os.fsencode(os.path.abspath(c[flag]))) > PATH_MAX - 2 * NAME_MAX:
            return (f"--{flag.replace('_', '-')} is too long for the file system (with what the run adds: names of at "
                    f"most {NAME_MAX - NAME_ROOM} bytes, paths of at most {PATH_MAX - 2 * NAME_MAX}); pass a shorter "
                    "one.")
    return ""


def run_device(device):
    """--device as the run names it: None is cuda when there is one, else cpu; "cpu:N" is "cpu", as torch treats it
    (its tensors are on "cpu"), so that a CPU run's settings (torch_settings) apply to it too."""
    torch = _torch()
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    with contextlib.suppress(RuntimeError):  # one that does not parse is device_error's to refuse
        return "cpu" if torch.device(device).type == "cpu" else device
    return device


def device_error(device):  # why torch cannot use --device, or "": "cpu:abc" does not parse, "cuda:3" of 2 GPUs
    torch = _torch()
    try:
        d = torch.device(device)
    except RuntimeError:
        d = torch.device("meta")  # not one of ours either
    if d.type not in ("cpu", "cuda", "mps"):
        return "unknown device; use cpu, cuda, cuda:N or mps."
    if d.type == "cuda" and not torch.cuda.is_available():
        return "this PyTorch sees no CUDA GPU; use --device cpu."
    if d.type == "cuda" and (d.index or 0) >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}."
    if d.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available here; use --device cpu."
    return ""


@functools.cache
def compile_error(device):
    """Why torch.compile (inductor, as --compile runs it) cannot compile on device, in one line, or "": a trivial
    function, once per process, before anything is written (no C++ compiler for a CPU, nor for Triton's launcher)."""
    torch = _torch()
    on_it = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()
    try:
        with on_it:  # that GPU only: a torchrun process touches no other one (cuda:0 would get a context from each)
            torch.compile(lambda x: x + 1)(torch.ones(2, device=device))
    except Exception as e:  # compilers fail in many ways, all meaning "not on this machine"
        return error_line(e)
    return ""


def resume_command(cfg, without=()):
    """The advice that goes on from a run's checkpoint, as words: plus --resume, and without --overwrite (it would
    start over, and --resume refuses it) and the flags in `without`."""
    drop = [*without, *(["--overwrite"] if cfg["overwrite"] else [])]
    return "the same command" + (f" without {' and '.join(drop)}," if drop else "") + " plus --resume"


@contextlib.contextmanager
def compile_failures(cfg):
    """A torch.compile failure compile_error did not foresee (one of the model's kernels, a GPU's own compiler) ends
    in one sentence, exit code 1: a run's checkpoint, saved before the model first runs, stays whole to go on from."""
    try:
        yield
    except Exception as e:
        if not isinstance(e, _torch()._dynamo.exc.TorchDynamoException):
            raise
        then = ("drop --compile" if cfg["benchmark"] or cfg["sample"] else  # --sample: nothing to resume
                f"the checkpoint {run_dir(cfg) / 'ckpt.pt'} is whole: go on from it with "
                f"{resume_command(cfg, ['--compile'])}")
        raise DataError(f"torch.compile failed ({error_line(e)}); {then}.") from None


def training_bytes(c):
    """The least memory one process's training step takes (accounting.py's formulas): AdamW's bytes per
    parameter, one micro-batch's logits and what autograd keeps of its forward (the fused attention and
    activation checkpointing keep less: for them only what every path keeps counts; bf16 halves it)."""
    import accounting  # here, not at the top: it loads torch and model.py, and bpe.py imports this file
    dims = c["vocab_size"], c["d_model"], c["num_layers"], c["d_ff"]
    params = sum(accounting.lm_param_counts(*dims, silu_ffn=c["silu_ffn"], no_norm=c["no_norm"],
                                            tie_embeddings=c["tie_embeddings"]).values())
    per_param = accounting.ADAMW_BYTES_PER_PARAM["fp32 everywhere (naive)" if c["dtype"] == "float32" else
                                                 "autocast (fp32 weights, bf16 matmuls)"]
    B, T, half = c["batch_size"] // (c["world_size"] * c["grad_accum"]), c["context_length"], c["dtype"] == "bf16"
    layers = 0 if c["fast"] or c["activation_checkpointing"] else c["num_layers"]
    saved = accounting.saved_activation_bytes(B, T, c["d_model"], c["num_heads"], c["d_ff"], layers)
    logits = B * T * c["vocab_size"] * (accounting.BF16_BYTES if half else accounting.FP32_BYTES)
    return sum(per_param.values()) * params + logits + saved // (2 if half else 1)


def memory_bytes(device, world_size):
    """(bytes one process may use, what they are): a GPU's own memory (its properties: mem_get_info would open
    a CUDA context on cuda:0 in every torchrun process), or the RAM (or cgroup limit) a CPU run's processes share."""
    if device.startswith("cuda"):
        gpu = _torch().cuda.get_device_properties(_torch().device(device).index or 0)
        return gpu.total_memory, f"the {gpu.name}'s memory"
    ram, limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), cgroup_memory_limit()
    what = "this machine's memory" if limit is None or limit >= ram else "the memory limit of this job's cgroup"
    return min(ram, limit or ram) // world_size, what + (f" / {world_size} processes" if world_size > 1 else "")


def cgroup_memory_limit(proc="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """The least memory limit of this process's control group and those above it, or None: a container or a
    Slurm job is held to it, whatever the machine has. proc's lines: "0::/job/step" (cgroup v2, memory.max)
    or "4:memory:/job/step" (v1, memory.limit_in_bytes); a group missing under root is looked for above."""
    kinds = {"": ("", "memory.max"), "memory": ("memory", "memory.limit_in_bytes")}  # cgroup v2, v1
    limits = []
    with contextlib.suppress(OSError, ValueError):  # no /proc (not Linux), or a line not of three fields
        for line in Path(proc).read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if controllers in kinds:
                base = Path(root, kinds[controllers][0])
                deepest = base / group.strip().lstrip("/")
                for d in [p for p in (deepest, *deepest.parents) if p == base or base in p.parents]:
                    with contextlib.suppress(OSError, ValueError):  # missing, or "max": no limit there
                        limits.append(int((d / kinds[controllers][1]).read_text()))
    return min(limits, default=None)


def too_big(c):  # the run would not fit in memory: a sentence with the estimate, or ""
    need, (have, what) = training_bytes(c), memory_bytes(c["device"], c["world_size"])
    if need <= have:
        return ""
    return (f"this model and batch need at least {need / 2**30:,.1f} GiB to train (weights, gradients, AdamW state, "
            f"one micro-batch's logits and activations), more than {what} ({have / 2**30:,.1f} GiB); lower "
            "--batch-size (or raise --grad-accum), --vocab-size, --d-model, --d-ff, --num-layers or --context-length.")


def is_ids(source):  # --data PATH.npy, in any case (IDS.NPY too), holds token ids; anything else is text
    return Path(source).suffix.lower() == ".npy"


DATA_CHECKS = [  # the rows of a run that tokenizes its text: --benchmark (random tokens) skips them, experiments.py not
    (lambda c: not c["data_is_ids"] and not writable(Path(c["data_dir"])) and not c["cached"](),
     "--data-dir {data_dir} is not a writable directory (a file, or read-only) for the token cache, and does not hold "
     "this data's tokens already; pick another."),
    (lambda c: not c["data_is_ids"] and c["vocab_size"] < MIN_TEXT_VOCAB,
     "--vocab-size {vocab_size} is too small for BPE on text data: 256 bytes + 1 special token need 257."),
]


CHECKS = [  # (is_wrong(c), message or message(c)), in order; the first wrong row stops, so rows rely on those above
    (lambda c: bad_environment(), lambda c: bad_environment()),
    (lambda c: c["max_iters"] is not None and c["total_tokens"] is not None,
     "--max-iters and --total-tokens both set the run length; pass only one of them."),
    (bad_number, bad_number),
    (adamw_overflow, adamw_overflow),
    (too_long, too_long),
    (lambda c: c["max_iters"] is None and c["total_tokens"] < c["batch_size"] * c["context_length"],
     "--total-tokens {total_tokens} is smaller than one batch (batch size x context length); raise it."),
    (lambda c: c["data_is_file"] and unreadable(c["data"]),
     lambda c: f"--data {c['data']}{unreadable(c['data'])}; pass pydoc, tinystories, owt, a .txt file or a .npy file."),
    (lambda c: c["data_is_file"] and Path(c["data"]).stat().st_size == 0,
     "--data {data} is empty; pass a file with text or token ids."),
    (lambda c: c["val_data"] and not c["data_is_ids"],
     "--val-data goes with --data PATH.npy only; text data is split automatically."),
    (lambda c: c["val_data"] and unreadable(c["val_data"]),
     lambda c: f"--val-data {c['val_data']}{unreadable(c['val_data'])}."),
    (lambda c: c["tokenizer"] and not c["data_is_ids"],
     "--tokenizer goes with --data PATH.npy only; text data gets a tokenizer trained on it (--vocab-size)."),
    *[(lambda c, wrong=wrong: not c["benchmark"] and wrong(c), message) for wrong, message in DATA_CHECKS],
    (lambda c: c["d_model"] % c["num_heads"], "--d-model {d_model} is not divisible by --num-heads {num_heads}."),
    (lambda c: not c["nope"] and (c["d_model"] // c["num_heads"]) % 2,
     "RoPE needs an even head size, but --d-model {d_model} / --num-heads {num_heads} is odd; change one or pass "
     "--nope."),
    (lambda c: c["no_norm"] and c["post_norm"], "--no-norm and --post-norm contradict each other; pass one of them."),
    (lambda c: c["min_lr"] > c["lr"], "--min-lr {min_lr} is above --lr {lr}."),
    (lambda c: c["benchmark"] and (c["resume"] or c["overwrite"] or c["export"] is not None),
     "--benchmark times steps on random tokens, and reads and writes no run; drop --resume, --overwrite and --export."),
    (lambda c: c["export"] is not None and c["resume"], "--export writes a run as it stands; drop --resume."),
    (lambda c: c["resume"] and c["overwrite"],
     "--resume continues a run and --overwrite replaces it; pass one of them."),
    (lambda c: c["sample"] and (c["resume"] or c["overwrite"] or c["benchmark"] or c["export"] is not None),
     "--sample only reads a run and prints its samples; drop --resume, --overwrite, --benchmark and --export."),
    (lambda c: c["sample"] and c["num_samples"] == 0, "--sample with --num-samples 0 prints nothing; pass 1 or more."),
    (lambda c: c["prompt"] == "-" and not c["sample"],
     "--prompt - reads prompts from stdin for --sample only; pass the prompt's text."),
    (lambda c: c["batch_size"] % (c["world_size"] * c["grad_accum"]), "--batch-size {batch_size} does not divide "
     "into {world_size} processes x --grad-accum {grad_accum}; make it a multiple of their product."),
    (lambda c: device_error(c["device"]), lambda c: f"--device {c['device']}: {device_error(c['device'])}"),
    (lambda c: c["dtype"] not in ("float32", "bf16"), "--dtype {dtype}: use float32 or bf16."),
    (lambda c: c["dtype"] == "bf16" and c["device"].startswith("cuda") and not _torch().cuda.is_bf16_supported(),
     "--dtype bf16: this GPU has no bfloat16 support; use --dtype float32."),
    (lambda c: c["export"] is None and not c["sample"] and too_big(c), too_big),  # before anything is allocated
    (lambda c: c["plot"] and importlib.util.find_spec("matplotlib") is None,
     "--plot needs matplotlib: pip install matplotlib (or drop --plot)."),
    (lambda c: c["tensorboard"] and importlib.util.find_spec("tensorboard") is None,
     "--tensorboard needs the tensorboard package: pip install tensorboard (or drop --tensorboard)."),
    (lambda c: c["run_name"] in ("", ".", "..") or "/" in c["run_name"] or os.sep in c["run_name"],
     "--run-name {run_name!r} must be one plain name inside --out-dir (no '/', not '..' or '.'); pick another."),
    (run_dir_problem, run_dir_problem),
    (lambda c: c["compile"] and c["export"] is None  # last: it takes seconds (--sample's generate compiles too)
     and compile_error(c["device"]),
     lambda c: f"--compile needs a working C++ compiler (torch inductor failed on {c['device']}: "
               f"{compile_error(c['device'])}); install one (e.g. apt install g++) or drop --compile."),
]


def check_flags(cfg, sources, is_ids, is_cached, rows=CHECKS):
    """UsageError at the first of rows (CHECKS) cfg fails; sources: --data's corpus names; is_ids(path): ids, not text?
    is_cached(data, data_dir, vocab_size): does data_dir hold that text's tokens already (a read-only one will do)?"""
    c = dict(cfg, data_is_file=cfg["data"] not in sources, data_is_ids=is_ids(cfg["data"]),
             cached=lambda: is_cached(cfg["data"], cfg["data_dir"], cfg["vocab_size"]))
    for is_wrong, message in rows:
        if is_wrong(c):
            raise UsageError(message(c) if callable(message) else message.format(**c))


def undecodable_ids(tok, V):  # the ids below V with no token: sampling may draw any id 0 to V - 1
    return [i for i in range(V) if i not in tok.vocab]


def check_samples(cfg, tok, tok_files, top, eot):
    """The run ends by sampling: what would fail there is refused at the start instead. top: the data's
    largest token id; eot starts a sample without --prompt and ends every one (generate's stop id)."""
    if tok is None and cfg["prompt"]:
        raise UsageError(f"--prompt needs a tokenizer to encode it, and there is none beside --data {cfg['data']}; "
                         "pass --tokenizer DIR (bpe.py train's --out), or drop --prompt.")
    if tok is None and cfg["num_samples"]:
        log(f"note: no samples at the end: --data {cfg['data']} has no tokenizer beside it; pass --tokenizer DIR "
            "(bpe.py train's --out) for samples, or --num-samples 0.")
    if tok is None or cfg["num_samples"] == 0:
        return
    n, V, where = len(tok.vocab), cfg["vocab_size"], tok_files[0]
    if top >= n:
        raise UsageError(f"the data holds token id {top}, but {where}, which decodes the samples, has {n} tokens; "
                         "use the tokenizer that made the ids, or --num-samples 0.")
    if V > n:
        raise UsageError(f"--vocab-size {V} is above the {n} tokens of {where}, so samples could hold ids it cannot "
                         f"decode; pass --vocab-size {n}, or --num-samples 0.")
    missing = undecodable_ids(tok, V)
    if missing:
        raise UsageError(f"{where} has no token with id {', '.join(map(str, missing[:3]))}"
                         f"{' ...' if len(missing) > 3 else ''} ({len(missing)} of the ids below --vocab-size {V} "
                         f"missing), so samples could hold ids it cannot decode; number its tokens 0 to {n - 1}, or "
                         "pass --num-samples 0.")
    for what, text in (("--prompt", cfg["prompt"]), (f"{eot}, which ends each sample,", eot)):  # a prompt's too
        try:
            highest = max(tok.encode(text), default=-1)
        except ValueError as e:  # UnicodeEncodeError: a lone surrogate, from command-line bytes that are not UTF-8
            raise UsageError(f"--prompt cannot be encoded ({e}); pass UTF-8 text.") from None
        if highest >= V:
            raise UsageError(f"{what} encodes to token id {highest}, at or above --vocab-size {V}, so the model cannot "
                             "read it; pass a larger --vocab-size, or --num-samples 0.")


# ----------------------------------------------------------------------------
# 3. The run directory: one writer (a lock), an old run replaced only on --overwrite, the files beside ckpt.pt

def lock_holder(path):
    """The PID holding an flock on path, read from /proc/locks (Linux) by the file's device and inode, or None.
    A line there reads "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146836 0 EOF" (PID, then major:minor:inode)."""
    st = os.stat(path)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as f:  # a waiter's line: "1: -> FLOCK ...", r[1] "->"
        return next((int(r[4]) for r in map(str.split, f) if len(r) > 5 and r[1] == "FLOCK" and r[5] == where), None)
    return None  # no /proc/locks (not Linux): the sentence says "another process"


def in_use(where, pid):
    return (f"{where} is in use by {f'process {pid}' if pid else 'another process'}, which is writing the same run; "
            "wait for it to end (or stop it), or pick another --run-name.")


@contextlib.contextmanager
def new_folders(path):
    """mkdir -p path; on an error (offline, Ctrl-C) the folders it made that are still empty go again: a failed
    download, or a run stopped before its first checkpoint, leaves nothing behind, while a folder holding a .part
    (what a rerun resumes) or a user's file stays."""
    made = [p for p in (path, *path.parents) if not p.exists()]  # the deepest first, as rmdir needs
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for p in made:
            with contextlib.suppress(OSError):  # not empty: kept, and so is every folder above it
                p.rmdir()
        raise


@contextlib.contextmanager
def run_lock(cfg):
    """One writer per run directory: rank 0 holds an exclusive flock on it until the run ends (the kernel drops it
    when the process dies, even by SIGKILL: never stale); a second writer is refused, touching nothing. Then it
    clears what a run killed mid-write left; an old run stays whole until the new run's first checkpoint. A stop or
    fault before that checkpoint (while the model is built) leaves no empty run directory (new_folders)."""
    with new_folders(run_dir(cfg)) if cfg["rank"] == 0 else contextlib.nullcontext(), _run_lock(cfg):
        yield


@contextlib.contextmanager
def _run_lock(cfg):
    import fcntl  # Unix only; imported here so that bpe.py, which imports this file, still loads elsewhere
    err, fd, where = [None], None, run_dir(cfg)
    if cfg["rank"] == 0:
        fd = os.open(where, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err = [UsageError(in_use(where, lock_holder(where)))]
        if not err[0] and (problem := run_dir_problem(cfg)):  # CHECKS again: a run beside this one may have ended since
            err = [UsageError(problem)]
        if not err[0] and cfg["overwrite"] and (where / "ckpt.pt").exists():
            log(f"note: --overwrite: the run in {where} is replaced file by file from the new run's first checkpoint")
        if not err[0]:
            clear_temporaries(where)
    if cfg["world_size"] > 1:  # torchrun: the others stop with rank 0's verdict
        _torch().distributed.broadcast_object_list(err, src=0)
    try:
        if err[0]:
            raise err[0]
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock


def metrics_records(path):
    """metrics.jsonl as (line, its record or None): None for a line that is no record, one cut short by a kill, not
    UTF-8 (its bytes decode to U+FFFD, which is no JSON), or edited (5, [1, 2], null, {"foo": 1}, {"step": "x"})."""
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            e = load_json(line, path)
        except ValueError:
            e = None
        yield line, (e if isinstance(e, dict) and type(e.get("step")) is int else None)


def truncate_metrics(path, last_step):
    """Drop the lines after the step a resumed run restarts from (they run again), and that step's
    validation line (its checkpoint was saved before it); lines that are no record too, with a note."""
    if not path.exists():
        return
    keep, dropped = [], 0
    for line, e in metrics_records(path):
        if e is None:
            dropped += bool(line.strip())
        elif e["step"] < last_step or (e["step"] == last_step and "loss" in e):
            keep.append(line)
    if dropped:
        log(f"note: dropped {dropped} line(s) of {path} that are not metrics records (cut short by a kill, or edited)")
    with atomic_file(path, "w") as f:
        f.write("".join(line + "\n" for line in keep))


def write_run_files(cfg, tok_files, start, new):
    """Beside ckpt.pt, after it (an --overwrite replaces an old run from there): the tokenizer, config.json, and
    metrics.jsonl cut back to the checkpoint's step. A resumed run copies the tokenizer again unless it is the
    checkpoint's (one killed before this copy, after an --overwrite, holds the old run's)."""
    where = run_dir(cfg)
    for f, digest in zip(tok_files or (), cfg["data_fingerprint"]["tokenizer"]):
        copy = where / f.name
        if not new and copy.is_file() and hashlib.sha256(copy.read_bytes()).hexdigest() == digest:
            continue
        if not new and hashlib.sha256(f.read_bytes()).hexdigest() != digest:  # changed while this run prepared
            raise UsageError(f"{f} changed while the run started, so {copy} cannot be made to match the checkpoint's "
                             "tokenizer; run the same command again.")
        if not new and copy.exists():
            log(f"note: --resume: {copy} is not the tokenizer the checkpoint was trained with; copying {f}")
        with atomic_file(copy) as out:  # a full disk must not leave half a tokenizer
            out.write(f.read_bytes())
    with atomic_file(where / "config.json", "w") as f:
        f.write(json.dumps(cfg, indent=2) + "\n")
    truncate_metrics(where / "metrics.jsonl", start)
    if new:  # what an old run here left that this one does not make (yet)
        for name in {"vocab.json", "merges.txt", "samples.txt", "loss.png"} - {f.name for f in tok_files or ()}:
            (where / name).unlink(missing_ok=True)


def plot(metrics_path, png_path):
    """--plot: metrics.jsonl drawn as loss.png, loss against steps and against wall-clock time."""
    import matplotlib  # optional (CHECKS refused --plot without it), so imported only here
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [e for _, e in metrics_records(metrics_path) if e]
    tr, va = [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step", "step"), (axes[1], "time", "wall-clock seconds")):
        ax.plot([r[key] for r in tr], [r["loss"] for r in tr], label="train")
        ax.plot([r[key] for r in va], [r["val_loss"] for r in va], "o-", label="validation")
        ax.set(xlabel=label, ylabel="loss (nats/token)")
        ax.legend()
    fig.tight_layout()
    with atomic_file(png_path) as f:
        fig.savefig(f, format="png")
    log(f"plot: {png_path}")


_writers = {}  # run directory -> its TensorBoard SummaryWriter, made at the run's first record


def tensorboard(cfg, run_dir, entry):
    """--tensorboard: one metrics.jsonl record as scalars in RUN_DIR/tensorboard/ (tensorboard --logdir OUT_DIR).
    A resumed run's first record purges the events a stopped run wrote from that step on, as metrics.jsonl drops
    its lines; flushed at each record (log steps only), so a killed run's curve is there up to its last line."""
    if not cfg["tensorboard"]:
        return
    if run_dir not in _writers:  # CHECKS made sure the package is there
        from torch.utils.tensorboard import SummaryWriter
        _writers[run_dir] = SummaryWriter(run_dir / "tensorboard", purge_step=entry["step"])
    writer = _writers[run_dir]
    for key, value in entry.items():
        if key != "step" and isinstance(value, (int, float)):
            writer.add_scalar(key, value, entry["step"])
    writer.flush()


# ----------------------------------------------------------------------------
# 4. A run's torch and C-library settings; --resume: the checkpoint must fit the model, config and data (its RNG
#    states make it exact); --sample reads it

def read_checkpoint(src):
    """A checkpoint's dict from a path or a binary file object, or ValueError: torch.load checks none of the
    CRC-32s torch.save's zip keeps per record, so zipfile checks them first (a flipped byte in a weight is
    refused, not loaded); weights_only: tensors and plain values, so loading a file cannot run code."""
    name = src if isinstance(src, (str, os.PathLike)) else "the checkpoint"
    try:  # a file object's checkpoint starts where it stands, as torch.load reads it; zipfile seeks in it
        start = None if name == src else src.tell()
    except OSError as e:  # a pipe
        raise ValueError(f"{name} is a stream that cannot seek ({e}); pass a file or a buffer") from None
    if start:  # after bytes of the user's own: torch 2.5 reads a zip only from a file's first byte, so read a copy
        src, start = io.BytesIO(src.read()), 0
    if name == src and (kind := not_a_file(src)):  # a FIFO would be read forever, a directory is an OSError
        raise ValueError(f"{src} is {kind}, not a checkpoint file")
    try:
        with zipfile.ZipFile(src) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise ValueError(f"{name} is not a torch.save zip file ({e})") from None
    if bad is not None:
        raise ValueError(f"{name} is damaged: its record {bad} fails its CRC-32 check")
    if start is not None:
        src.seek(start)
    try:
        state = _torch().load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # e.g. a pickle that asks for code: refused by weights_only
        raise ValueError(f"{name} cannot be loaded ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{name} holds a {type(state).__name__}, not a checkpoint's dict")
    return state


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt options (malloc.h)


def keep_freed_memory():
    """glibc hands a freed block of 128 KB or more back to the kernel, so a training step's next allocation of
    that size takes a page fault for each of its 4 KB pages: a CPU step spent up to a fifth of its time in the
    kernel. From here on, blocks up to 32 MB (glibc's limit) come from the heap, and up to 1 GB of its freed top is
    kept for the next step. Both together: the trim setting alone switches off glibc's own adaptation, and every
    block is mapped anew. Process-wide (a second call changes nothing); False where the C library has no such
    switch (macOS, musl, Windows)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))


@contextlib.contextmanager
def torch_settings(cfg):
    """PyTorch's global switches for a run, restored afterwards (tests run many in one process)."""
    torch = _torch()
    filling = torch.utils.deterministic  # its switch: deterministic mode fills each new tensor with NaN
    was = (torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
           filling.fill_uninitialized_memory)
    # bitwise-reproducible CPU runs (what makes a resumed run identical): the embedding's backward (an index_put
    # with accumulate) otherwise adds rows in a thread-dependent order. A GPU's float32 matmuls run TF32
    torch.use_deterministic_algorithms(cfg["device"] == "cpu" or was[0])
    # The NaN fill guards against a kernel that reads memory it never wrote; none here does (the resume tests
    # compare bits), and it is one more pass over every new tensor: a CPU step's matmul outputs, attention's buffers
    filling.fill_uninitialized_memory = was[2] and cfg["device"] != "cpu"
    torch.set_float32_matmul_precision("high" if cfg["device"].startswith("cuda") else was[1])
    # A CPU computes with subnormal floats (below 2^-126: the attention probabilities of a run at too high a rate)
    # many times slower, so they are flushed to zero. torch's worker threads inherit the switch when they start
    # after it, as in train.py, whose first parallel work is the run's
    flush = cfg["device"] == "cpu" and torch.set_flush_denormal(True)  # False where the CPU cannot (not x86)
    if cfg["device"] == "cpu":  # not undone afterwards: it changes only when freed memory goes back to the kernel
        keep_freed_memory()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.set_float32_matmul_precision(was[1])
        filling.fill_uninitialized_memory = was[2]
        if flush:
            torch.set_flush_denormal(False)


# Batches are random windows, so the data stream's position is the batch generator's state (plus
# the step count): it goes into every checkpoint with torch's RNG states, and a resumed run is exact.
def rng_state(batch_gen):
    torch = _torch()
    cuda = {"cuda_rng": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    return {"batch_rng": batch_gen.get_state(), "torch_rng": torch.get_rng_state(), **cuda}


def restore_rng(state, batch_gen):
    torch = _torch()
    batch_gen.set_state(state["batch_rng"])
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def check_state(state, model, optimizer=None, name="the checkpoint"):
    """Raises ValueError unless a checkpoint's dict fits model (unwrapped) and optimizer: its entries,
    every shape, the iteration. Checked before anything is loaded, so a bad one changes nothing."""
    for key in ("model", "iteration", *(("optimizer",) if optimizer is not None else ())):
        if key not in state:
            raise ValueError(f"{name} has no {key!r} entry")
    it, own, saved = state["iteration"], model.state_dict(), state["model"]
    if isinstance(saved, dict) and saved.keys() != own.keys():  # saved from inside torch.compile or DDP (common in
        # CS336 code): without the wrappers' prefixes, where the model's own keys have none (its own compiled part)
        state["model"] = saved = {k.replace("_orig_mod.", "").removeprefix("module.") if isinstance(k, str) else k: v
                                  for k, v in saved.items()}  # a key that is no str: named below
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ValueError(f"{name} holds iteration {it!r}, not a step count")
    keys = set(saved) if isinstance(saved, dict) else set()
    if keys != own.keys():
        raise ValueError(f"{name} does not fit this model: it lacks {sorted(own.keys() - keys)[:3]} and has "
                         f"{sorted(keys - own.keys(), key=repr)[:3]} too many")  # key=repr: keys of any type
    for k, v in own.items():
        if not isinstance(saved[k], type(v)) or saved[k].shape != v.shape:  # type(v): torch.Tensor
            raise ValueError(f"{name} does not fit this model: {k} has shape {tuple(getattr(saved[k], 'shape', ()))}, "
                             f"the model's {tuple(v.shape)}")
        kinds = [(t.is_floating_point(), t.is_complex()) for t in (saved[k], v)]
        if kinds[0] != kinds[1]:  # loading casts to the model's dtype: a complex tensor loses its imaginary part,
            # a float one in an integer entry (a BatchNorm's count, a bool mask) its fraction; of one kind, any loads
            want = "floating-point weights" if v.is_floating_point() else f"{v.dtype} as the model's"
            raise ValueError(f"{name} does not fit this model: {k} holds {saved[k].dtype}, not {want}")
    if optimizer is None:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def usable(v, p):  # a number, or a real tensor (loading casts a complex one) of p's shape or a scalar
        return not isinstance(v, _torch().Tensor) or (not v.is_complex() and tuple(v.shape) in ((), tuple(p.shape)))
    try:  # the same groups of parameters, and every moment of its parameter's shape
        saved = state["optimizer"]
        fits = [len(g["params"]) for g in saved["param_groups"]] == [len(g["params"]) for g in optimizer.param_groups]
        fits = fits and all(0 <= i < len(params) and all(usable(v, params[i]) for v in s.values())
                            for i, s in saved["state"].items())
    except (TypeError, KeyError, AttributeError):
        fits = False
    if not fits:
        raise ValueError(f"{name} holds optimizer state that does not fit this model's parameters")


# What shapes the trajectory besides the model (its shape and ablations): --resume refuses a checkpoint that differs.
# Not --grad-accum, nor the number of processes: they change the arithmetic's order, never the data (micro_batches),
# so a resumed run may raise --grad-accum where it has less memory.
TRAJECTORY_KEYS = ("data", "val_data", "batch_size", "max_iters", "lr", "min_lr", "warmup_iters", "beta1", "beta2",
                   "eps", "weight_decay", "grad_clip", "dtype", "seed")


def check_config(config, like, name):
    """ValueError unless a saved run config (a dict) holds every key of like, each value of the type like's has (this
    command's flags): what reads it then meets no missing key, and no str or tensor where a number or switch belongs."""
    for k, v in like.items():
        if k not in config or type(config[k]) is not type(v):
            got = f"holds {k} = {short_repr(config[k])}, not a {type(v).__name__}" if k in config else f"lacks {k!r}"
            raise ValueError(f"{name} {got} in its run config")


def read_run(d, like):
    """A run directory's checkpoint dict, its config checked against like (check_config). A run still training
    may be read: it replaces ckpt.pt whole (atomic_file), so this reads one checkpoint or the next, never half of
    one, and takes no lock. FileNotFoundError where there is no checkpoint (yet); ValueError where it is damaged."""
    ckpt = Path(d) / "ckpt.pt"
    if not ckpt.exists():
        raise FileNotFoundError(f"{ckpt} does not exist yet (its run has saved no checkpoint)" if Path(d).is_dir()
                                else f"{d} is a file, not a run directory: pass the directory that holds ckpt.pt"
                                if Path(d).is_file() else f"there is no run in {d}")
    state = read_checkpoint(ckpt)
    if not isinstance(state.get("config"), dict) or not isinstance(state.get("model"), dict):
        raise ValueError(f"{ckpt} holds no run config or no model")
    check_config(state["config"], like, ckpt)
    return state


def print_samples(cfg, load_run, write_samples, eot):
    """train.py --sample: the run's last checkpoint (load_run) continues --prompt, or with --prompt - each line of
    stdin as it comes (an empty line: a new document); write_samples prints the samples, each ending at eot. The run
    is only read."""
    try:
        model, tok, _ = load_run(run_dir(cfg), cfg["device"])
    except FileNotFoundError as e:
        raise UsageError(f"--sample: {e}; pass the --data (or --out-dir and --run-name) of a trained run.") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"--sample: {str(e).rstrip('.')}; restore it from a copy, or train the run again.") from None
    if tok is None:
        raise UsageError(f"--sample: {run_dir(cfg)} holds no tokenizer to encode prompts and decode samples (its ids "
                         "came without one); put the vocab.json and merges.txt that made them there.")
    n, V, stop = len(tok.vocab), model.vocab_size, tok.encode(eot)[0]
    if stop >= V or undecodable_ids(tok, V):  # ids trained with --num-samples 0 may sit beside any tokenizer
        raise UsageError(f"--sample: the tokenizer in {run_dir(cfg)} ({n} tokens, {eot} at id {stop}) does not fit its "
                         f"model, whose samples need a token for each id below {V}, {eot} among them; put the "
                         "vocab.json and merges.txt that made its ids there.")
    try:
        for line in sys.stdin if cfg["prompt"] == "-" else [cfg["prompt"]]:
            prompt = line.removesuffix("\n").removesuffix("\r")  # a CRLF file's line: its text without the \r
            try:
                write_samples(model, tok, dict(cfg, prompt=prompt), sys.stdout)
            except ValueError as e:  # text that is not UTF-8 (a lone surrogate), an id past the model's vocabulary
                raise UsageError(f"--prompt {short_repr(prompt)} cannot be sampled ({str(e).rstrip('.')}); pass "
                                 "other text.") from None
            sys.stdout.flush()  # each prompt's samples as they come, through a pipe too
    except UnicodeDecodeError as e:  # stdin's bytes, where the locale's decoding is strict
        raise UsageError(f"--prompt -: stdin is not UTF-8 text ({e}); pass UTF-8 text.") from None
    except KeyboardInterrupt:  # Ctrl-C, a way to end --prompt - at a terminal: not train.py's advice to --resume
        log("train.py: interrupted; --sample only reads the run, which is as it was.", file=sys.stderr)
        return 130
    return 0


def differs(key, old, new, names, fingerprinted):
    """Does a saved config's value old of key differ from this run's new? A value of another type does (a tensor,
    "5"). Two spellings of one --data or --val-data file (x.txt, ./x.txt, ../x.txt from a subfolder) do not: when the
    checkpoint holds the data's fingerprint, check_same_data compares the files themselves, wherever the run started.
    names: --data's corpus names, which are no paths (tinystories and owt differ at once, before any download)."""
    if type(old) is type(new) and old == new:
        return False
    paths = key in ("data", "val_data") and isinstance(old, str) and isinstance(new, str)
    return not (fingerprinted and paths and not (key == "data" and names.intersection((old, new))))


def verify_resume(cfg, ckpt_path, model_keys, model, optimizer, names):
    """The saved checkpoint, or None to start from step 0; UsageError if it is damaged, does not fit model and
    optimizer (both on the meta device: dry_step steps them), or its config differs on model_keys (TransformerLM's
    shape and ablations) or TRAJECTORY_KEYS. names: --data's corpus names (see differs)."""
    if not ckpt_path.exists():  # killed before its first checkpoint: step 0 is where it stood
        log(f"note: --resume found no checkpoint {ckpt_path}; starting from step 0")
        return None
    try:
        state = read_checkpoint(ckpt_path)
        old = state.get("config")
        if not isinstance(old, dict):
            raise ValueError(f"{ckpt_path} holds no run config (a dict), so it was not saved by train.py")
        diff = [f"{k} ({short_repr(old.get(k))} -> {short_repr(cfg[k])})" for k in (*model_keys, *TRAJECTORY_KEYS)
                if differs(k, old.get(k), cfg[k], set(names), old.get("data_fingerprint") is not None)]
        if diff:
            raise UsageError(f"--resume: {ckpt_path} was trained with a different config; keys that differ: "
                             f"{', '.join(diff)}.")
        check_state(state, model, optimizer, name=ckpt_path)
        check_run_entries(state, cfg["max_iters"], ckpt_path)
        dry_step(state, model, optimizer, ckpt_path)
    except (ValueError, OSError) as e:
        raise UsageError(f"--resume: {e}; restore it from a copy, or start a new run with --overwrite.") from None
    return state


def check_run_entries(state, max_iters, name):
    """ValueError unless what train.py reads of a checkpoint besides the model and the optimizer can be used: the
    iteration within the run's max_iters steps, the RNG states (spare generators try them), the seconds trained so
    far (elapsed: a real number, at least 0 and not more than the seconds since 1970) and the data's fingerprint."""
    torch = _torch()
    if state["iteration"] > max_iters:
        raise ValueError(f"{name} holds iteration {state['iteration']}, past the run's {max_iters} steps")
    try:  # both are CPU generator states; the GPUs' are used (restore_rng) only where as many GPUs are
        for key in ("batch_rng", "torch_rng"):
            torch.Generator().set_state(state["rng"][key])
        cuda = state["rng"].get("cuda_rng", [])
        if not isinstance(cuda, (list, tuple)):
            raise TypeError(f"cuda_rng is a {type(cuda).__name__}")
        for i, s in enumerate(cuda if torch.cuda.is_available() and len(cuda) == torch.cuda.device_count() else ()):
            torch.Generator(device=f"cuda:{i}").set_state(s)
    except (KeyError, TypeError, RuntimeError, AttributeError) as e:
        raise ValueError(f"{name} holds no valid RNG state ({type(e).__name__})") from None
    elapsed = state.get("elapsed", 0.0)  # checkpoints of other code have none: the clock starts at 0
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed <= time.time():
        raise ValueError(f"{name} holds elapsed {short_repr(elapsed)}, not the seconds a run has trained")
    fp = state["config"].get("data_fingerprint")  # a checkpoint from before fingerprints has none
    if fp is not None and not (isinstance(fp, dict) and fp.keys() == {"tokens", "tokenizer"} and all(
            isinstance(v, list) and all(isinstance(d, str) for d in v) for v in fp.values())):
        raise ValueError(f"{name} holds a data fingerprint {short_repr(fp)}, not lists of digests")


def dry_step(state, model, optimizer, name):
    """ValueError unless the saved optimizer state works: each saved group's settings go to the optimizer's
    constructor (which checks their ranges), then the state is loaded into optimizer and stepped once with zero
    gradients, on model's meta device (no memory, no time). What the first real step would fail on (a moment
    missing, a str step count, betas of 2) is refused before anything is read or written."""
    torch = _torch()
    try:
        for group in state["optimizer"]["param_groups"]:
            type(optimizer)([torch.empty(0, device="meta")], **{k: v for k, v in group.items() if k != "params"})
        optimizer.load_state_dict(state["optimizer"])
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    except NotImplementedError:  # an op without a meta kernel in this torch: the real step is the only check then
        pass
    except Exception as e:  # whatever the step raises: KeyError, TypeError, ValueError, ZeroDivisionError, ...
        why = (str(e).splitlines() or [""])[0][:100]  # torch's TypeErrors go on for lines
        raise ValueError(f"{name} holds optimizer state that {type(optimizer).__name__} cannot use "
                         f"({type(e).__name__}: {why.rstrip('.')})") from None


def final_val_loss(path, step):  # the validation loss metrics.jsonl holds for step, or None (no such line, no file)
    with contextlib.suppress(OSError):
        for _, e in reversed(list(metrics_records(path))):
            if e and e["step"] == step and type(e.get("val_loss")) is float:
                return e["val_loss"]
    return None


def run_complete(state, cfg, ckpt_path, tok):
    """Is the resumed checkpoint at the run's last step, with its final evaluation in metrics.jsonl and the files
    the end of train() writes after it (samples.txt where the run samples: tok, the run's tokenizer, is not None;
    loss.png with --plot)? Then one line says so, and nothing is evaluated, sampled or written again (the end did
    that once). Without them (stopped at the last step, during the evaluation, the sampling or the plot) the run
    goes on to its end. A longer run changes --max-iters, which --resume refuses."""
    run = ckpt_path.parent
    ends = [name for name, made in (("samples.txt", tok is not None and cfg["num_samples"] > 0),
                                    ("loss.png", cfg["plot"])) if made]
    loss = final_val_loss(run / "metrics.jsonl", cfg["max_iters"])
    if state["iteration"] < cfg["max_iters"] or loss is None or not all((run / name).is_file() for name in ends):
        return False
    log(f"{run} is already complete (step {cfg['max_iters']} of {cfg['max_iters']}, final val loss "
        f"{loss:.4f}): nothing to train. For text from it, run the same command with --sample instead of --resume; to "
        "train longer, start a new run with a larger --max-iters (plus --overwrite, or another --run-name).")
    return True


def check_same_data(state, cfg, ckpt_path):
    """Raises UsageError if the checkpoint was trained on other token files or another tokenizer
    (a changed text file gets a new cache and a new tokenizer: resuming on it would go on silently).
    verify_resume checked the fingerprint's form, and left --data's spelling to this comparison."""
    old, new = state["config"].get("data_fingerprint"), cfg["data_fingerprint"]
    if old is not None and old != new:  # a checkpoint from before fingerprints has none: nothing to compare
        what = "tokenizer's files" if isinstance(old, dict) and old.get("tokens") == new["tokens"] else "tokens"
        raise UsageError(f"--resume: {ckpt_path} was trained on other data (its {what} differ from those of --data "
                         f"{cfg['data']} now); resume with the data it was trained on, or start a new run with "
                         "--overwrite.")


# ----------------------------------------------------------------------------
# 5. The loop's faults (Ctrl-C, SIGTERM or SIGHUP at a step boundary, a NaN, a full disk); torchrun's group

@contextlib.contextmanager
def stop_requests(cfg):
    """Ctrl-C, SIGTERM or SIGHUP stops the loop at the next step boundary, where model and optimizer agree,
    so the checkpoint saved then is valid (under DDP: the next log step); a second Ctrl-C aborts at once.
    Yields stopped(step)."""
    asked = []

    def handler(signum, frame):
        if signum == SIGHUP:  # the terminal is gone: never an abort (the kernel and the shell may both send one)
            hang_up()
        elif asked:
            raise KeyboardInterrupt
        if not asked:
            asked.append(signum)
            when = "this step" if cfg["world_size"] == 1 else "the next log step (--log-interval)"
            log(f"\nstopping after {when}; a checkpoint will be saved (Ctrl-C again to abort now)")

    def stopped(step):  # under DDP every process must stop at the same step: one's signal stops all. Asking them
        if cfg["world_size"] == 1:  # is an all_reduce and a host wait, so only at log steps
            return bool(asked)
        if step % cfg["log_interval"]:
            return False
        torch = _torch()
        s = torch.tensor([float(bool(asked))], device=cfg["device"])
        torch.distributed.all_reduce(s)
        return bool(s.item())
    old = on_stops(handler)
    try:
        yield stopped
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def read_back(steps, ckpt_path):
    """steps: [(step, loss, norm)] in order, device tensors (norm None without --grad-clip), emptied here -> the last
    one's (loss, norm) as floats (None for no steps), in one host wait: until then a GPU runs ahead of Python, so a
    NaN step has been taken; stop_non_finite names the first (exit 1) and ckpt_path, saved before it, stays."""
    if not steps:
        return None
    values = _torch().stack([t for _, loss, norm in steps for t in (loss, loss if norm is None else norm)]).tolist()
    for (step, _, clipped), loss, norm in zip(steps, values[::2], values[1::2]):
        norm = None if clipped is None else norm
        stop_non_finite(step, ckpt_path, loss, norm)
    steps.clear()
    return loss, norm


DIVERGED = "; stopping. The last good checkpoint is"  # after "step N": a diverged run's end, which experiments.py reads


def diverged_at(text):  # the step where a run's output says it diverged (stop_non_finite's sentence), or None
    found = re.search(rf"step (\d+){re.escape(DIVERGED)}", text)
    return found and int(found.group(1))


def stop_non_finite(step, ckpt_path, loss=0.0, norm=None, model=None):
    """DataError (exit code 1; ckpt_path stays the last good one) if the loss, the gradient norm or a weight is
    NaN or infinite. Weights too: a finite loss's update can still overflow them (--lr 1e30)."""
    bad = [name for name, p in model.named_parameters() if not _torch().isfinite(p).all()] if model else []
    what = (f"the loss is {loss} at" if not math.isfinite(loss) else
            f"the gradient norm is {norm} at" if norm is not None and not math.isfinite(norm) else
            bad and f"the weights are not finite ({len(bad)} tensors, e.g. {bad[0]}; not saved) after")
    if what:
        raise DataError(f"{what} step {step}{DIVERGED} {ckpt_path}; try a lower --lr "
                        "or a --grad-clip.")


@contextlib.contextmanager
def disk_full(where, then):
    """A full disk (or quota) while writing under `where` ends in one sentence, exit code 1; atomic_file leaves
    what was there whole. The OSError may come wrapped (torch.save's zip writer raises a RuntimeError)."""
    try:
        yield
    except Exception as e:
        cause = e  # down the chain a traceback would show
        while cause is not None and not disk_is_full(cause):
            cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
        if cause is None:
            raise
        raise DataError(f"the disk is full: could not write {cause.filename or f'into {where}/'}; free some space, "
                        f"then {then}.") from None


def rank0_first(cfg, prepare):
    """prepare() on rank 0 first (a full disk under --data-dir is one sentence); under torchrun the others
    wait for its verdict (its error stops all with one sentence), then open what it cached by prepare()."""
    err, prepared = [None], None
    if cfg["rank"] == 0:
        try:
            with disk_full(cfg["data_dir"], "run the same command again"):
                prepared = prepare()
        except (UsageError, DataError) as e:
            err = [e]
    if cfg["world_size"] > 1:
        _torch().distributed.broadcast_object_list(err, src=0)  # in place: rank 0's error, or None
    if err[0]:
        raise err[0]
    return prepared or prepare()


JOIN_TIMEOUT = 300.0  # seconds torchrun's processes have to meet: started together, they meet within seconds
JOIN_QUIET = 3.0  # seconds of waiting before a line says what for


def meet(cfg):
    """torchrun's rendezvous (the store at MASTER_ADDR:MASTER_PORT, or torchrun's own) -> its store. It waits in
    C++, deaf to signals, so in a thread while this one waits for it: a stop (STOPS) ends the wait, the thread is left
    behind (a daemon). After JOIN_QUIET seconds a line says what it waits for; after JOIN_TIMEOUT one sentence says
    what never came (an environment set by hand, whose other processes never start, waited 6 hours for them)."""
    dist, met = _torch().distributed, []

    def rendezvous():
        try:
            met.append(next(dist.rendezvous("env://", cfg["rank"], cfg["world_size"],
                                            timeout=datetime.timedelta(seconds=JOIN_TIMEOUT)))[0])
        except Exception as e:  # RuntimeError's kinds: a timeout, a port in use, an address that does not resolve
            met.append(e)
    waiting = threading.Thread(target=rendezvous, daemon=True)
    waiting.start()
    waiting.join(JOIN_QUIET)
    where, n = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", cfg["world_size"]
    if waiting.is_alive():
        log(f"waiting for {n - 1} more process{'es' if n > 2 else ''} of WORLD_SIZE={n} at {where} (torchrun starts "
            f"them; Ctrl-C to stop; up to {JOIN_TIMEOUT / 60:g} minutes)")
    waiting.join()
    if isinstance(met[0], Exception):
        raise UsageError(f"the {n} processes of WORLD_SIZE={n} did not all meet at {where} ({error_line(met[0])}); "
                         f"launch them with torchrun, or unset {', '.join(TORCHRUN_VARS)}.")
    return met[0]


@contextlib.contextmanager
def process_group(cfg):
    """torchrun's processes join one group (nccl on GPUs, gloo on CPUs); a lone process skips this."""
    if cfg["world_size"] == 1:
        yield
        return
    torch, cuda = _torch(), cfg["device"].startswith("cuda")
    if cuda:
        torch.cuda.set_device(cfg["device"])
    store, backend = meet(cfg), "nccl" if cuda else "gloo"
    # once met, a generous timeout: the others wait while rank 0 may spend hours downloading and tokenizing
    hours = datetime.timedelta(hours=6)
    store.set_timeout(hours)
    store = torch.distributed.PrefixStore("default_pg", store)  # as init_process_group does with the store it makes
    torch.distributed.init_process_group(backend, store=store, rank=cfg["rank"], world_size=cfg["world_size"],
                                         timeout=hours)
    try:
        yield
        torch.distributed.barrier()  # leave together: a rank that tears gloo down while a peer still works can abort it
    finally:
        torch.distributed.destroy_process_group()
