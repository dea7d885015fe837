"""
The command line: what every command of the project says, and how it ends. Optional reading, and the lowest file:
it imports only the standard library (a tokenizer's command starts without torch) and names none of its callers.

1. Printing: say() is the one way to print; log() is say() for rank 0 only, so torchrun's N processes tell one
   story; a terminal that closes (SIGHUP), a pipe whose reader leaves, a Ctrl-C while torch loads
2. Errors: a user's mistake (UsageError, exit 2) or the machine's fault (DataError, exit 1) is one sentence;
   a stop (Ctrl-C, SIGTERM, SIGHUP) is a KeyboardInterrupt, held while numba's compiler runs (catch_ctrl_c);
   exit_code is the one map from a fault to an exit code, for every command
3. Progress lines and the ETA
4. The parser: argparse, whose mistakes are one sentence and exit code 2; lines read from stdin
"""
import argparse
import atexit
import contextlib
import errno
import functools
import os
import re
import reprlib
import select
import signal
import statistics
import sys
import threading
import time
import traceback


# ----------------------------------------------------------------------------
# 1. Printing: one way, and under torchrun only rank 0 talks

TORCHRUN_VARS = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0}  # torchrun sets them (with MASTER_ADDR, MASTER_PORT)


def env_int(name, default=None):  # an environment variable as a whole number, default (a torchrun variable's own)
    # when unset, None when it is not one; at most 18 digits: int() refuses 4,300 and more
    text = os.environ.get(name, str(TORCHRUN_VARS[name] if default is None else default)).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


RANK = env_int("RANK") or 0  # this process's rank under torchrun (0 alone)
RANK = RANK if RANK < (env_int("WORLD_SIZE") or 1) else 0  # a RANK out of range is refused (CHECKS): rank 0 says so


SIGHUP = getattr(signal, "SIGHUP", None)  # a closed terminal or ssh session (none on Windows)


STOPS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, SIGHUP) if s)  # Ctrl-C, kill's or a scheduler's stop, SIGHUP


def on_stops(handler):
    """handler for each of STOPS; returns {signal: the handler it replaced}. A SIGHUP that nohup set to be ignored
    stays ignored: the user asked the run to outlive its terminal."""
    return {s: signal.signal(s, handler) for s in STOPS if s != SIGHUP or signal.getsignal(s) != signal.SIG_IGN}


def exit_quietly(code):
    """Ends the process with code once a command has said its last. A stop signal from here on is ignored, where it
    printed a traceback ("Exception ignored in atexit callback") or changed the exit code of a command that had ended
    well. The clean-up registered with atexit runs and stdout and stderr are flushed, as Python's own end does; the
    rest of that end, freeing every object of every module one by one, is skipped: nothing is left to write by then,
    and for torch's many modules it is a long wait after each command (docs/results.md). Where Python still has work
    to do (a thread that is not a daemon, a stream that cannot be flushed, a code that is not a number) it ends as it
    always did."""
    on_stops(signal.SIG_IGN)
    if not isinstance(code, int) or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                                        if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # Python's end says it (a closed pipe's exit code 120 with its "Exception ignored")
        sys.exit(code)
    os._exit(code)


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


_may_leave, _reader_gone = [], []  # inside reader_may_leave(); the reader of the output left there


@contextlib.contextmanager
def reader_may_leave():
    """Inside (a training loop), the reader of the output leaving (`| head`, `less` closed, a `tee` killed) is a
    request to stop, not an error: say() sends stdout to /dev/null, as for a SIGHUP, and what is still to say to
    stderr; reader_gone() turns true, so that the loop stops at its step boundary and saves its checkpoint."""
    _may_leave.append(True)
    try:
        yield
    finally:
        _may_leave.pop()


def reader_gone():
    return bool(_reader_gone)


_line_open = []  # the stream whose last words left their line open: a terminal's progress line, redrawn with "\r"


