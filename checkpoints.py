"""
Checkpoint files: what save_checkpoint may write, and a checkpoint read back and verified before anything is loaded
from it. Optional reading: every command that saves or reads a checkpoint (training, --resume, --init-from,
--sample, export) goes through it.

1. What a checkpoint may hold: tensors and plain values, so that loading it cannot run code
2. Reading one: its zip's CRC-32s checked, from a path or a file object
3. Its RNG states, and the step count
4. Does it fit this model and optimizer: every entry and shape, before anything is loaded
"""
import collections
import contextlib
import io
import operator
import os
import zipfile

import torch

from files import not_a_file, zip_end


# ----------------------------------------------------------------------------
# 1. What a checkpoint may hold

_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Size, torch.dtype, torch.device)


def check_loadable(state):
    """ValueError naming the first value of save_checkpoint's dict that read_checkpoint's load would refuse: it loads
    tensors and plain values in dicts, lists, tuples and sets, never code. Exact types: a numpy float is no float."""
    def first(value, name):  # (where, type) or None
        if torch.is_tensor(value) or type(value) in _PLAIN:
            return None
        if type(value) not in (dict, list, tuple, set, collections.OrderedDict):  # numpy's RNG state, a Namespace
            return name, type(value)
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            if found := first(k, f"a key of {name}") or first(v, f"{name}[{k!r}]"):
                return found
        return None
    if bad := first(state, "the checkpoint"):
        raise ValueError(f"save_checkpoint: {bad[0]} is of type {bad[1].__module__}.{bad[1].__qualname__}, which "
                         "load_checkpoint refuses (it loads tensors and plain values, never code); pass plain values "
                         "(float(x), x.tolist(), vars(args)).")


# ----------------------------------------------------------------------------
# 2. Reading one

def read_checkpoint(src):
    """A checkpoint's dict from a path or a binary file object, or ValueError: torch.load checks none of the
    CRC-32s torch.save's zip keeps per record, so zipfile checks them first (a flipped byte in a weight is
    refused, not loaded); weights_only: tensors and plain values, so loading a file cannot run code."""
    is_path = isinstance(src, (str, os.PathLike))
    name = src if is_path else "the checkpoint"
    if isinstance(src, io.TextIOBase):
        raise ValueError("the checkpoint's file object is open in text mode: open it with 'rb'")
    try:  # a file object's checkpoint starts where it stands, as torch.load reads it; zipfile seeks in it
        start = None if is_path else src.tell()
    except OSError as e:  # a pipe
        raise ValueError(f"{name} is a stream that cannot seek ({e}); pass a file or a buffer") from None
    if start is not None:  # it ends where its zip does (zipfile would check the last of two saved in turn)
        f, end = src, zip_end(src, start)
        size = src.seek(0, io.SEEK_END)
        if start or end not in (None, size):  # torch 2.5 reads a zip only from a file's first byte: read a copy
            f.seek(start)
            if not (data := f.read(end - start if end else -1)):  # a buffer save_checkpoint just wrote, not rewound
                raise ValueError(f"{name} is read from where its file object stands, its end (byte {start}): "
                                 "seek(0) first")
            src = io.BytesIO(data)
    if is_path and (kind := not_a_file(src)):  # a FIFO would be read forever, a directory is an OSError
        raise ValueError(f"{src} is {kind}, not a checkpoint file")
    try:
        with zipfile.ZipFile(src) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as e:  # mid-file: where an earlier load_checkpoint left it
        where = f" from byte {start}, where its file object stands; seek(0) first if it starts at 0" if start else ""
        raise ValueError(f"{name} is not a torch.save zip file{where} ({e})") from None
    if bad is not None:
        raise ValueError(f"{name} is damaged: its record {bad} fails its CRC-32 check")
    if start is not None:  # a file object's checkpoint, or its copy, from its first byte
        src.seek(0)
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # e.g. a pickle that asks for code: refused by weights_only, which names its class
        if cls := str(e).partition("Unsupported global: GLOBAL ")[2].split(" ")[0]:  # a CS336 loop's args, np.int64
            raise ValueError(f"{name} holds a {cls}, and only tensors and plain values (numbers, str, lists, dicts) "
                             "load without running code; save it with plain values (int(it), vars(args))") from None
        raise ValueError(f"{name} cannot be loaded ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{name} holds a {type(state).__name__}, not a checkpoint's dict")
    if start is not None and end:
        f.seek(end)  # past it, as pickle.load leaves a file: where the next checkpoint saved after it starts
    return state


# ----------------------------------------------------------------------------
# 3. Its RNG states, and the step count
#
# Batches are random windows, so the data stream's position is the batch generator's state (plus
# the step count): it goes into every checkpoint with torch's RNG states, and a resumed run is exact.
def rng_state(batch_gen):
    cuda = {"cuda_rng": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}
    return {"batch_rng": batch_gen.get_state(), "torch_rng": torch.get_rng_state(), **cuda}


def gpu_states_fit(cuda):  # the GPUs' states are restored only where as many GPUs are as saved them
    return torch.cuda.is_available() and len(cuda) == torch.cuda.device_count()


