"""Train a Transformer LM: from raw text to a checkpoint and samples, on one CPU or many GPUs.

CS336 assignment 1, sections 5-7. Data preparation (corpora, BPE, token files) lives in data.py.

    python train.py                          # offline: Python's own docs, a few minutes on a laptop CPU
    python train.py --data tinystories       # the handout's run (downloads into data/); also owt,
    python train.py --data my.txt            # any text file, or my.npy for pre-tokenized ids
    torchrun --nproc_per_node=8 train.py --data tinystories   # DistributedDataParallel
    python train.py --data tinystories --benchmark --device cuda  # tokens/s and MFU, random tokens
"""
import argparse
import contextlib
import datetime
import errno
import importlib.util
import json
import math
import os
import signal
import statistics
import sys
import time
import zipfile
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C while torch loads (seconds): one line, not a traceback from inside an import
    signal.signal(signal.SIGINT, lambda *_: (print("train.py: interrupted while starting; nothing was written.",
                                                   file=sys.stderr), os._exit(130)))
import numpy as np
import torch

import accounting
from bpe import Tokenizer, catch_ctrl_c
from safety import atomic_file
from export import export_hf
from data import DATASETS, EOT, DataError, UsageError, check_ids, fingerprint, is_ids, prepare_data, unigram_loss
from model import TransformerLM, generate
from optim import AdamW, clip_grad_norm, cosine_lr, cross_entropy, perplexity

RANK = int(os.environ.get("RANK", "0"))  # this process's rank under torchrun (0 when run alone)


def log(*args, **kwargs):  # only rank 0 talks, so that N processes print one story
    if RANK == 0:
        print(*args, **kwargs, flush=True)


# ----------------------------------------------------------------------------
# 1. Configuration: flags, presets, checks, derived values

# The flags marked PRESET take their default from the data source: the built-in corpus and
# local files get "small", sized to train in minutes on 2 CPU cores; tinystories and owt get
# the handout's section 7 run: its model shape (accounting.TINYSTORIES) and 327,680,000
# tokens (batch 128 x 10,000 steps x context 256).
PRESETS = {
    "small": dict(vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=384,
                  batch_size=32, max_iters=700, total_tokens=None, lr=5e-3, min_lr=5e-4, warmup_iters=50,
                  eval_interval=100, eval_iters=10),
    "tinystories": dict(accounting.TINYSTORIES, batch_size=128, max_iters=None, total_tokens=327_680_000,
                        lr=3e-3, min_lr=3e-4, warmup_iters=200, eval_interval=500, eval_iters=50),
}
PRESETS["owt"] = dict(PRESETS["tinystories"], vocab_size=32_000)  # the same run, OpenWebText's larger vocabulary
PRESET = "preset"

FLAGS = [  # (flag, type, default, help): the whole command line, by --help section; bool = a switch
    "data and output",
    ("--data", str, "pydoc", "pydoc (built-in, offline), tinystories, owt (downloaded), PATH.txt or PATH.npy (ids)"),
    ("--val-data", str, None, "validation ids (.npy) for --data PATH.npy; default: its last 10%%"),
    ("--data-dir", str, "data", "cache for downloads, tokenizers and token files"),
    ("--out-dir", str, "out", "runs are written to OUT_DIR/RUN_NAME/"),
    ("--run-name", str, None, "default: the data source's name"),
    ("--workers", int, None, "processes for tokenizer training and tokenizing; default: all cores"),
    "model shape",
    ("--vocab-size", int, PRESET, "tokens in the vocabulary (BPE is trained to this size on text data)"),
    ("--context-length", int, PRESET, "tokens per training window"),
    ("--d-model", int, PRESET, "width of the residual stream"),
    ("--num-layers", int, PRESET, "Transformer blocks"),
    ("--num-heads", int, PRESET, "attention heads"),
    ("--d-ff", int, PRESET, "hidden width of the feed-forward network"),
    ("--rope-theta", float, 10000.0, "RoPE base"),
    "ablations (handout section 7.3)",
    ("--no-norm", bool, False, "remove every RMSNorm"),
    ("--post-norm", bool, False, "normalize after each residual add"),
    ("--nope", bool, False, "no position embedding (no RoPE)"),
    ("--silu-ffn", bool, False, "W2 silu(W1 x) feed-forward instead of SwiGLU"),
    ("--tie-embeddings", bool, False, "lm_head shares the embedding matrix"),
    "optimization",
    ("--batch-size", int, PRESET, "sequences per optimizer step, over all processes and accumulation steps"),
    ("--max-iters", int, PRESET, "optimizer steps (tinystories/owt: from --total-tokens)"),
    ("--total-tokens", int, PRESET, "instead of --max-iters: steps = total / (batch size x context length)"),
    ("--lr", float, PRESET, "peak learning rate"),
    ("--min-lr", float, PRESET, "final learning rate of the cosine"),
    ("--warmup-iters", int, PRESET, "linear warm-up steps (a preset warm-up shrinks to fit a short run)"),
    ("--grad-accum", int, 1, "micro-steps per optimizer step (same update, less memory)"),
    ("--beta1", float, 0.9, "AdamW beta1"),
    ("--beta2", float, 0.95, "AdamW beta2"),
    ("--eps", float, 1e-8, "AdamW epsilon"),
    ("--weight-decay", float, 0.1, "AdamW decoupled weight decay"),
    ("--grad-clip", float, 1.0, "clip the global gradient L2 norm (0: off)"),
    ("--seed", int, 1337, "seeds the initialization and the batch order"),
    "logging, evaluation, checkpoints",
    ("--eval-interval", int, PRESET, "steps between validation runs"),
    ("--eval-iters", int, PRESET, "batches per validation run"),
    ("--log-interval", int, 10, "steps between metrics.jsonl lines"),
    ("--checkpoint-interval", int, 500, "steps between checkpoints (one also at the start and the end)"),
    ("--resume", bool, False, "continue OUT_DIR/RUN_NAME/ckpt.pt; pass the same flags as the first run"),
    ("--overwrite", bool, False, "start a new run where one exists (its files are replaced as the new run writes)"),
    ("--plot", bool, False, "draw loss.png (needs matplotlib)"),
    ("--export", str, None, "write the run OUT_DIR/RUN_NAME to this directory in the Hugging Face format, then exit"),
    "hardware",
    ("--device", str, None, "cpu, cuda, cuda:1, mps; default: cuda when available"),
    ("--dtype", str, None, "float32, or bf16 (bfloat16 autocast, float32 weights); default: bf16 on cuda"),
    ("--compile", bool, False, "torch.compile the model"),
    ("--fast", bool, True, "model.py's fused kernels; --no-fast runs the from-scratch reference path"),
    ("--activation-checkpointing", bool, False, "recompute each block's insides in backward: less memory"),
    ("--benchmark", bool, False, "time training steps on random tokens (tokens/s, MFU); writes nothing"),
    ("--benchmark-steps", int, 20, "timed steps after 5 warm-up steps"),
    ("--vs-llama", bool, False, "moved to bench.py: python bench.py step [these flags]"),
    "samples at the end",
    ("--num-samples", int, 3, "samples written to samples.txt"),
    ("--sample-tokens", int, 200, "new tokens per sample"),
    ("--temperature", float, 0.8, "0 = greedy"),
    ("--top-p", float, 0.95, "nucleus sampling threshold"),
    ("--prompt", str, "", "text the samples continue; default: a new document"),
]