def say(*args, sep=" ", end="\n", file=None):  # print, at once; a terminal that is gone (EIO) is not an error
    file = file or (sys.stderr if _reader_gone else sys.stdout)  # stdout's reader gone: stderr may still be read
    text = sep.join(map(str, args)) + end
    if _line_open and not (_line_open[0] is file and text.startswith("\r")):  # not the progress line redrawn: the
        end_progress()  # words start below it, not after its 79 columns (a terminal wrapped an error mid-word)
    try:  # one write: print writes the text and its end apart, and a Ctrl-C between them joined the next line to it
        file.write(text)
        file.flush()
        if text:
            _line_open[:] = [] if text.endswith("\n") else [file]
    except OSError as e:
        if e.errno == errno.EPIPE and _may_leave:
            _reader_gone.append(True)
        elif e.errno != errno.EIO and not (e.errno == errno.EPIPE and _hung_up):
            # EPIPE alone: the reader left (`| head`), which exit_code ends quietly. A full disk: the stream is
            # named, so that disk_full does not blame a folder the command writes in
            if disk_is_full(e):
                e.filename = e.filename or ("stderr" if file is sys.stderr else "stdout")
            raise
        hang_up()  # EIO: a SIGHUP follows (or never comes: a job the shell let go on), and is handled there


def log(*args, **kwargs):  # only rank 0 talks, so that torchrun's N processes print one story
    if RANK == 0:
        say(*args, **kwargs)


TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ  # a worker torchrun started (a RANK set by hand has no rank 0 beside it)
RANK0_GRACE = 10  # seconds another rank of torchrun's waits before it says a mistake itself: rank 0 meets the same one


def ranked(line):  # a line as this process says it: a rank past 0 names itself
    return line if RANK == 0 else f"(rank {RANK}) {line}"


def log_alone(line, **kwargs):  # log, and a rank past 0 that torchrun did not start says it too (no rank 0 may speak)
    if RANK == 0 or not TORCHRUN:
        say(ranked(line), **kwargs)


def quiet_while_starting(name):
    """A Ctrl-C, a SIGTERM (kill, a scheduler's stop) or a SIGHUP (the terminal closed) while torch loads: one line,
    not an import's traceback. So is a NUMBA_NUM_THREADS numba cannot take (0 raised a ValueError in its import, a
    word printed its parse's traceback as a warning): one sentence, exit code 2."""
    if not env_int("NUMBA_NUM_THREADS", 1):  # None (a word, "", 20 digits) or 0
        def refuse():
            raise UsageError(f"the environment's NUMBA_NUM_THREADS={short_repr(os.environ['NUMBA_NUM_THREADS'])} is "
                             "not a number of threads 1, 2, ...; unset it, or set it to the cores numba may use.")
        exit_quietly(exit_code(name, refuse, "nothing was written."))

    def stop(signum, frame):
        if signum == SIGHUP:
            hang_up()
        log_alone(f"{name}: interrupted while starting; nothing was written.", file=sys.stderr)  # torchrun's: once
        os._exit(130)
    on_stops(stop)


def escaping_stdout():
    """A character the terminal cannot show (latin-1, ascii) printed as an escape, not an error. A stdout closed at
    the start (`>&-`, a daemon's) is /dev/null: Python leaves sys.stdout None there, and the first print raised."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")
    sys.stdout.reconfigure(errors="backslashreplace")


def end_quietly_on_closed_pipe():
    """For a script whose product is what it prints: `... | head` ends it as it ends cat, when the reader leaves, not
    with a BrokenPipeError traceback (a file it writes through atomic_file is whole or as it was; a command whose
    files are its product lets exit_code end it quietly instead, after its clean-up)."""
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


@contextlib.contextmanager
def quiet_stderr():
    """The C-level stderr (file descriptor 2) goes to /dev/null for a block: what a library prints there on its own
    (torch's profiler's start/stop notices) does not break a table on the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def reader_left():  # the reader of stdout left (`| head`): exit code 1, quietly (no traceback, as `cat` ends)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout as it exits
    return 1


# ----------------------------------------------------------------------------
# 2. Errors: one sentence each, and the one map from a fault to an exit code

class UsageError(Exception):  # a mistake in the flags or the inputs: the command prints it and exits with 2
    pass


class DataError(Exception):  # the run failed, not its flags (offline, disk full, a NaN, a killed worker): exit 1
    pass


_SHORT = reprlib.Repr()  # a value read from a file, for a sentence: long strings, long lists, deep nesting cut short
_SHORT.maxstring = _SHORT.maxother = 80
short_repr = _SHORT.repr


