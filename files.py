"""
Files: every file the project writes is whole or absent, and what it reads is checked as it is read. Optional
reading; the standard library only, below everything but cli.py.

1. Reading: what a path is (a file, a FIFO, a device), strict JSON, reads that notice a file cut short
2. Writing whole files: a temporary beside the file, renamed onto it only when complete (atomic_file), several
   files at once (atomic_files); what a killed writer left is cleared
3. Folders: made and unmade on a failure, and the one lock (dir_lock) that makes writers of a folder take turns
"""
import collections
import contextlib
import errno
import hashlib
import io
import itertools
import json
import os
import re
import shlex
import stat
import struct
from pathlib import Path

from cli import DataError, UsageError, os_error_in, say, short_repr


# ----------------------------------------------------------------------------
# 1. Reading: what a path is, strict JSON, reads that notice a file cut short

def not_a_file(path):
    """What path is if not a file: "a directory", "a FIFO", "a socket", "a device" (/dev/null), "a symlink loop",
    "a dangling link" (a write through it would make a file where it points, unasked), a kernel's pseudo-file (of
    /proc or /sys: its stated size, 0 or 4096, is not its length, and every reader here reads the size the system
    states); "" for a file or nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "a symlink loop" if e.errno == errno.ELOOP else "a dangling link" if os.path.islink(path) else ""
    if stat.S_ISREG(mode) and (top := os.path.realpath(path).split(os.sep)[1:2]) in (["proc"], ["sys"]):
        return f"a pseudo-file of /{top[0]}"
    kinds = [(stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")]
    return next((name for is_kind, name in kinds if is_kind(mode)), "a device")


PACKED = {  # the first bytes of a compressed file (not UTF-8 text) -> what it is, the tool that unpacks it, its suffix
    b"\x1f\x8b": ("gzip-compressed", "gunzip", ".gz"),  # owt's owt_train.txt.gz, as the course hands it out
    b"BZh": ("bzip2-compressed", "bunzip2", ".bz2"),
    b"\xfd7zXZ\x00": ("xz-compressed", "unxz", ".xz"),
    b"\x28\xb5\x2f\xfd": ("zstd-compressed", "unzstd", ".zst"),
}  # (not zip's: np.savez's .npz and torch.save's .pt are zips of ids, for which "pass a .npy" is the advice)


def packed(path, head):
    """A text file that is compressed, in words naming the command that unpacks it, or "": head holds its first bytes.
    Where a text file fails to decode, this is said instead of "re-save it as UTF-8", which a .gz cannot be. The tools
    unpack x.gz into x in place (-k keeps x.gz); a name without the suffix they refuse, so it is unpacked by -c."""
    head = bytes(head[:8])  # a numpy array of bytes (the engine's reads) compares element by element
    kind, tool, suffix = next((how for magic, how in PACKED.items() if head.startswith(magic)), ("", "", ""))
    name = Path(path)
    unpack = (f"{tool} -k {shlex.quote(str(path))}" if name.suffix.lower() == suffix else
              f"{tool} -c {shlex.quote(str(path))} > {shlex.quote(str(name.with_name(name.stem + '.unpacked.txt')))}")
    return kind and f"{path} is {kind}, not text; unpack it ({unpack})"


def is_ids(source):  # --data PATH.npy, in any case (IDS.NPY too), holds token ids; anything else is text
    return Path(source).suffix.lower() == ".npy"


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


def same_folder(a, b):
    """Do a and b, folders as typed or as a run's config recorded them (--tokenizer, --init-from), name one, by any
    spelling (a link, "../x")? One gone since (moved, deleted) is compared by its resolved path: a recorded path still
    names itself, where samefile would need it there. None or "" names no folder: False."""
    a, b = (os.fspath(p) if isinstance(p, (str, os.PathLike)) else "" for p in (a, b))
    return bool(a and b) and (same_file(a, b) or Path(a).resolve() == Path(b).resolve())


def file_sha256(path):  # a small file's SHA-256 in hex: a tokenizer's file, a download against a published one
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def unreadable(path):  # why path cannot be read as a file, as words that follow it, or "" if it can
    if kind := not_a_file(path):  # a FIFO or /dev/zero would be read forever
        return f" is {kind}, not a file"
    if not os.path.isfile(path):
        return ": no such file"
    return "" if os.access(path, os.R_OK) else " is not readable (permission denied)"


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


def zip_end(f, start, piece=1 << 20):
    """Where the zip file that begins at byte `start` of the binary file object f ends, or None: after its first end
    record (PK 5 6) whose central directory (a zip64 one's, as torch.save writes it) ends where that directory's own
    end record begins. zipfile reads the last zip in f instead: another checkpoint's, where two were saved in turn.
    The directory's offsets are from the zip's first byte, so a match by chance in a tensor's bytes is all but nil."""
    def read_at(at, n):
        f.seek(start + at)
        return f.read(n)

    for at in itertools.count(0, piece):
        if len(chunk := read_at(at, piece + 21)) < 22:
            return None
        for found in re.finditer(rb"PK\x05\x06", chunk[:piece + 3]):
            end, record = at + found.start(), chunk[found.start():found.start() + 22]  # the end record, in the zip
            if len(record) < 22:  # cut short
                continue
            size, offset, comment = struct.unpack("<2LH", record[12:])
            end_of_dir = end
            if end >= 20 and read_at(end - 20, 4) == b"PK\x06\x07":  # zip64's locator, naming zip64's end record
                end_of_dir = struct.unpack("<Q", read_at(end - 12, 8))[0]
                if len(zip64 := read_at(end_of_dir, 56)) < 56 or zip64[:4] != b"PK\x06\x06":
                    continue
                size, offset = struct.unpack("<2Q", zip64[40:])
            if offset + size == end_of_dir:
                return start + end + 22 + comment


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


# ----------------------------------------------------------------------------
# 2. Writing whole files: temporaries and the atomic write

TMP_MARK = ".cs336tmp"  # temporaries are ".NAME.cs336tmpPID" (temporary_path): a pattern no one else uses, so that
# clearing what a killed writer left deletes only files this project named
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits in bytes: one name in a path, a whole path
TMP_ROOM = len(f".{TMP_MARK}4194304")  # what a temporary adds to its file's name (Linux's largest pid has 7 digits)


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


def long_name(path):  # the bytes of path's name if its temporary's name would pass NAME_MAX (ENAMETOOLONG), else 0
    n = len(os.fsencode(os.path.basename(path)))
    return n if n > NAME_MAX - TMP_ROOM else 0


def unwritable(path, folders=True):
    """Why no file can be written at path, as words that follow it (" is a FIFO"), or "": what is not a regular
    file (renaming over /dev/null would replace the device itself; a dangling link), a file this user may not write
    (chmod 444 says keep it: a rename would replace it, with another mode), or (folders) a folder that cannot be made
    or written where the file goes. A command asks it of each file it writes before its work."""
    if kind := not_a_file(path):
        return f" is {kind}"
    if os.fspath(path).endswith(("/", os.sep)):  # a folder's path: "ids.npy/" would write the file ids.npy
        return " ends in a slash (a folder's path)"
    if n := long_name(path):  # ENAMETOOLONG, after the work
        return f" has a name of {n:,} bytes, too long for the file system (at most {NAME_MAX - TMP_ROOM} here)"
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.access(real, os.W_OK):
        return " is not writable by this user (read-only, or another user's)"
    # the target's folder takes the temporary and the rename; the path's own only matters while it is no folder (a
    # dangling link to one): a symlink in a read-only folder to a writable place is written through
    here = os.path.dirname(os.path.abspath(path))
    if folders and not all(map(writable, {os.path.dirname(real), *(() if os.path.isdir(here) else (here,))})):
        return " is in a folder that cannot be made or written (read-only, a file on its path, or a dangling link)"
    return ""


def replace_target(path):
    """(the file a write to path replaces, its temporary beside it): a symlink is written through (its target is
    replaced, the link stays). What unwritable names is refused: a ValueError, or the PermissionError a write in
    place would meet for a read-only file; a folder's fault is left to the system's own error, which says why."""
    if not os.fspath(path):  # '' is the current folder to the system: its whole write failed at the rename
        raise ValueError("the path of the file to write is empty: give one")
    if long_name(path):  # the system's own error, as the write itself would meet it
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), path)
    if why := unwritable(path, folders=False):
        raise (PermissionError(errno.EACCES, f"Permission denied (it{why})", path) if "not writable" in why else
               ValueError(f"{path}{why}, not a regular file: give the path of a file to write"))
    path = os.path.realpath(path)
    return path, temporary_path(path)


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """Write a whole file or nothing: a temporary file replaces path (replace_target's) by a rename only
    if the block ends cleanly. A file object already open (a buffer, stdout) is written as it is."""
    if not isinstance(path, (str, os.PathLike)):
        if "b" in mode and isinstance(path, io.TextIOBase):  # torch.save said "write() argument must be str"
            raise ValueError("the file object to write bytes to is open in text mode: open it with 'wb'")
        yield path
        return
    path, tmp = replace_target(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": ""})) as f:  # "\n" as is
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" file
        os.replace(tmp, path)
    except Exception as e:  # a full disk fails f.write, which names no file: name path (torch.save wraps that OSError)
        cause = os_error_in(e)
        if cause is not None and cause.errno is not None and cause.filename in (None, tmp):  # (gzip's BadGzipFile
            cause.filename = path                                                            # has no errno)
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(obj, path):  # a JSON file whole (atomic_file), indented for a reader, UTF-8 as it is
    with atomic_file(path) as f:  # a lone surrogate (a file name that is not UTF-8) as its JSON escape, \udce9
        f.write((json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace"))


def copy_file(src, dst):  # src's bytes as dst, whole or not at all
    with atomic_file(dst) as f:
        f.write(Path(src).read_bytes())


def rename_synced(tmp, path):
    """tmp renamed onto path once its bytes are on disk (fsync): a power cut between the two never leaves path empty
    or short under its final name (atomic_file does the same for what it writes)."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_line(path, line):
    """One line added to a log (metrics.jsonl): a line cut short by a stop is dropped by its reader. A full disk
    fails the write or the close, which name no file: the error names path (not stdout's, nor only its folder)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as e:
        e.filename = e.filename or os.fspath(path)
        raise


@contextlib.contextmanager
def atomic_files(paths):
    """Several files whole, and none replaced before all are written: yields a temporary path for each
    (replace_target's) for any writer to fill, atomic_file included; only if the block ends cleanly are
    they renamed onto their files, in order, else removed. Only a stop between two renames mixes old and new."""
    real, tmps = zip(*map(replace_target, paths))  # every path refused or accepted before a byte is written
    if twice := next((p for p, r in zip(paths, real) if real.count(r) > 1), None):  # the last write would win
        raise ValueError(f"{twice} and another of the files to write are one file (the same path, or a symlink); "
                         "make them separate")
    try:
        yield list(tmps)
        for tmp, path in zip(tmps, real):
            os.replace(tmp, path)
    except Exception as e:  # a full disk names the temporary a writer filled: name its file (wrapped, too)
        if (cause := os_error_in(e)) is not None and cause.filename in tmps:
            cause.filename = real[tmps.index(cause.filename)]
        raise
    finally:
        for tmp in filter(os.path.exists, tmps):
            os.remove(tmp)


# ----------------------------------------------------------------------------
# 3. Folders: made and unmade, and the one lock

def lock_holder(path):
    """The PID holding an flock on path, read from /proc/locks (Linux) by the file's device and inode, or None.
    A line there reads "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2146836 0 EOF" (PID, then major:minor:inode)."""
    if not hasattr(os, "major"):  # Windows: no device numbers, and no /proc/locks to read them in
        return None
    st = os.stat(path)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with contextlib.suppress(OSError), open("/proc/locks") as f:  # a waiter's line: "1: -> FLOCK ...", r[1] "->"
        return next((int(r[4]) for r in map(str.split, f) if len(r) > 5 and r[1] == "FLOCK" and r[5] == where), None)
    return None  # no /proc/locks (not Linux): the sentence says "another process"


@contextlib.contextmanager
def new_folders(path):
    """mkdir -p path; on an error (offline, Ctrl-C) the folders it made that are still empty go again: a failed
    download, or a run stopped before its first checkpoint, leaves nothing behind, while a folder holding a .part
    (what a rerun resumes) or a user's file stays."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not p.exists()]  # the deepest first, as rmdir needs
    try:
        path.mkdir(parents=True, exist_ok=True)  # (a full disk may stop it midway)
        yield
    except BaseException:
        for p in made:
            with contextlib.suppress(OSError):  # not empty: kept, and so is every folder above it
                p.rmdir()
        raise


def holder(pid):  # who holds a lock, for a sentence (pid None: not known)
    return f"process {pid}" if pid else "another process"


class Busy(UsageError):  # dir_lock(path) found it locked by another process, pid: exit 2; then: the advice's end
    def __init__(self, path, pid, then="then run the same command again"):
        super().__init__(f"{path} is in use by {holder(pid)}; wait for it to end (or stop it), {then}.")
        self.pid = pid


@contextlib.contextmanager
def dir_lock(path, waiting=None):
    """One process at a time in the folder path: an exclusive flock on it while the block runs. The kernel drops it
    when its process dies (even by SIGKILL), so it is never stale. Where another process holds it: waiting=None
    raises Busy at once; a string waits for it, first saying "waiting for process N, <waiting>" unless it is "".
    Where the system has no flock (Windows, a file system without locks): the block runs unlocked."""
    try:
        import fcntl  # Unix only
    except ImportError:
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        _flock(fcntl, fd, path, waiting)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _flock(fcntl, fd, path, waiting):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = lock_holder(path)
        if waiting is None:
            raise Busy(path, pid) from None
        if waiting:
            say(f"waiting for {holder(pid)}, {waiting}")
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks (some NFS); anything else is an error
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