SOURCES = ("pydoc", *DATASETS)  # --data values that are not file names
KEYS = {kind: [row[0][2:].replace("-", "_") for row in FLAGS if not isinstance(row, str) and row[1] is kind]
        for kind in (int, float)}  # the numeric flags, for the rules that hold for all of them
RUN_FILES = ("ckpt.pt", "metrics.jsonl", "config.json", "samples.txt", "vocab.json", "merges.txt", "loss.png")
RUN_MARKERS = RUN_FILES[:3]  # a directory holding one of these holds a run


def must(key, words, wrong):  # a CHECKS row for one numeric flag; an unset flag (None) passes
    return lambda c: c[key] is not None and wrong(c[key]), f"--{key.replace('_', '-')} must {words}, got {{{key}}}."


def writable(path):  # can the directory be created, or written if it exists?
    path = next(p for p in (path, *path.parents) if p.exists())
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def unreadable(path):  # why --data/--val-data cannot be read, or "" if it can
    p = Path(path)
    if p.is_dir():
        return " is a directory"
    if not p.is_file():
        return ": no such file"
    return "" if os.access(p, os.R_OK) else " is not readable (permission denied)"


def in_the_way(c):  # a directory where the run writes one of its files, or None
    run_dir = Path(c["out_dir"]) / c["run_name"]
    return next((run_dir / name for name in RUN_FILES if (run_dir / name).is_dir()), None)