def disk_is_full(e):  # is e the error of a full disk, or of a user's exhausted quota?
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def error_chain(e):  # e, then each exception down its chain, as a traceback shows them (`from None` ends it)
    while e is not None:
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def os_error_in(e):
    """The OSError that e is, or that a library wrapped in e (torch.save's zip writer raises a RuntimeError,
    "unexpected pos", over the OSError of the write that failed), or None."""
    return next((c for c in error_chain(e) if isinstance(c, OSError)), None)


def disk_full_words(e, then, where=None):
    """A full disk's OSError as a sentence: the file its write names (atomic_file does), or else the folder being
    written (a library's writer may name none), or stdout (say()'s); then: what to do once there is room."""
    return (f"the disk is full: could not write {e.filename or (f'into {where}/' if where else 'stdout')}; free some "
            f"space, then {then}.")


def os_error_words(e):  # an OSError no check foresaw, for a sentence: the path and the system's reason
    return (f"{e.filename}: {e.strerror}; fix that path or pick another" if e.filename else
            f"the system said: {e}; fix that")


def os_error_sentence(e, then="run the same command again"):  # the one sentence of an OSError (exit 1)
    return disk_full_words(e, then) if disk_is_full(e) else f"{os_error_words(e)}, then {then}."


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


def interrupted_by_ctrl_c(e):  # a KeyboardInterrupt, or an exception raised while one was being handled
    while e is not None and not isinstance(e, KeyboardInterrupt):
        e = e.__context__
    return e is not None


def fault(name, words):
    """A machine's fault, in each process it meets: under torchrun a rank past 0 names itself (one GPU out of memory
    is that process's own); a usage mistake, which every rank meets, is exit_code's, rank 0's first."""
    say(ranked(f"{name}: error: {words}"), file=sys.stderr)


_ended = []  # exit_code's command has returned or raised


def command_ended():  # catch_ctrl_c's handler then ignores a stop, as exit_quietly does once the code is known
    return bool(_ended)


_ctrl_c_held = False  # a stop that came while numba's Python code ran (see catch_ctrl_c)


def raise_held_ctrl_c():
    """Raise the Ctrl-C (or SIGTERM) that catch_ctrl_c held back, if any: as a call returns, and before
    waiting on workers, which a SIGTERM to the whole process group has ended (the wait would hang)."""
    global _ctrl_c_held
    if _ctrl_c_held:
        _ctrl_c_held = False
        raise KeyboardInterrupt


