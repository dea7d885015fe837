"""
Run safety: what keeps a user's files whole. Optional reading; the lecture files call it at
their boundaries. It imports nothing heavy, so every file can use it.

- atomic_file: write a whole file or nothing.
"""

import contextlib
import os


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """Write a whole file or nothing: a temporary file replaces path by a rename only if the
    block ends cleanly. The project's one atomic write (bpe, data, train and kernels import it)."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" file
        os.replace(tmp, path)
    except OSError as e:          # a full disk fails f.write, which names no file: name path
        if e.filename in (None, tmp):
            e.filename = os.fspath(path)
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