CHECKS = [  # (is_wrong(cfg), message or message(cfg)), in order; the first wrong row stops, so rows rely on those above
    (lambda c: c["vs_llama"], "--vs-llama has moved to bench.py: run python bench.py step with the same train.py "
     "flags (e.g. python bench.py step --data tinystories --device cpu --batch-size 4)."),
    (lambda c: c["max_iters"] is not None and c["total_tokens"] is not None,
     "--max-iters and --total-tokens both set the run length; pass only one of them."),
    # NaN passes every comparison below; torch takes 64-bit integers (a seed also unsigned; seed + 1 seeds evaluation)
    *(must(k, "be a finite number", lambda v: not math.isfinite(v)) for k in KEYS[float]),
    must("seed", "lie in [-2**63, 2**64 - 1)", lambda v: not -2**63 <= v < 2**64 - 1),
    *(must(k, "be below 2**63", lambda v: v >= 2**63) for k in KEYS[int] if k != "seed"),
    *(must(k, "be positive", lambda v: v <= 0) for k in (
        "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "batch_size",
        "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval",
        "benchmark_steps", "workers")),
    *(must(k, "not be negative", lambda v: v < 0) for k in (
        "lr", "min_lr", "warmup_iters", "eps", "weight_decay", "grad_clip", "temperature", "num_samples",
        "sample_tokens")),
    (lambda c: c["max_iters"] is None and c["total_tokens"] < c["batch_size"] * c["context_length"],
     "--total-tokens {total_tokens} is smaller than one batch (batch size x context length); raise it."),
    (lambda c: c["data"] not in SOURCES and unreadable(c["data"]),
     lambda c: f"--data {c['data']}{unreadable(c['data'])}; pass pydoc, tinystories, owt, a .txt file or a .npy file."),
    (lambda c: c["data"] not in SOURCES and Path(c["data"]).stat().st_size == 0,
     "--data {data} is empty; pass a file with text or token ids."),
    (lambda c: c["val_data"] and not is_ids(c["data"]),
     "--val-data goes with --data PATH.npy only; text data is split automatically."),
    (lambda c: c["val_data"] and unreadable(c["val_data"]),
     lambda c: f"--val-data {c['val_data']}{unreadable(c['val_data'])}."),
    (lambda c: not is_ids(c["data"]) and not c["benchmark"] and not writable(Path(c["data_dir"])),
     "--data-dir {data_dir} is not a writable directory (a file, or read-only) for the token cache; pick another."),
    (lambda c: not is_ids(c["data"]) and not c["benchmark"] and c["vocab_size"] < 257,
     "--vocab-size {vocab_size} is too small for BPE on text data: 256 bytes + 1 special token need 257."),
    (lambda c: c["d_model"] % c["num_heads"], "--d-model {d_model} is not divisible by --num-heads {num_heads}."),
    (lambda c: not c["nope"] and (c["d_model"] // c["num_heads"]) % 2,
     "RoPE needs an even head size, but --d-model {d_model} / --num-heads {num_heads} is odd; change one or pass "
     "--nope."),
    (lambda c: c["no_norm"] and c["post_norm"], "--no-norm and --post-norm contradict each other; pass one of them."),
    (lambda c: not (0 <= c["beta1"] < 1 and 0 <= c["beta2"] < 1),
     "--beta1 and --beta2 must lie in [0, 1), got {beta1} and {beta2}."),
    (lambda c: not 0 < c["top_p"] <= 1, "--top-p must lie in (0, 1], got {top_p}."),
    (lambda c: c["min_lr"] > c["lr"], "--min-lr {min_lr} is above --lr {lr}."),
    (lambda c: c["resume"] and c["benchmark"], "--benchmark writes nothing and reads no checkpoint; drop --resume."),
    (lambda c: c["resume"] and c["overwrite"],
     "--resume continues a run and --overwrite replaces it; pass one of them."),
    (lambda c: c["batch_size"] % (c["world_size"] * c["grad_accum"]), "--batch-size {batch_size} does not divide "
     "into {world_size} processes x --grad-accum {grad_accum}; make it a multiple of their product."),
    (lambda c: c["device"].split(":")[0] not in ("cpu", "cuda", "mps"),
     "--device {device}: unknown device; use cpu, cuda, cuda:N or mps."),
    (lambda c: c["device"].startswith("cuda") and not torch.cuda.is_available(),
     "--device {device}: this PyTorch sees no CUDA GPU; use --device cpu."),
    (lambda c: c["device"].startswith("mps") and not torch.backends.mps.is_available(),
     "--device {device}: MPS is not available here; use --device cpu."),
    (lambda c: c["dtype"] not in ("float32", "bf16"), "--dtype {dtype}: use float32 or bf16."),
    (lambda c: c["dtype"] == "bf16" and c["device"].startswith("cuda") and not torch.cuda.is_bf16_supported(),
     "--dtype bf16: this GPU has no bfloat16 support; use --dtype float32."),
    (lambda c: c["plot"] and importlib.util.find_spec("matplotlib") is None,
     "--plot needs matplotlib: pip install matplotlib (or drop --plot)."),
    (lambda c: not c["benchmark"] and not writable(Path(c["out_dir"]) / c["run_name"]),
     "--out-dir {out_dir}: cannot write {out_dir}/{run_name}; pick a writable --out-dir or another --run-name."),
    (lambda c: not c["benchmark"] and in_the_way(c),
     lambda c: f"{in_the_way(c)} is a directory where the run writes a file; move it away or pick another --run-name."),
]


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's complaints end like ours: one sentence, exit code 2
        raise UsageError(f"{message} (see python train.py --help)")


def build_parser():
    p = Parser(description="Train a Transformer LM (CS336 assignment 1). With no flags: a small model on Python's "
               "built-in documentation, offline, in minutes on a CPU. Defaults marked small/tinystories/owt depend "
               "on --data: small for pydoc and text files.")
    group = p
    for row in FLAGS:
        if isinstance(row, str):  # a section title
            group = p.add_argument_group(row)
            continue
        name, kind, default, text = row
        key, shown = name[2:].replace("-", "_"), "" if default in (None, "") else f" (default: {default})"
        if kind is bool:  # --fast is on by default, so it also gets a --no-fast
            action = argparse.BooleanOptionalAction if default else "store_true"
            group.add_argument(name, action=action, default=default, help=text)
        elif default is PRESET:
            shown = "; ".join(f"{n} {preset[key]}" for n, preset in PRESETS.items() if preset[key] is not None)
            group.add_argument(name, type=kind, default=None, help=f"{text} (default: {shown})")
        else:
            group.add_argument(name, type=kind, default=default, help=text + shown)
    return p


def resolve_config(argv=None):
    """Flags -> one flat dict: the preset of --data fills what was not given, the environment
    decides device and processes, every CHECKS row must pass, then the derived values, here
    and only here. Raises UsageError."""
    cfg = vars(build_parser().parse_args(argv))
    warmup_given = cfg["warmup_iters"] is not None
    length_given = cfg["max_iters"] is not None or cfg["total_tokens"] is not None
    for key, value in PRESETS.get(cfg["data"], PRESETS["small"]).items():
        if cfg[key] is None and not (length_given and key in ("max_iters", "total_tokens")):
            cfg[key] = value
    cfg["run_name"] = cfg["run_name"] or Path(cfg["data"]).stem  # pydoc, tinystories, owt or the file's name
    cfg["world_size"], cfg["rank"] = int(os.environ.get("WORLD_SIZE", "1")), RANK  # torchrun's
    cfg["device"] = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg["dtype"] = cfg["dtype"] or ("bf16" if cfg["device"].startswith("cuda") else "float32")
    for is_wrong, message in CHECKS:
        if is_wrong(cfg):
            raise UsageError(message(cfg) if callable(message) else message.format(**cfg))

    if cfg["device"].startswith("cuda") and cfg["world_size"] > 1:  # one GPU per process
        cfg["device"] = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    cfg["micro_batch"] = cfg["batch_size"] // (cfg["world_size"] * cfg["grad_accum"])  # rows per forward pass
    if cfg["max_iters"] is None:
        cfg["max_iters"] = cfg["total_tokens"] // (cfg["batch_size"] * cfg["context_length"])
    cfg["total_tokens"] = cfg["max_iters"] * cfg["batch_size"] * cfg["context_length"]  # what is really trained on
    if cfg["warmup_iters"] > cfg["max_iters"]:  # needs the run length just derived, so not a CHECKS row
        if warmup_given:
            raise UsageError(f"--warmup-iters {cfg['warmup_iters']} is longer than the run ({cfg['max_iters']} steps).")
        cfg["warmup_iters"] = cfg["max_iters"] // 10
    return cfg


ABLATIONS = ("no_norm", "post_norm", "nope", "silu_ffn", "tie_embeddings")


def model_kwargs(cfg):  # TransformerLM's arguments from a cfg (this run's, or a saved config.json)
    keys = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", *ABLATIONS)
    return {k: cfg[k] for k in (*keys, "fast")}


# ----------------------------------------------------------------------------
# 2. Batches: random windows of a memmap

def windows(data, starts, context_length, device):
    """x[b] = data[s:s+T] and its next tokens y[b] = data[s+1:s+T+1] for each start s, int64
    (len(starts), T) on device. Only the memmap pages touched are read."""
    w = torch.from_numpy(data[starts[:, None] + np.arange(context_length + 1)].astype(np.int64))  # (B, T+1)
    x, y = w[:, :-1], w[:, 1:]
    if str(device).startswith("cuda"):  # pinned memory lets the copy overlap with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)


def random_starts(data, n, context_length, generator=None):  # n window starts, uniform over [0, len(data) - T)
    return torch.randint(len(data) - context_length, (n,), generator=generator).numpy()


def get_batch(data, batch_size, context_length, device, generator=None):
    """CS336 data loader: batch_size windows at random starts."""
    return windows(data, random_starts(data, batch_size, context_length, generator), context_length, device)


def micro_batches(data, cfg, generator):
    """This process's share of one global batch: grad_accum (x, y) pairs of micro_batch rows.
    Every process draws the same global batch of starts and reads only its own windows, so
    --grad-accum and the number of processes change the order of the arithmetic, never the data."""
    starts = random_starts(data, cfg["batch_size"], cfg["context_length"], generator)
    mine = starts.reshape(cfg["grad_accum"], cfg["world_size"], cfg["micro_batch"])[:, cfg["rank"]]
    return [windows(data, s, cfg["context_length"], cfg["device"]) for s in mine]


# ----------------------------------------------------------------------------
# 3. Checkpoints

def _unwrap(model):
    """The module inside DDP (.module) and torch.compile (._orig_mod): state-dict keys without prefixes."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def save_checkpoint(model, optimizer, iteration, out, **extra):
    """Model, optimizer, iteration and any `extra` entries (config, RNG states) to a path or a
    binary file object. To a path atomically: a kill mid-save leaves the previous checkpoint."""
    state = {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
             "iteration": int(iteration), **extra}
    if isinstance(out, (str, os.PathLike)):
        with atomic_file(out) as f:
            torch.save(state, f)
    else:
        torch.save(state, out)


def read_checkpoint(src):
    """A checkpoint's dict, verified: torch.load checks none of the CRC-32s that torch.save's zip
    keeps per record, so zipfile checks them first (a flipped byte in a weight is refused, not
    loaded); weights_only: tensors and plain values, so loading a file cannot run code. Raises
    ValueError naming the fault."""
    name = src if isinstance(src, (str, os.PathLike)) else "the checkpoint"
    try:
        with zipfile.ZipFile(src) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError, ValueError) as e:
        raise ValueError(f"{name} is not a torch.save zip file ({e})") from None
    if bad is not None:
        raise ValueError(f"{name} is damaged: its record {bad} fails its CRC-32 check")
    if name != src:
        src.seek(0)
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # e.g. a pickle that asks for code: refused by weights_only
        raise ValueError(f"{name} cannot be loaded ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{name} holds a {type(state).__name__}, not a checkpoint's dict")
    return state


def check_state(state, model, optimizer=None, name="the checkpoint"):
    """Raises ValueError unless a checkpoint's dict fits model (and optimizer): its entries, every
    shape, the iteration. Checked before anything is loaded, so a bad one changes nothing."""
    for key in ("model", "iteration", *(("optimizer",) if optimizer is not None else ())):
        if key not in state:
            raise ValueError(f"{name} has no {key!r} entry")
    it, own, saved = state["iteration"], _unwrap(model).state_dict(), state["model"]
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise ValueError(f"{name} holds iteration {it!r}, not a step count")
    keys = set(saved) if isinstance(saved, dict) else set()
    if keys != own.keys():
        raise ValueError(f"{name} does not fit this model: it lacks {sorted(own.keys() - keys)[:3]} and has "
                         f"{sorted(keys - own.keys())[:3]} too many")
    for k, v in own.items():
        if not torch.is_tensor(saved[k]) or saved[k].shape != v.shape:
            raise ValueError(f"{name} does not fit this model: {k} has shape {tuple(getattr(saved[k], 'shape', ()))}, "
                             f"the model's {tuple(v.shape)}")
    if optimizer is not None and not _fits_optimizer(state["optimizer"], optimizer):
        raise ValueError(f"{name} holds optimizer state that does not fit this model's parameters")


def _fits_optimizer(saved, optimizer):  # the same groups of parameters, and every moment of its parameter's shape
    params = [p for g in optimizer.param_groups for p in g["params"]]
    try:
        if [len(g["params"]) for g in saved["param_groups"]] != [len(g["params"]) for g in optimizer.param_groups]:
            return False
        return all(0 <= i < len(params) and all(not torch.is_tensor(v) or v.dim() == 0 or v.shape == params[i].shape
                                                for v in s.values()) for i, s in saved["state"].items())
    except (TypeError, KeyError, AttributeError):
        return False


def load_checkpoint(src, model, optimizer=None, state=None):
    """Restore model (and optimizer) from a path or file object; return the saved iteration.
    Raises ValueError, and loads nothing, if the file is damaged or does not fit."""
    state = read_checkpoint(src) if state is None else state
    check_state(state, model, optimizer)
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["iteration"]


# What shapes the trajectory: --resume refuses a checkpoint that disagrees on any of these.
TRAJECTORY_KEYS = ("data", "val_data", "vocab_size", "context_length", "d_model", "num_layers", "num_heads",
                   "d_ff", "rope_theta", *ABLATIONS, "batch_size", "grad_accum", "max_iters", "lr", "min_lr",
                   "warmup_iters", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "dtype", "seed")


def check_resume(cfg, ckpt_path):
    """The saved checkpoint, verified whole, or None to start from step 0; raises UsageError if it
    is damaged, does not fit this model, or its config differs."""
    if not ckpt_path.exists():  # killed before its first checkpoint: step 0 is where it stood
        log(f"note: --resume found no checkpoint {ckpt_path}; starting from step 0")
        return None
    try:
        state = read_checkpoint(ckpt_path)
        old = state.get("config") if isinstance(state.get("config"), dict) else {}
        diff = [f"{k} ({old.get(k)!r} -> {cfg[k]!r})" for k in TRAJECTORY_KEYS if old.get(k) != cfg[k]]
        if diff:
            raise UsageError(f"--resume: {ckpt_path} was trained with a different config; keys that differ: "
                             f"{', '.join(diff)}.")
        meta = TransformerLM(**model_kwargs(cfg), device="meta")  # shapes only: no memory, no time
        check_state(state, meta, AdamW(meta.parameters()), name=ckpt_path)
        if state["iteration"] > cfg["max_iters"]:
            raise ValueError(f"{ckpt_path} holds iteration {state['iteration']}, past the run's {cfg['max_iters']} "
                             "steps")
        try:  # both are CPU generator states: a spare generator tries them
            for key in ("batch_rng", "torch_rng"):
                torch.Generator().set_state(state["rng"][key])
        except (KeyError, TypeError, RuntimeError) as e:
            raise ValueError(f"{ckpt_path} holds no valid RNG state ({type(e).__name__})") from None
    except (ValueError, OSError) as e:
        raise UsageError(f"--resume: {e}; restore it from a copy, or start a new run with --overwrite.") from None
    return state


def check_same_data(state, cfg, ckpt_path):
    """Raises UsageError if the checkpoint was trained on other token files or another tokenizer
    (a changed text file gets a new cache and a new tokenizer: resuming on it would go on silently)."""
    old, new = state["config"].get("data_fingerprint"), cfg["data_fingerprint"]
    if old is not None and old != new:  # a checkpoint from before fingerprints has none: nothing to compare
        what = "tokenizer" if isinstance(old, dict) and old.get("tokens") == new["tokens"] else "tokens"
        raise UsageError(f"--resume: {ckpt_path} was trained on other data (its {what} differ from those of --data "
                         f"{cfg['data']} now); resume with the data it was trained on, or start a new run with "
                         "--overwrite.")


# Batches are random windows, so the data stream's position is the batch generator's state (plus
# the step count): it goes into every checkpoint with torch's RNG states.
def rng_state(batch_gen):
    state = {"batch_rng": batch_gen.get_state(), "torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state, batch_gen):
    batch_gen.set_state(state["batch_rng"])
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


# ----------------------------------------------------------------------------
# 4. The model and the training step

@contextlib.contextmanager
def torch_settings(cfg):
    """PyTorch's global switches for a run, restored afterwards (tests run many in one process)."""
    was = torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision()
    if cfg["device"] == "cpu":
        # bitwise-reproducible CPU runs (what makes a resumed run identical): the embedding's
        # backward (an index_put with accumulate) otherwise adds rows in a thread-dependent order
        torch.use_deterministic_algorithms(True)
    if cfg["device"].startswith("cuda"):
        torch.set_float32_matmul_precision("high")  # TF32 matmuls for float32 runs
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.set_float32_matmul_precision(was[1])


def autocast(cfg):
    """bf16 autocast: matmuls run in bfloat16 while weights, gradients and AdamW state stay
    float32 (the "master weights"), so small updates are not rounded away."""
    if cfg["dtype"] != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=cfg["device"].split(":")[0], dtype=torch.bfloat16)


