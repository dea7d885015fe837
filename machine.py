"""
The machine: what a run may use of it (cores, memory, a GPU, a compiler, torchrun's other processes), and the
global settings of torch and the C library that make a CPU run fast and bitwise reproducible. Optional reading.
It loads torch only when a function asks for it (_torch): the tokenizer, which uses the cores and the memory, starts
without it.

1. Cores, memory and numba's cache
2. A run's torch and C-library settings
3. Devices and the compiler
4. torchrun's processes: the environment checked, rank 0 first, the rendezvous, the process group
"""
import atexit
import contextlib
import ctypes
import datetime
import functools
import importlib
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from cli import (TORCHRUN_VARS, DataError, UsageError, disk_full, env_int, error_line, log, log_alone,
                 os_error_sentence, quiet_stderr, short_repr)
from files import writable


# ----------------------------------------------------------------------------
# 1. Cores, memory and numba's cache

def _torch():  # imported here, not at the top: the tokenizer imports this file and must not load torch
    import torch
    return torch


def usable_cores():  # the cores this process may run on (taskset's, a Slurm job's share), not all the machine's
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def job_slots(jobs):
    """The environment of each of `jobs` processes that run at once: one GPU each (CUDA_VISIBLE_DEVICES) where there
    are several, else a fair share of the cores each (torch reads OMP_NUM_THREADS)."""
    torch = _torch()
    if torch.cuda.device_count() > 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        return [{"CUDA_VISIBLE_DEVICES": g} for g in gpus]
    threads = max(1, usable_cores() // jobs)  # one process alone: torch's own choice (or the user's)
    return [{"OMP_NUM_THREADS": str(threads)}] * jobs if jobs > 1 else [{}]


def memory_bytes(device, world_size):
    """(bytes one process may use, what they are): a GPU's own memory (its properties: mem_get_info would open
    a CUDA context on cuda:0 in every torchrun process), or the RAM (or cgroup limit) a CPU run's processes share."""
    if device.startswith("cuda"):
        gpu = _torch().cuda.get_device_properties(_torch().device(device).index or 0)
        return gpu.total_memory, f"the {gpu.name}'s memory"
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf: no limit known, none checked
        return float("inf"), "this machine's memory (unknown here)"
    limit = cgroup_memory_limit()
    what = "this machine's memory" if limit is None or limit >= ram else "the memory limit of this job's cgroup"
    return min(ram, limit or ram) // world_size, what + (f" / {world_size} processes" if world_size > 1 else "")


def cache_bytes(device="cpu"):
    """The largest cache in front of memory: a GPU's L2 (50 MB where torch does not say), or the largest CPU cache,
    as Linux reports it (64 MB, more than most, where it does not)."""
    if device == "cuda":
        return getattr(_torch().cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = f.read_text().strip()
            sizes.append(int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]] if text[-1] in "KMG" else int(text))
    return max(sizes, default=64 << 20)


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


def numba_cache_fallback(source_dir):
    """Before numba loads: where it can keep compiled code neither beside the source (a read-only checkout) nor in
    the user's cache (no writable home), a folder of this user's in the temporary directory instead; numba would
    refuse to load the file."""
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "numba"
    if not os.environ.get("NUMBA_CACHE_DIR") and not any(map(writable, (Path(source_dir) / "__pycache__", user_cache))):
        os.environ["NUMBA_CACHE_DIR"] = _private_folder(Path(tempfile.gettempdir(), f"numba-cache-{os.getuid()}"))


def _not_private(path):
    """Why the folder at path may not hold code this user runs, or "". numba reads its cache's index with pickle, so
    a folder that another user made first (its name is predictable, in a temporary directory all may write) or may
    write into would run their code as this user (CWE-377)."""
    st = os.lstat(path)  # not stat: a symlink is judged as itself, not as the folder it points to
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "a symlink" if stat.S_ISLNK(st.st_mode) else "not a folder"
    if st.st_uid != os.getuid():
        return f"owned by another user (uid {st.st_uid})"
    return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o022 else ""