def restore_rng(state, batch_gen):
    batch_gen.set_state(state["batch_rng"])
    torch.set_rng_state(state["torch_rng"])
    if gpu_states_fit(state.get("cuda_rng", ())):
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def check_rng(state, name):
    """ValueError unless restore_rng can restore rng_state's dict `state`: spare generators try each state."""
    try:  # batch_rng and torch_rng are CPU generators' states
        for key in ("batch_rng", "torch_rng"):
            torch.Generator().set_state(state[key])
        cuda = state.get("cuda_rng", [])
        if not isinstance(cuda, (list, tuple)):
            raise TypeError(f"cuda_rng is a {type(cuda).__name__}")
        for i, s in enumerate(cuda if gpu_states_fit(cuda) else ()):
            torch.Generator(device=f"cuda:{i}").set_state(s)
    except (KeyError, TypeError, RuntimeError, AttributeError) as e:
        raise ValueError(f"{name} holds no valid RNG state ({type(e).__name__})") from None


def step_count(iteration, name=None):
    """save_checkpoint's iteration as the int load_checkpoint gives back (name: the checkpoint read): a whole number
    >= 0, numpy's and torch's too (another program's 0-d tensor); a bool is refused, a bool tensor (index: 1) too."""
    with contextlib.suppress(TypeError):
        iteration = iteration if isinstance(iteration, bool) or getattr(iteration, "dtype", None) == torch.bool \
            else operator.index(iteration)
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"{name} holds iteration {iteration!r}, not a step count" if name else
                         f"iteration must be a whole number >= 0, got {iteration!r}.")
    return iteration


# ----------------------------------------------------------------------------
# 4. Does it fit this model and optimizer

def check_state(state, model, optimizer=None, name="the checkpoint"):
    """Raises ValueError unless a checkpoint's dict fits model (unwrapped) and optimizer: its entries,
    every shape, the iteration. Checked before anything is loaded, so a bad one changes nothing. A good one is made
    ready in place: its model keys without torch.compile's and DDP's prefixes, its iteration a Python int."""
    for key in ("model", "iteration", *(("optimizer",) if optimizer is not None else ())):
        if key not in state:
            raise ValueError(f"{name} has no {key!r} entry")
    saved, own = state["model"], model.state_dict().keys()
    if isinstance(saved, dict) and saved.keys() != own:  # saved from inside torch.compile or DDP (common in
        # CS336 code): without the wrappers' prefixes, where the model's own keys have none (its own compiled part)
        state["model"] = saved = {k.replace("_orig_mod.", "").removeprefix("module.") if isinstance(k, str) else k: v
                                  for k, v in saved.items()}  # a key that is no str: named below (check_weights)
    state["iteration"] = step_count(state["iteration"], name)
    check_weights(saved, model, name)
    if optimizer is not None:
        check_optimizer_state(state["optimizer"], optimizer, name)


def check_weights(saved, model, name):
    """check_state's model entry (saved): ValueError unless it holds model's keys, each a tensor of its shape and kind,
    and one value for each tensor that model keeps under several keys."""
    own = model.state_dict()
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
    shared = {}  # a tensor the model holds under several keys (tied weights): loading kept the last key's alone
    for k, v in model.state_dict(keep_vars=True).items():
        shared.setdefault(id(v), []).append(k)
    for first, *rest in (keys for keys in shared.values() if len(keys) > 1):
        if not all(torch.equal(saved[first], saved[k]) for k in rest):
            raise ValueError(f"{name} holds two different {first} and {rest[0]}, which this model shares as one "
                             "tensor; load it into a model that keeps them apart")


def check_optimizer_state(saved, optimizer, name):
    """check_state's optimizer entry (saved): ValueError unless this kind of optimizer saved it (the same names of
    hyperparameters and state entries) for these parameters (the same groups, each moment of its parameter's shape)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def usable(v, p):  # a number, or a real tensor (loading casts a complex one) of p's shape or a scalar
        return not isinstance(v, torch.Tensor) or (not v.is_complex() and tuple(v.shape) in ((), tuple(p.shape)))

    def names(d):  # a group's hyperparameters, not what torch keeps there too (its tensors, their names, a scheduler's)
        return ", ".join(sorted(str(k) for k in d if k not in ("params", "param_names", "initial_lr")))
    pairs = []  # (what, the checkpoint's names, this optimizer's): another optimizer's loaded, and trained with its lr
    try:  # the same groups of parameters, and every moment of its parameter's shape
        pairs = [("hyperparameters", names(a), names(b)) for a, b in zip(saved["param_groups"], optimizer.param_groups)]
        pairs += [("state entries", names(s), names(optimizer.state[params[i]])) for i, s in saved["state"].items()
                  if 0 <= i < len(params) and s and optimizer.state.get(params[i])]  # where both have stepped
        fits = [len(g["params"]) for g in saved["param_groups"]] == [len(g["params"]) for g in optimizer.param_groups]
        fits = fits and all(0 <= i < len(params) and all(usable(v, params[i]) for v in s.values())
                            for i, s in saved["state"].items())
    except (TypeError, KeyError, AttributeError):
        fits = False
    for what, theirs, mine in pairs:
        if theirs != mine:
            raise ValueError(f"{name} was saved by another optimizer: its {what} are ({theirs}), this one's ({mine})")
    if not fits:
        raise ValueError(f"{name} holds optimizer state that does not fit this model's parameters")