def use_activation_checkpointing(model):
    """Lecture 2: keep only each block's input and recompute its insides in backward: activation
    memory drops to O(layers x d_model) per token, for the price of one more forward."""
    from torch.utils.checkpoint import checkpoint
    for block in _unwrap(model).layers:
        def fwd(*args, _inner=block.forward, **kwargs):
            if not torch.is_grad_enabled():  # evaluation / generation: nothing to save anyway
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)
        block.forward = fwd


def build(cfg):
    """The model, its AdamW, and the wrapped model the step calls: activation checkpointing,
    then torch.compile, then DDP (compile first, so DDP sees one module)."""
    torch.manual_seed(cfg["seed"])  # the same initial weights on every process
    raw = TransformerLM(**model_kwargs(cfg), device=cfg["device"])
    optimizer = AdamW(raw.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                      weight_decay=cfg["weight_decay"])
    if cfg["activation_checkpointing"]:
        use_activation_checkpointing(raw)
    model = torch.compile(raw) if cfg["compile"] else raw
    if cfg["world_size"] > 1:
        dev = torch.device(cfg["device"])
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return raw, model, optimizer


def train_step(model, optimizer, micro_batches, lr, cfg):
    """One optimizer step's gradients (the caller then calls optimizer.step()) -> (mean loss over
    the global batch, pre-clip gradient norm). Each micro-batch loss is divided by their number,
    so the summed gradients are those of the whole batch's mean loss. Under DDP, backward
    averages gradients over processes; no_sync() skips that on all but the last micro-step."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n = len(micro_batches)
    loss_sum = torch.zeros((), device=cfg["device"])
    for i, (x, y) in enumerate(micro_batches):
        sync = i == n - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(cfg):
            loss = cross_entropy(model(x), y, fused=cfg["fast"])  # in float32; --no-fast: the reference path
        (loss / n).backward()
        loss_sum += loss.detach()
    loss = loss_sum / n
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(loss)
        loss /= cfg["world_size"]
    norm = clip_grad_norm(model.parameters(), cfg["grad_clip"]) if cfg["grad_clip"] > 0 else None
    return loss, norm


def step_flops(cfg):  # 3 x forward FLOPs (backward is twice the forward) x sequences, per optimizer step
    fwd = accounting.lm_forward_flops(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                                      cfg["d_ff"], silu_ffn=cfg["silu_ffn"])
    return accounting.training_step_flops(fwd) * cfg["batch_size"]


def device_peak(cfg):  # peak FLOP/s for this device and dtype (accounting.py), or None
    try:
        dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32
        return accounting.peak_flops(torch.device(cfg["device"]), dtype)
    except Exception:  # MFU is a nicety: a missing table entry must not stop training
        return None


# ----------------------------------------------------------------------------
# 5. The training loop

@torch.no_grad()
def evaluate(model, data, cfg):
    """Mean loss over eval_iters global batches, split as in training. Its own freshly seeded
    generator: every evaluation scores the same text and the training batches' RNG is untouched."""
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    model.eval()
    total = torch.zeros((), device=cfg["device"])
    for _ in range(cfg["eval_iters"]):
        for x, y in micro_batches(data, cfg, g):
            with autocast(cfg):
                total += cross_entropy(model(x), y, fused=cfg["fast"])
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return float(total) / (cfg["eval_iters"] * cfg["grad_accum"] * cfg["world_size"])