def _private_folder(path):
    """path, made readable and writable by this user only if it is new, and used if it is this user's own and
    private; else a new private folder of a name no one can guess, removed as this process ends (numba compiles
    again in each run, so a line says why and what to do)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if not (why := _not_private(path)):
        return str(path)
    new, owner = tempfile.mkdtemp(prefix=f"{path.name}-"), os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(new, ignore_errors=True))  # not a forked worker's
    log(f"numba's cache: {path} is {why}, where another user could plant code, so this run compiles into {new} "
        f"instead; delete {path}, or set NUMBA_CACHE_DIR to a folder only you can write.", file=sys.stderr)
    return new


# ----------------------------------------------------------------------------
# 2. A run's torch and C-library settings

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt options (malloc.h)


def die_with_parent():  # a child's preexec_fn (Linux): its parent's end, even by SIGKILL, sends it SIGTERM
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def keep_freed_memory():
    """glibc hands a freed block of 128 KB or more back to the kernel, so a training step's next allocation of
    that size takes a page fault for each of its 4 KB pages, time spent in the kernel (docs/results.md counts the
    faults saved). From here on, blocks up to 32 MB (glibc's limit) come from the heap, and up to 1 GB of its freed
    top is kept for the next step. Both together: the trim setting alone switches off glibc's own adaptation, and every
    block is mapped anew. Process-wide (a second call changes nothing); False where the C library has no such
    switch (macOS, musl, Windows)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 1 << 30))


def deterministic_mode(on, compiles):
    """torch.use_deterministic_algorithms(on). Since torch 2.6 that also sets the compiler's switch of the name, and
    imports the compiler to set it (torch._dynamo, sympy: a second or two of each command's start); a run that does
    not compile has nothing that reads it, so there the switch is set alone, unless the compiler is loaded anyway."""
    if compiles or "torch._inductor.config" in sys.modules:
        _torch().use_deterministic_algorithms(on)
    else:
        _torch()._C._set_deterministic_algorithms(on)


@contextlib.contextmanager
def torch_settings(cfg):
    """PyTorch's global switches for a run, restored afterwards (tests run many in one process)."""
    torch = _torch()
    filling = torch.utils.deterministic  # its switch: deterministic mode fills each new tensor with NaN
    was = (torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
           filling.fill_uninitialized_memory)
    # bitwise-reproducible CPU runs (what makes a resumed run identical): the embedding's backward (an index_put
    # with accumulate) otherwise adds rows in a thread-dependent order. A GPU's float32 matmuls run TF32
    compiles = cfg.get("compile", True)  # a test's settings of a device alone: as if it compiled
    deterministic_mode(cfg["device"] == "cpu" or was[0], compiles)
    # The NaN fill guards against a kernel that reads memory it never wrote; none here does (the resume tests
    # compare bits), and it is one more pass over every new tensor: a CPU step's matmul outputs, attention's buffers
    filling.fill_uninitialized_memory = was[2] and cfg["device"] != "cpu"
    torch.set_float32_matmul_precision("high" if cfg["device"].startswith("cuda") else was[1])
    # numpy before 2.0 measures its float types' limits at their first use, and warns (four lines on stderr) when
    # subnormals are flushed by then (below): measured first, they are kept
    if cfg["device"] == "cpu":
        for dtype in (np.float16, np.float32, np.float64):
            np.finfo(dtype)
    # A CPU computes with subnormal floats (below 2^-126: the attention probabilities of a run at too high a rate)
    # many times slower, so they are flushed to zero. torch's worker threads inherit the switch when they start
    # after it, as a training run's do: its first parallel work is the run's
    flush = cfg["device"] == "cpu" and torch.set_flush_denormal(True)  # False where the CPU cannot (not x86)
    if cfg["device"] == "cpu":  # not undone afterwards: it changes only when freed memory goes back to the kernel
        keep_freed_memory()
    try:
        yield
    finally:
        deterministic_mode(was[0], compiles)
        torch.set_float32_matmul_precision(was[1])
        filling.fill_uninitialized_memory = was[2]
        if flush:
            torch.set_flush_denormal(False)


@contextlib.contextmanager
def one_thread_on_a_cpu(device, threads):
    """One thread on a CPU unless threads is true (a thread count asked for, or cores that no other work holds): a
    parallel op waits at its end for all its threads, and on a busy machine one of them waits for its core
    on every call, a scheduler's slice (milliseconds) that no size changes: small sizes would time that wait, not the
    memory. One thread's bandwidth is the limit."""
    torch = _torch()
    before = torch.get_num_threads()
    if device == "cpu" and not threads:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------
# 3. Devices and the compiler

def run_device(device):
    """--device as the run names it: None is cuda when there is one, else cpu; "cpu:N" is "cpu", as torch treats it
    (its tensors are on "cpu"), so that a CPU run's settings (torch_settings) apply to it too."""
    torch = _torch()
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    with contextlib.suppress(RuntimeError):  # one that does not parse is device_error's to refuse
        return "cpu" if torch.device(device).type == "cpu" else device
    return device


def synchronizer(device):  # drains a GPU's queue at a timing's edges; a CPU has none to wait for
    return _torch().cuda.synchronize if str(device).startswith("cuda") else (lambda: None)