def ctrl_c_stays_keyboard_interrupt(f):
    """f, where a Ctrl-C is still a KeyboardInterrupt: not the SystemError that numba makes of one
    that came while compiled code ran; one that catch_ctrl_c held back is raised as f returns."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except SystemError as e:
            if not any(isinstance(c, KeyboardInterrupt) for c in error_chain(e)):
                raise
            raise KeyboardInterrupt from None
        raise_held_ctrl_c()
        return result
    return wrapper


def catch_ctrl_c():
    """For a command line: Ctrl-C, SIGTERM (`kill`, job schedulers) and SIGHUP (a closed terminal) raise
    KeyboardInterrupt, except while numba's Python code (its compiler, its callbacks) runs, where it would be
    swallowed or break a compile: there it is held, and raised as the call that ran numba returns."""
    def interrupt(signum, frame):
        global _ctrl_c_held
        if signum == SIGHUP:  # the terminal is gone: the one line that follows must not fail to print
            hang_up()
            signal.signal(signum, signal.SIG_IGN)  # said once: the kernel and the shell may both send it
        if command_ended():  # its sentence is said or on its way (cli.exit_code): a traceback would follow it
            return
        if any(m in f.f_code.co_filename for f, _ in traceback.walk_stack(frame)
               for m in ("numba", "llvmlite")):
            _ctrl_c_held = True
            return
        raise KeyboardInterrupt
    on_stops(interrupt)


@contextlib.contextmanager
def ctrl_c_says(line):
    """A Ctrl-C in the block (or an error raised while one was handled) ends it with `line` on stderr, for a command
    that writes nothing: exit_code's words after a Ctrl-C say how to go on. The caller's exit code is then 130."""
    try:
        yield
    except (KeyboardInterrupt, Exception) as e:
        if not interrupted_by_ctrl_c(e):
            raise
        log(line, file=sys.stderr)


def exit_code(name, command, interrupted, less_memory=None, then="run the same command again"):
    """command()'s exit code; a fault is one sentence: 2 a usage mistake, 1 a machine's fault (memory running out
    too) or an unforeseen OSError, 130 a Ctrl-C. interrupted: what a stopped command left (the sentence's end);
    less_memory: the command's own ways to ask for less memory, for an allocation that failed; then: what to do once
    the path an OSError names is fixed."""
    _ended.clear()
    try:
        try:
            code = command()
        finally:  # what is left is the sentence and the clean-up: the failed command's objects freed after it say
            _ended.append(True)  # nothing of a stop signal (command_ended), where their finalizers printed a traceback
        if sys.stdout:  # what print left in its buffer fails here on a full disk, not as Python exits ("ignored")
            sys.stdout.flush()
        return code
    except (UsageError, DataError) as e:
        code = 2 if isinstance(e, UsageError) else 1
        if RANK and TORCHRUN:  # every rank meets the same mistake: rank 0 says it, and torchrun then stops this one
            on_stops(lambda signum, frame: os._exit(code))  # (exiting first, it let torchrun stop rank 0 unheard)
            time.sleep(RANK0_GRACE)  # still here: a mistake of this process's own
        say(ranked(f"{name}: error: {e}"), file=sys.stderr)
        return code
    except BrokenPipeError:
        return reader_left()
    except OSError as e:  # a full disk (stdout's too), or what no check foresaw (a directory under /proc): exit 1
        fault(name, os_error_sentence(e, then))
        return 1
    except (KeyboardInterrupt, Exception) as e:
        # a Ctrl-C before the loop's own handler (data, model), a second one in it, or the error a library's clean-up
        # raised in its place (torch.save's zip writer, cut short mid-file, says "unexpected pos")
        if interrupted_by_ctrl_c(e):
            log(f"{name}: interrupted; {interrupted}", file=sys.stderr)
            return 130
        if (asked := out_of_memory(e)) is not None:
            less = less_memory or f"ask for less (a smaller input, batch or model); {interrupted}"
            fault(name, f"out of memory{asked}; {less}")
            return 1
        if type(e).__name__ in ("DistBackendError", "DistNetworkError") or re.search("(closed|reset) by peer", str(e)):
            said = re.sub(r"\[[^\]]*/[^\]]*\] ", "", error_line(e))  # gloo's: "[/__w/.../pair.cc:537] Read error"
            said = said.split(". ")[0].rstrip(".")[:120]  # its first sentence: torch's advice follows
            log(f"{name}: error: another process of the job ended, or lost its connection ({said}); "
                f"its own sentence, if it had one, is above: fix that, then {interrupted}", file=sys.stderr)
            return 1
        if (cause := os_error_in(e)) is None:
            raise
        # a write that failed under a library's own error (torch.save's "unexpected pos" over EFBIG, a file-size
        # limit): the same sentence as the OSError itself
        fault(name, os_error_sentence(cause, then))
        return 1


@contextlib.contextmanager
def usage_errors():
    """A library's refusals as the command's mistakes: a ValueError, or an OSError the library raised itself (no
    errno: a missing input), is a UsageError (exit 2); a MemoryError with a sentence (refused before allocating,
    with what to change) a DataError (exit 1). The system's OSError (a read-only output) stays exit_code's."""
    try:
        yield
    except (ValueError, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        raise UsageError(str(e)) from None
    except MemoryError as e:
        if not str(e):
            raise
        raise DataError(str(e)) from None


SHOWN = 3  # refusals every_refusal lists


def every_refusal(call, items, noun):
    """call(item) for each item, then their UsageErrors as one that counts and numbers them (noun: what each item
    is): a user who meets several fixes them all at once, not one per attempt. One alone is raised as it was."""
    said = []
    for item in items:
        try:
            call(item)
        except UsageError as e:
            said.append(str(e))
    if len(said) > 1:  # the first few: 40 runs of other flags are one mistake, not 40 sentences to read
        more = f" ({len(said) - SHOWN} more, each refused alike)" if len(said) > SHOWN else ""
        raise UsageError(f"{counted(len(said), noun)} refused: " + " ".join(
            f"({i}) {s}" for i, s in enumerate(said[:SHOWN], 1)) + more)
    if said:
        raise UsageError(said[0])


@contextlib.contextmanager
def disk_full(where, then):
    """A full disk (or quota) while writing under `where` ends in one sentence that says what to do then, exit code
    1; atomic_file leaves what was there whole, and names its file (as append_line does; a library's writer may name
    none: then `where`). The OSError may come wrapped (torch.save's zip writer raises a RuntimeError)."""
    try:
        yield
    except Exception as e:
        if (cause := next((c for c in error_chain(e) if disk_is_full(c)), None)) is None:
            raise  # another OSError, wrapped or not: exit_code's sentence
        raise DataError(disk_full_words(cause, then, where)) from None


# ----------------------------------------------------------------------------
# 3. Progress lines and the ETA

def fmt_time(s):  # seconds -> "12m05s", "3h07m"; None (not known yet) -> "-"
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def counted(n, noun):  # "1 step", "2 steps", "1,400 steps", "2 processes": a count and its noun
    return f"{n:,} {noun}{'' if n == 1 else 'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


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


PROGRESS_EVERY = 10.0  # seconds between progress lines when stderr is a log file, not a terminal


def show_progress(text, shown, last=False):
    """Progress on stderr: a terminal redraws one line in place (end_progress ends it), a log file gets the first
    line, one each PROGRESS_EVERY seconds after `shown` (None: never shown) and the last. Returns when shown."""
    now, tty = time.monotonic(), sys.stderr.isatty()
    if tty or last or shown is None or now - shown >= PROGRESS_EVERY:
        say("\r" + text if tty else text, end="" if tty else "\n", file=sys.stderr)
        shown = now
    return shown


def end_progress():  # a terminal's progress line (stdout's or stderr's) ends; say ends it before other words too
    stream = _line_open.pop() if _line_open else None
    if stream in (sys.stdout, sys.stderr):  # not a stream since replaced (a test's capture, a closed pipe's)
        with contextlib.suppress(OSError):  # a terminal gone: the words that follow meet that themselves
            stream.write("\n")
            stream.flush()


# ----------------------------------------------------------------------------
# 4. The parser: argparse, whose mistakes are one sentence and exit code 2; lines read from stdin

def user_path(text):  # argparse's type of a path: ~ and ~user expanded, which a shell leaves in --out-dir=~/runs
    return os.path.expanduser(text)


def user_text(text):
    """argparse's type of a flag's text (--prompt): UTF-8 on every locale, as stdin_lines reads. A C locale hands Python
    the bytes of 'é' as two lone surrogates, which no tokenizer encodes: those bytes are read again as UTF-8."""
    if not re.search("[\ud800-\udfff]", text):  # the locale decoded it all (a latin-1 terminal's é too): as it is
        return text
    try:
        return os.fsencode(text).decode("utf-8")
    except UnicodeDecodeError as e:  # a shell's $'\xff'
        raise argparse.ArgumentTypeError(f"its bytes are not UTF-8 text ({e}); pass UTF-8 text") from None


class Parser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):  # kept for error(): the words argparse complains of
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):  # argparse's complaints end like ours: one sentence, exit code 2
        words = getattr(self, "_words", [])
        for flag, value in zip(words, words[1:]):  # `--prompt -x`: argparse takes -x for a flag, the flag for empty
            if flag.startswith("--") and value.startswith("-") and not value.startswith("--") and (
                    f"argument {flag}" in message or f"unrecognized arguments: {value}" in message):
                message += f"; a value that starts with '-' is written with '=': {flag}={value}"
                break
        raise UsageError(f"{message} (see python {self.prog} --help)")

    def _print_message(self, message, file=None):  # --help to a full disk: argparse dropped the error (exit 0)
        if message:
            say(message, end="", file=file or sys.stderr)


def stdin_lines(flag):
    """stdin's lines as they come, each without its line end (a CRLF file's too), read as UTF-8 on every locale. A
    UsageError naming flag where its bytes are not UTF-8 (a C or UTF-8 locale would pass them on as lone
    surrogates), or where it holds no line (the command would have done nothing, and said nothing)."""
    if hasattr(sys.stdin, "reconfigure"):  # a file or pipe's TextIOWrapper, before anything is read from it
        sys.stdin.reconfigure(encoding="utf-8-sig", errors="strict")  # -sig: a BOM (Notepad's) is no text
    read = 0
    try:
        for read, line in enumerate(sys.stdin, 1):
            yield line.removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as e:
        raise UsageError(f"{flag}: stdin is not UTF-8 text ({e}); pass UTF-8 text.") from None
    if not read:
        raise UsageError(f"{flag}: stdin held no line, so nothing was done; give it one line or more.")