def truncate_metrics(path, last_step):
    """Drop the lines after the step a resumed run restarts from (a new run: all): they run again.
    That step keeps its training line, not its validation line (saved before that evaluation)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
            if e["step"] < last_step or (e["step"] == last_step and "loss" in e):
                keep.append(line)
        except ValueError:  # a line cut short by the kill
            pass
    with atomic_file(path, "w") as f:
        f.write("".join(line + "\n" for line in keep))


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Console lines and metrics.jsonl (rank 0). tokens/s and MFU cover the steps since the last
    metrics line, evaluations excluded; times count from the first start, across resumes."""

    def __init__(self, cfg, path, elapsed):
        self.cfg, self.path, self.tty = cfg, path, sys.stdout.isatty()
        self.t0, self.t_last, self.dt_avg = time.time() - elapsed, time.time(), None
        self.window_time, self.window_steps = 0.0, 0
        self.flops, self.peak = step_flops(cfg), device_peak(cfg)

    def seconds(self):
        return time.time() - self.t0

    def record(self, step, **entry):
        if self.cfg["rank"] == 0:
            tokens = step * self.cfg["batch_size"] * self.cfg["context_length"]
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "tokens": tokens, "time": round(self.seconds(), 3), **entry}) + "\n")

    def evaluated(self, step, val_loss):
        self.record(step, val_loss=val_loss, val_ppl=perplexity(val_loss))
        log(("\r" if self.tty else "") + f"step {step}: val loss {val_loss:.4f} (ppl {perplexity(val_loss):.1f})"
            + " " * 30)
        self.t_last = time.time()  # evaluation time does not count toward tokens/s

    def stepped(self, step, loss, lr, norm):
        cfg, now = self.cfg, time.time()
        dt, self.t_last = now - self.t_last, now
        self.dt_avg = dt if self.dt_avg is None else 0.9 * self.dt_avg + 0.1 * dt  # for the ETA
        self.window_time, self.window_steps = self.window_time + dt, self.window_steps + 1
        tps = cfg["batch_size"] * cfg["context_length"] * self.window_steps / self.window_time
        mfu = None
        if self.peak:
            mfu = accounting.mfu(self.flops * self.window_steps, self.window_time, self.peak * cfg["world_size"])
        if step % cfg["log_interval"] == 0 or step == cfg["max_iters"]:
            self.window_time, self.window_steps = 0.0, 0
            self.record(step, loss=loss, lr=lr, grad_norm=norm, tokens_per_s=round(tps, 1),
                        mfu=None if mfu is None else round(mfu, 5))
        if self.tty or step % cfg["log_interval"] == 0:
            line = (f"step {step}/{cfg['max_iters']} | loss {loss:.4f} | lr {lr:.2e} | {tps / 1e3:.1f}k tok/s"
                    + (f" | MFU {100 * mfu:.1f}%" if mfu else "")
                    + f" | ETA {fmt_time(self.dt_avg * (cfg['max_iters'] - step))}")
            log(("\r" + line + "   ") if self.tty else line, end="" if self.tty else "\n")


