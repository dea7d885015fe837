"""
Run safety: what keeps a user's files whole. Optional reading; the lecture files call it at
their boundaries. It imports nothing heavy, so every file can use it.

- atomic_file: write a whole file or nothing.
"""

import contextlib
import os
import stat


def _not_a_file(path):
    """What path is when it exists but is not a regular file (a directory, a FIFO, a device
    such as /dev/null, a symlink loop), or "" when it is a file or does not exist yet."""
    if not os.path.lexists(path) or os.path.isfile(path):
        return ""
    mode = os.stat(path).st_mode if os.path.exists(path) else 0
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if mode and test(mode)), "a symlink loop")


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """Write a whole file or nothing: a temporary file replaces path by a rename only if the
    block ends cleanly. The project's one atomic write (bpe, data, train and kernels import it).

    A symlink is written through (its target is replaced, the link stays). A path that is not
    a regular file is refused: renaming over /dev/null would replace the device itself."""
    path = os.path.realpath(path)
    kind = _not_a_file(path)
    if kind:
        raise ValueError(f"{path} is {kind}, not a regular file: give the path of a file to write")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" file
        os.replace(tmp, path)
    except OSError as e:          # a full disk fails f.write, which names no file: name path
        if e.filename in (None, tmp):
            e.filename = path
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