def device_error(device, cpu="--device cpu"):  # why torch cannot use --device, or "": "cpu:abc" does not parse, "cuda:3"
    # of 2 GPUs; cpu: how the caller asks for the CPU (train.load_run: device="cpu")
    torch = _torch()
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):  # TypeError: None or a float, which load_run(path, device) may be given
        d = torch.device("meta")  # not one of ours either
    if d.type not in ("cpu", "cuda", "mps"):
        return "unknown device; use cpu, cuda, cuda:N or mps."
    if d.type == "cuda" and not torch.cuda.is_available():
        return f"this PyTorch sees no CUDA GPU; use {cpu}."
    if d.type == "cuda" and (d.index or 0) >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}."
    if d.type == "mps" and not torch.backends.mps.is_available():
        return f"MPS is not available here; use {cpu}."
    return ""


def quiet_cuda_home():
    """CUDA torch on a machine without a GPU but with nvcc warns, on its first compile, "No CUDA runtime is found,
    using CUDA_HOME": nothing to act on. Its other warnings (a compiler torch was not built with) stay on a GPU."""
    if not _torch().cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # torch 2.6 on: a logged warning
        with quiet_stderr():  # torch 2.5: printed once, as the module is imported
            importlib.import_module("torch.utils.cpp_extension")


def allow_many_compiles(limit=256):
    """For a process that compiles many variants of one function (models of several shapes or switches, a closure
    over several constants): past dynamo's 8 graphs a function it runs the rest eagerly, with one warning, so what
    was meant to be measured or checked compiled would be eager code. The limit raised, and where torch can (2.6
    on), reaching it raises instead."""
    import torch._dynamo.config as dynamo  # cache_size_limit: torch 2.5's name of recompile_limit, which later keep
    dynamo.cache_size_limit = max(dynamo.cache_size_limit, limit)
    if hasattr(dynamo, "fail_on_cache_limit_hit"):
        dynamo.fail_on_cache_limit_hit = True


@functools.cache
def compile_error(device):
    """Why torch.compile (inductor, as --compile runs it) cannot compile on device, in one line, or "": a trivial
    function, once per process, before anything is written (no C++ compiler for a CPU, nor for Triton's launcher)."""
    torch = _torch()
    quiet_cuda_home()
    on_it = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()
    try:
        with on_it:  # that GPU only: a torchrun process touches no other one (cuda:0 would get a context from each)
            torch.compile(lambda x: x + 1)(torch.ones(2, device=device))
    except Exception as e:  # compilers fail in many ways, all meaning "not on this machine"
        return error_line(e)
    return ""


def cuda_unavailable_reason():
    """On a CUDA machine: None if load_inline can build a CUDA extension here, else one sentence why not."""
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    if not cpp_extension.is_ninja_available():
        return "ninja not found, which load_inline needs (pip install ninja)"
    return None


@functools.cache  # measured once per process and dtype
def measure_matmul_flops(dtype):
    """Best FLOP/s of a (1024, 1024) @ (1024, 1024) matmul on the CPU, over about half a second of repeats."""
    a, b = _torch().randn(2, 1024, 1024, dtype=dtype)
    a @ b  # warm-up: thread pool, caches
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < 0.5:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * 1024**3 / (time.perf_counter() - t0))
    return best


# ----------------------------------------------------------------------------
# 4. torchrun's processes

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


def rank0_verdict(cfg, err):
    """Rank 0's error (or None) raised in every process: under torchrun the others wait here for it, so that one
    sentence stops all of them, and none goes on past a check only rank 0 made."""
    err = [err]
    if cfg["world_size"] > 1:
        _torch().distributed.broadcast_object_list(err, src=0)  # in place: rank 0's error, or None
    if err[0]:
        raise err[0]


def rank0_first(cfg, prepare):
    """prepare() on rank 0 first (a full disk under --data-dir is one sentence); under torchrun the others
    wait for its verdict (rank0_verdict), then open what it cached by prepare()."""
    err, prepared = None, None
    if cfg["rank"] == 0:
        try:
            with disk_full(cfg["data_dir"], "run the same command again"):
                prepared = prepare()
        except (UsageError, DataError) as e:
            err = e
        except OSError as e:  # (a file size limit): one sentence, which every process stops with
            err = DataError(os_error_sentence(e))
    rank0_verdict(cfg, err)
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
        log_alone(f"waiting for {n - 1} more process{'es' if n > 2 else ''} of WORLD_SIZE={n} at {where} (torchrun "
                  f"starts them; Ctrl-C to stop; up to {JOIN_TIMEOUT / 60:g} minutes)")
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
    # DDP imports torch.distributed.nn, whose functions take the group that exists at that import as their default
    # argument, holding it for ever: imported before the group exists, destroy_process_group frees the group and joins
    # its threads. Held, a gloo thread could free the last collective's tensors as Python exits: "terminate called"
    import torch.distributed.nn  # noqa: F401
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