@contextlib.contextmanager
def stop_requests(cfg):
    """Ctrl-C or SIGTERM stops the loop at the next step boundary, where model and optimizer agree,
    so the checkpoint saved then is valid; a second Ctrl-C aborts at once. Yields stopped()."""
    asked = []

    def handler(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)
        log("\nstopping after this step; a checkpoint will be saved (Ctrl-C again to abort now)")

    def stopped():  # under DDP every process must stop at the same step: one's signal stops all
        if cfg["world_size"] == 1:
            return bool(asked)
        s = torch.tensor([float(bool(asked))], device=cfg["device"])
        torch.distributed.all_reduce(s)
        return bool(s.item())
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopped
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def check_samples(cfg, tok, where, top):
    """The run ends by sampling: what would fail there is refused at the start instead. tok decodes
    the samples (where: its vocab.json); top is the largest token id in the data."""
    if tok is None:
        if cfg["prompt"]:
            raise UsageError(f"--prompt needs a tokenizer to encode it, and there is none beside --data {cfg['data']}; "
                             "put its vocab.json and merges.txt there, or drop --prompt.")
        return
    if cfg["num_samples"] == 0:
        return
    n, V = len(tok.vocab), cfg["vocab_size"]
    if top >= n:
        raise UsageError(f"the data holds token id {top}, but {where}, which decodes the samples, has {n} tokens; "
                         "use the tokenizer that made the ids, or --num-samples 0.")
    if V > n:
        raise UsageError(f"--vocab-size {V} is above the {n} tokens of {where}, so samples could hold ids it cannot "
                         f"decode; pass --vocab-size {n}, or --num-samples 0.")
    try:
        highest = max(tok.encode(cfg["prompt"] or EOT))  # no --prompt: the samples start from EOT
    except ValueError as e:  # UnicodeEncodeError: a lone surrogate, from bytes on the command line that are not UTF-8
        raise UsageError(f"--prompt cannot be encoded ({e}); pass UTF-8 text.") from None
    if highest >= V:
        what = "--prompt" if cfg["prompt"] else f"{EOT}, which starts the samples,"
        raise UsageError(f"{what} encodes to token id {highest}, at or above --vocab-size {V}, so the model cannot "
                         "read it; pass a larger --vocab-size, or --num-samples 0.")


def write_run_files(cfg, run_dir, tok_files, start, new):
    """Beside ckpt.pt: config.json, the tokenizer, metrics.jsonl cut back to the checkpoint's step.
    A new run writes them once its first checkpoint has replaced an old run's (--overwrite), each
    file whole; a resumed run keeps its tokenizer."""
    for f in tok_files or ():
        if new or not (run_dir / f.name).exists():
            with atomic_file(run_dir / f.name) as copy:  # a full disk must not leave half a tokenizer
                copy.write(f.read_bytes())
    with atomic_file(run_dir / "config.json", "w") as f:
        f.write(json.dumps(cfg, indent=2) + "\n")
    truncate_metrics(run_dir / "metrics.jsonl", start)
    if new:  # what an old run here left that this one does not make (yet)
        for name in {"vocab.json", "merges.txt", "samples.txt", "loss.png"} - {f.name for f in tok_files or ()}:
            (run_dir / name).unlink(missing_ok=True)


def write_samples(model, tok, cfg, path):
    g = torch.Generator(device=cfg["device"]).manual_seed(cfg["seed"])
    eot = tok.encode(EOT)[0]
    prompt = tok.encode(cfg["prompt"]) if cfg["prompt"] else [eot]
    out = []
    for _ in range(cfg["num_samples"]):
        with autocast(cfg):
            ids = generate(model, prompt[-cfg["context_length"]:], cfg["sample_tokens"], temperature=cfg["temperature"],
                           top_p=cfg["top_p"], stop_id=eot, generator=g)
        out.append(cfg["prompt"] + tok.decode(ids))
    with atomic_file(path, "w") as f:
        f.write("".join(f"--- sample {i + 1} ---\n{s}\n" for i, s in enumerate(out)))
    return out


def train(cfg, train_ids, valid_ids, tok, tok_files, run_dir, resume_state, baseline):
    """Evaluate, step on a fresh random batch, report, checkpoint; at the end a last evaluation,
    checkpoint, samples, the plot. Returns 0 done, 1 a non-finite loss or gradient, 130 stopped."""
    rank, last, ckpt_path = cfg["rank"], cfg["max_iters"], run_dir / "ckpt.pt"
    raw, model, optimizer = build(cfg)
    batch_gen = torch.Generator().manual_seed(cfg["seed"])  # the data order, on its own RNG
    start = 0 if resume_state is None else load_checkpoint(None, raw, optimizer, state=resume_state)
    if resume_state is not None:
        restore_rng(resume_state["rng"], batch_gen)
        log(f"resumed from {ckpt_path} at step {start}")
    n_params, n_emb = sum(p.numel() for p in raw.parameters()), raw.token_embeddings.weight.numel()
    log(f"model: {n_params / 1e6:.2f}M parameters ({(n_params - n_emb) / 1e6:.2f}M without the embedding), "
        f"device {cfg['device']}, dtype {cfg['dtype']}, {cfg['world_size']} process(es)")
    progress = Progress(cfg, run_dir / "metrics.jsonl", (resume_state or {}).get("elapsed", 0.0))

    def save(step):
        if rank == 0:
            save_checkpoint(raw, optimizer, step, ckpt_path, config=cfg, rng=rng_state(batch_gen),
                            elapsed=progress.seconds())
    with stop_requests(cfg) as stopped:  # from here a Ctrl-C waits for a step boundary
        if resume_state is None:
            save(0)  # a checkpoint exists from the first moment on, so --resume always has one
        if rank == 0:
            write_run_files(cfg, run_dir, tok_files, start, new=resume_state is None)
        for it in range(start, last):
            if it % cfg["eval_interval"] == 0:
                progress.evaluated(it, evaluate(model, valid_ids, cfg))
            lr = cosine_lr(it, cfg["lr"], cfg["min_lr"], cfg["warmup_iters"], last)
            loss, norm = train_step(model, optimizer, micro_batches(train_ids, cfg, batch_gen), lr, cfg)
            loss, norm = float(loss), None if norm is None else float(norm)
            if not math.isfinite(loss) or (norm is not None and not math.isfinite(norm)):
                what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {norm}"
                log(f"\nerror: {what} at step {it + 1}; stopping. The last good checkpoint is {ckpt_path}; "
                    "try a lower --lr or a --grad-clip.", file=sys.stderr)
                return 1
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.stepped(it + 1, loss, lr, norm)
            stop = stopped()
            if stop or ((it + 1) % cfg["checkpoint_interval"] == 0 and it + 1 < last):  # the end saves below
                save(it + 1)
            if stop:
                log(f"\nstopped at step {it + 1}; checkpoint saved to {ckpt_path}. Continue with the same "
                    "command plus --resume.")
                return 130
    if progress.tty:
        log()
    val_loss = evaluate(model, valid_ids, cfg)
    progress.record(last, val_loss=val_loss, val_ppl=perplexity(val_loss))
    save(last)
    log(f"done: {last} steps, {cfg['total_tokens'] / 1e6:.2f}M tokens in {fmt_time(progress.seconds())}; "
        f"final val loss {val_loss:.4f} (ppl {perplexity(val_loss):.1f}), unigram baseline {baseline:.4f}")
    log(f"checkpoint: {ckpt_path}")
    if rank == 0 and tok is not None and cfg["num_samples"] > 0:
        samples = write_samples(raw, tok, cfg, run_dir / "samples.txt")
        log(f"sample (all in {run_dir / 'samples.txt'}):\n{samples[0]}")
    if rank == 0 and cfg["plot"]:
        plot(run_dir / "metrics.jsonl", run_dir / "loss.png")
    return 0


# ----------------------------------------------------------------------------
# 6. --benchmark and --plot

def time_steps(steps, n, device):
    """{name: median seconds} of n calls each after 5 warm-ups, taking turns call by call (the same
    machine load for all); the GPU queue is drained around each call, so a time is the work's."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for fn in steps.values():
        for _ in range(5):
            fn()
    times = {name: [] for name in steps}
    for _ in range(n):
        for name, fn in steps.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def benchmark(cfg, rivals=None):
    """--benchmark: this configuration's training step on random tokens. rivals: {name: factory(cfg,
    micro) -> step()}, timed in turn with ours (bench.py's HF Llama). -> {name: median seconds}."""
    T, tokens = cfg["context_length"], cfg["batch_size"] * cfg["context_length"]
    with torch_settings(cfg):
        _, model, optimizer = build(cfg)
        data = torch.randint(cfg["vocab_size"], (cfg["grad_accum"], cfg["micro_batch"], T + 1), device=cfg["device"])
        micro = [(d[:, :-1], d[:, 1:]) for d in data]

        def ours():
            train_step(model, optimizer, micro, cfg["lr"], cfg)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        steps = {"this project": ours, **{name: make(cfg, micro) for name, make in (rivals or {}).items()}}
        medians = time_steps(steps, cfg["benchmark_steps"], cfg["device"])
    dt, flops, peak = medians["this project"], step_flops(cfg), device_peak(cfg)
    shape = ", ".join(f"{k}={cfg[k]}" for k in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads",
                                                 "d_ff", "batch_size"))
    log(f"benchmark: {shape}, device {cfg['device']} x{cfg['world_size']}, dtype {cfg['dtype']}, "
        f"compile {cfg['compile']}, fast {cfg['fast']}, {torch.get_num_threads()} CPU threads, "
        f"median of {cfg['benchmark_steps']} steps")
    log(f"  {1000 * dt:.1f} ms/step, {tokens / dt:,.0f} tokens/s, {flops / dt / 1e12:.2f} TFLOP/s achieved")
    if peak:
        log(f"  MFU {100 * flops / dt / (peak * cfg['world_size']):.1f}% of {peak / 1e12:.1f} TFLOP/s peak per device")
    log("  FLOPs per step = 3 x accounting.lm_forward_flops (forward matmuls incl. attention) x batch size")
    log(f"  {cfg['total_tokens']:,} tokens ({cfg['max_iters']} steps) would take "
        f"{fmt_time(cfg['total_tokens'] * dt / tokens)}")
    for name, other in list(medians.items())[1:]:
        log(f"  {name}: {1000 * other:.1f} ms/step, {tokens / other:,.0f} tokens/s (this project is {other / dt:.2f}x "
            "its speed)")
    return medians


def plot(metrics_path, png_path):
    """Loss against steps and against wall-clock time, side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
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


# ----------------------------------------------------------------------------
# 7. main(): processes, data, the run directory

@contextlib.contextmanager
def process_group(cfg):
    """torchrun's processes join one group (nccl on GPUs, gloo on CPUs); a lone process skips this."""
    ddp, cuda = cfg["world_size"] > 1, cfg["device"].startswith("cuda")
    if ddp and cuda:
        torch.cuda.set_device(cfg["device"])
    if ddp:  # a generous timeout: the others wait while rank 0 may spend hours downloading and tokenizing
        torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(hours=6))
    try:
        yield
        if ddp:  # leave together: a rank that tears gloo down while a peer still works can abort it
            torch.distributed.barrier()
    finally:
        if ddp:
            torch.distributed.destroy_process_group()


@contextlib.contextmanager
def disk_full(where, then):
    """A full disk (or quota) while writing under `where` ends in one sentence, exit code 1. Files are
    written whole or not at all (safety.atomic_file removes its temporary file), so what was there stays.
    The OSError may come wrapped (torch.save's zip writer raises a RuntimeError while handling it), and
    a failed write() names no file: then `where` is named."""
    try:
        yield
    except Exception as e:
        cause = e  # down the chain a traceback would show
        while cause is not None and not (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)):
            cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
        if cause is None:
            raise
        raise DataError(f"the disk is full: could not write {cause.filename or f'into {where}/'}; free some space, "
                        f"then {then}.") from None


def prepare_data_once(cfg):
    """data.prepare_data (and the data's fingerprint) on rank 0 first; the others wait for its
    verdict (an error stops every process with the same sentence), then open the files it cached."""
    args = cfg["data"], cfg["data_dir"], cfg["vocab_size"], cfg["val_data"], cfg["workers"]
    err, prepared = [None], None

    def prepare():  # -> train ids, valid ids, tokenizer, its files, fingerprint
        train_ids, valid_ids, tok, tok_files = prepare_data(*args)
        return train_ids, valid_ids, tok, tok_files, fingerprint(train_ids, valid_ids, tok_files, cfg["data_dir"])
    if cfg["rank"] == 0:
        try:
            with disk_full(cfg["data_dir"], "run the same command again"):
                prepared = prepare()
        except (UsageError, DataError) as e:
            err = [e]
    if cfg["world_size"] > 1:
        torch.distributed.broadcast_object_list(err, src=0)  # in place: rank 0's error, or None
    if err[0]:
        raise err[0]
    return prepared or prepare()


def export_run(run_dir, cfg):
    """--export DIR: the run's checkpoint and tokenizer as a Llama that transformers loads (export.py)."""
    ckpt, tok_files = run_dir / "ckpt.pt", (run_dir / "vocab.json", run_dir / "merges.txt")
    if not ckpt.exists():
        raise UsageError(f"--export: {ckpt} does not exist; pass the --out-dir and --run-name of a trained run.")
    try:
        state = read_checkpoint(ckpt)
        if not isinstance(state.get("config"), dict) or not isinstance(state.get("model"), dict):
            raise ValueError(f"{ckpt} holds no run config or no model")
        tok = Tokenizer.from_files(*map(str, tok_files), [EOT]) if all(f.exists() for f in tok_files) else None
        out = export_hf(cfg["export"], state["model"], model_kwargs(state["config"]), tok, cfg["overwrite"])
    except (ValueError, FileExistsError, PermissionError) as e:  # a full disk is disk_full's (exit 1)
        raise UsageError(f"--export: {e}.") from None
    log(f"exported {ckpt} to {out}{'' if tok else ' (no tokenizer in the run: the model only)'}; "
        "load it with transformers.AutoModelForCausalLM.from_pretrained")
    return 0


def run(cfg):
    """Everything checked first (flags, resume, data); only then is the run directory written."""
    if cfg["benchmark"]:
        benchmark(cfg)
        return 0
    run_dir = Path(cfg["out_dir"]) / cfg["run_name"]
    if cfg["export"] is not None:  # even "": never a training run by mistake
        return export_run(run_dir, cfg)
    if not cfg["resume"] and not cfg["overwrite"] and any((run_dir / f).exists() for f in RUN_MARKERS):
        raise UsageError(f"{run_dir} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                         "or another --run-name.")
    resume_state = check_resume(cfg, run_dir / "ckpt.pt") if cfg["resume"] else None
    train_ids, valid_ids, tok, tok_files, cfg["data_fingerprint"] = prepare_data_once(cfg)
    if resume_state is not None:
        check_same_data(resume_state, cfg, run_dir / "ckpt.pt")
    top = check_ids(train_ids, valid_ids, cfg["context_length"], cfg["vocab_size"])
    check_samples(cfg, tok, tok_files and tok_files[0], top)
    baseline = unigram_loss(train_ids, valid_ids, cfg["vocab_size"])
    log(f"data: {len(train_ids):,} train / {len(valid_ids):,} validation tokens; unigram baseline "
        f"{baseline:.4f} nats/token")
    if cfg["rank"] == 0:
        if resume_state is None and (run_dir / "ckpt.pt").exists():
            log(f"note: --overwrite: the run in {run_dir} is replaced file by file from the new run's first checkpoint")
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob("*.tmp*"):  # left by a run killed mid-write
            stale.unlink()
    with torch_settings(cfg):
        return train(cfg, train_ids, valid_ids, tok, tok_files, run_dir, resume_state, baseline)


def main(argv=None):
    """Exit code: 0 done, 1 no data (download failed), a full disk or a diverged run, 2 a usage mistake,
    130 stopped."""
    try:
        cfg = resolve_config(argv)
        resume = "run the same command with --resume to continue from the last checkpoint"
        with process_group(cfg), disk_full(Path(cfg["out_dir"]) / cfg["run_name"], resume):
            return run(cfg)
    except (UsageError, DataError) as e:
        if RANK == 0:
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except KeyboardInterrupt:  # before the loop's own handler (data, model) or a second Ctrl-C in the loop
        if RANK == 0:
            print("train.py: interrupted; every file written is whole: rerun the same command (with --resume once "
                  "the run has a ckpt.pt) to go on.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    catch_ctrl_c()  # a KeyboardInterrupt (bpe.py's pool workers hold Ctrl-C blocked: this process ends them)
    sys.exit(main())
