"""
train.py's configuration: every flag and its default (FLAGS), the presets that fill the defaults from --data
(PRESETS), the rules that refuse a mistake before anything is read or written (CHECKS), and the values derived
from them (resolve_config). `python train.py --help` prints FLAGS.

1. The flags and the presets
2. The rules: one row per mistake, checked in order
3. resolve_config: flags -> one flat dict
"""
import argparse
import contextlib
import importlib.util
import math
import os
import shlex
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

import accounting
import fast_gpu
import fused_head
from bpe import tokenizer_files
from checkpoints import read_checkpoint
from cli import RANK, Parser, UsageError, counted, env_int, fmt_time, log, short_repr, user_path, user_text
from data import BUILTIN, DATASETS, ids_vocab_size, is_cached
from files import NAME_MAX, PATH_MAX, TMP_ROOM, is_ids, same_folder, unreadable, writable
from machine import bad_environment, compile_error, device_error, memory_bytes, run_device, usable_cores
from rundir import (PATH_KEYS, TRAJECTORY_KEYS, as_kind, holds_tokenizer, run_dir, run_dir_problem, saved_config,
                    tokenizer_origin)


# ----------------------------------------------------------------------------
# 1. The flags and the presets


PRESET = "preset"  # a flag's default that depends on --data: filled in from PRESETS
# The flags marked PRESET take their default from the data source: the built-in corpora and local files
# get "small", sized to train in minutes on 2 CPU cores; tinystories and owt get the handout's section 7
# run: its model shape (accounting.TINYSTORIES) and token budget (accounting.TINYSTORIES_TOKENS).
PRESETS = {
    "small": dict(vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=384,
                  batch_size=32, max_iters=700, total_tokens=None, lr=5e-3, warmup_iters=50,
                  eval_interval=100, eval_iters=10, checkpoint_interval=100),
    "tinystories": dict(accounting.TINYSTORIES, total_tokens=accounting.TINYSTORIES_TOKENS, batch_size=128,
                        max_iters=None, lr=3e-3, warmup_iters=200, eval_interval=500, eval_iters=50,
                        checkpoint_interval=500),
}
PRESETS["owt"] = dict(PRESETS["tinystories"], vocab_size=32_000)  # the same run, OpenWebText's larger vocabulary
CORPORA = (*BUILTIN, *DATASETS)  # --data's names; anything else is a path
MIN_LR_SHARE = 0.1  # a --min-lr not given: the cosine ends at a tenth of its peak --lr
UNTIMED_STEPS = 5  # not timed (torch.compile compiles, allocators fill their caches): --benchmark, the ETA
BENCHMARK_STEPS = 20  # --benchmark-steps not given (None until the checks, so that one given alone is refused)
SDPA_BACKENDS = {"auto": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # --sdpa-backend: None, torch's

FLAGS = [  # (flag, type, default, help): the whole command line, by --help section; bool = a switch
    "data and output",
    ("--data", user_path, "python", "python (built-in, offline: Python's docs and standard library), pydoc (its docs "
     "alone), tinystories, owt (downloaded), PATH.txt or PATH.npy (ids)"),
    ("--val-data", user_path, None, "validation ids (.npy) for --data PATH.npy; default: its last 10%%"),
    ("--tokenizer", user_path, None, "folder of a vocab.json and merges.txt: the tokenizer of --data PATH.npy "
     "(default: the .npy's), or the one to tokenize text with (default: BPE trained on it; with --init-from, its "
     "run's)"),
    ("--data-dir", user_path, "data", "cache for downloads, tokenizers and token files"),
    ("--out-dir", user_path, "out", "runs are written to OUT_DIR/RUN_NAME/"),
    ("--run-name", str, None, "default: the data source's name"),
    ("--workers", int, None, "processes for tokenizer training and tokenizing; default and most: the cores it may use"),
    "model shape",
    ("--vocab-size", int, PRESET, "tokens in the vocabulary (BPE is trained to this size on text data)"),
    ("--context-length", int, PRESET, "tokens per training window"),
    ("--d-model", int, PRESET, "width of the residual stream"),
    ("--num-layers", int, PRESET, "Transformer blocks"),
    ("--num-heads", int, PRESET, "attention heads"),
    ("--d-ff", int, PRESET, "hidden width of the feed-forward network"),
    ("--rope-theta", float, 10000.0, "RoPE base"),
    "ablations (handout section 7.3; weight tying: 7.5)",
    ("--no-norm", bool, False, "remove every RMSNorm"),
    ("--post-norm", bool, False, "normalize after each residual add"),
    ("--nope", bool, False, "no position embedding (no RoPE)"),
    ("--silu-ffn", bool, False, "W2 silu(W1 x) feed-forward instead of SwiGLU"),
    ("--tie-embeddings", bool, False, "lm_head shares the embedding matrix"),
    "optimization",
    ("--optimizer", str, "adamw", "adamw, muon (Muon for the hidden matrices, AdamW for the rest), adam, rmsprop, "
     "momentum (SGD's heavy ball), sgd; each has its own default --lr (config.py's OPTIMIZERS)"),
    ("--batch-size", int, PRESET, "sequences per optimizer step, over all processes and accumulation steps"),
    ("--max-iters", int, PRESET, "optimizer steps (tinystories/owt: from --total-tokens)"),
    ("--total-tokens", int, PRESET, "instead of --max-iters: steps = total / (batch size x context length)"),
    ("--lr", float, PRESET, "peak learning rate"),
    ("--min-lr", float, None, "final learning rate of the cosine (default: --lr / 10)"),
    ("--warmup-iters", int, PRESET, "linear warm-up steps (unless given, at most 10%% of the run's steps)"),
    ("--grad-accum", int, 1, "micro-steps per optimizer step (same update, less memory)"),
    ("--beta1", float, 0.9, "AdamW beta1; momentum's mu"),
    ("--beta2", float, 0.95, "AdamW beta2; RMSProp's average of g^2 (its alpha)"),
    ("--eps", float, 1e-8, "AdamW epsilon"),
    ("--weight-decay", float, 0.1, "AdamW's (and Muon's) decoupled weight decay"),
    ("--grad-clip", float, 1.0, "clip the global gradient L2 norm (0: off)"),
    ("--seed", int, 1337, "seeds the initialization and the batch order"),
    "logging, evaluation, checkpoints",
    ("--eval-interval", int, PRESET, "steps between validation runs"),
    ("--eval-iters", int, PRESET, "batches per validation run"),
    ("--log-interval", int, 10, "steps between metrics.jsonl lines"),
    ("--checkpoint-interval", int, PRESET, "steps between checkpoints (one also at the start and the end; --sample "
     "samples the last)"),
    ("--resume", bool, False, "continue OUT_DIR/RUN_NAME/ckpt.pt; pass the same flags as the first run (a larger "
     "--max-iters extends a run; where no checkpoint is saved yet, the run starts at step 0, with a note, so one "
     "command serves a job that may be restarted)"),
    ("--init-from", user_path, None, "start a new run from the weights of the run in this folder (its shape and "
     "tokenizer unless given; a new optimizer and schedule): fine-tuning (its --resume reads it from config.json)"),
    ("--overwrite", bool, False, "start a new run where one exists (its files are replaced as the new run writes)"),
    ("--plot", bool, False, "draw loss.png (needs matplotlib)"),
    ("--tensorboard", bool, False, "also log the metrics to OUT_DIR/RUN_NAME/tensorboard/ (needs tensorboard)"),
    ("--export", user_path, None, "write the run OUT_DIR/RUN_NAME to this directory in the Hugging Face format, then "
     "exit"),
    "hardware",
    ("--device", str, None, "cpu, cuda, cuda:1, mps; default: cuda when available"),
    ("--dtype", str, None, "float32, or bf16 (bfloat16 autocast, float32 weights); default: bf16 on cuda"),
    ("--compile", bool, False, "torch.compile the model"),
    ("--fast", bool, True, "model.py's fused kernels; --no-fast runs the from-scratch reference path"),
    ("--activation-checkpointing", bool, False, "recompute each block's insides in backward: less memory"),
    ("--benchmark", bool, False, "time steps on random tokens (tokens/s; MFU: achieved / peak FLOP/s); writes nothing"),
    ("--benchmark-steps", int, None, f"timed steps after {UNTIMED_STEPS} untimed ones (default: {BENCHMARK_STEPS})"),
    "the fast path's levers (each tested to compute the same step; bench.py gpu measures each)",
    ("--fused-head", bool, None, "the head's matmul and the loss over chunks of rows (fused_head.py): no (batch x "
     "context, vocab) logits held; --no-fused-head: the logits, then the loss (default: on with --fast, except a step "
     "compiled on a GPU without CUDA graphs, where its launches cost more than it saves: docs/results.md)"),
    ("--bf16-residual", bool, None, "under bf16 autocast, the residual stream between blocks in bfloat16, not float32 "
     "(half the bytes the norms and adds move; default: on with --fast and --dtype bf16 on a GPU)"),
    ("--triton-gate", bool, None, "SwiGLU's gate as one Triton kernel each way (fast_gpu.py; on a GPU with triton; "
     "default: on where the compiled step replays as CUDA graphs, which hide its launches)"),
    ("--sdpa-backend", str, "auto", "attention kernel: auto (torch's choice), flash, cudnn, efficient (CUDA), math"),
    ("--cuda-graph", bool, None, "replay the compiled forward and backward as CUDA graphs (with --compile on CUDA; "
     "default: on there, for one process and --grad-accum 1)"),
    ("--max-autotune", bool, False, "torch.compile times several kernels per matmul and keeps the fastest (minutes "
     "more compiling)"),
    "samples at the end, or of a trained run",
    ("--sample", bool, False, "print samples of the run OUT_DIR/RUN_NAME as it stands, then exit; writes nothing"),
    ("--num-samples", int, 3, "samples per prompt: in samples.txt at the end, or printed by --sample"),
    ("--sample-tokens", int, 200, "new tokens per sample"),
    ("--temperature", float, 0.8, "0 = greedy"),
    ("--top-p", float, 0.95, "nucleus sampling threshold"),
    ("--prompt", user_text, "", "text the samples continue; default: a new document; -: each line of stdin (--sample)"),
]


# --optimizer's names -> the factor on the preset's --lr (AdamW's) it takes unless --lr is given. Muon's
# update has AdamW's RMS (optim.Muon) and Adam is AdamW: 1. RMSProp steps each coordinate by about lr (no momentum
# averages the noise away): 0.3. SGD's step is lr times a gradient of norm <= --grad-clip 1 over 1.4M parameters:
# 600 (lr 3, by short probes: docs/results.md); heavy-ball momentum moves 1 / (1 - 0.9) = 10 times as far: 60.
# experiments.py optimizers sweeps 1/3, 1, 3 and 9 times each (docs/results.md).
OPTIMIZERS = {"adamw": 1.0, "muon": 1.0, "adam": 1.0, "rmsprop": 0.3, "momentum": 60.0, "sgd": 600.0}
# the flags an --optimizer does not read (train.make_optimizer: momentum's mu is --beta1, RMSProp's alpha --beta2)
UNREAD_BY = {"sgd": ("beta1", "beta2", "eps", "weight_decay"), "momentum": ("beta2", "eps", "weight_decay"),
             "rmsprop": ("beta1", "weight_decay"), "adam": ("weight_decay",)}


# Each flag's own default (not a preset's): what a run config saved before that flag existed ran with, so that
# --resume and experiments.py read an older run as the same run (a run from before --optimizer trained with AdamW).
FLAG_ROWS = {row[0][2:].replace("-", "_"): row for row in FLAGS if not isinstance(row, str)}  # cfg's key -> its row
FLAG_DEFAULTS = {key: row[2] for key, row in FLAG_ROWS.items() if row[2] is not PRESET}


MODEL_KEYS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "no_norm",
              "post_norm", "nope", "silu_ffn", "tie_embeddings")  # the shape and the ablations


DATA_KEYS = ("data", "data_dir", "vocab_size", "val_data", "workers", "tokenizer")  # prepare_data's arguments


def model_kwargs(cfg=None):
    """TransformerLM's arguments from a cfg: this run's, a saved config.json, or (None) the flags' defaults."""
    cfg = {**FLAG_DEFAULTS, **PRESETS["small"]} if cfg is None else cfg  # (no parser built)
    return {k: cfg[k] for k in (*MODEL_KEYS, "fast")}


# ----------------------------------------------------------------------------
# 2. The rules: one row per mistake, checked in order (the first wrong row stops, so rows rely on those above)

MIN_TEXT_VOCAB = 256 + 1  # BPE on text: every byte, and the end-of-text token


FLOAT32_TINY = torch.finfo(torch.float32).tiny  # its smallest normal number: AdamW adds eps in float32, where less is 0
FLOAT32_MAX = torch.finfo(torch.float32).max  # its largest: AdamW's numbers are float32, where more is inf


NUMBER_RULES = [  # (must ..., is_wrong(value), applies(flag key, value)); torch takes 64-bit integers, but its CPU
    # generator keeps a seed's low 32 bits (seed + 1 seeds evaluation); NaN passes every comparison, so finiteness first
    ("be a finite number", lambda v: not math.isfinite(v), lambda k, v: type(v) is float),
    (f"not be a subnormal number (0 < |x| < {sys.float_info.min:.3g}: a CPU run flushes it to 0)",
     lambda v: 0 < abs(v) < sys.float_info.min, lambda k, v: type(v) is float),
    ("lie in [0, 2**32 - 1) (torch's CPU generator keeps 32 bits: 2**32 ran as 0)", lambda v: not 0 <= v < 2**32 - 1,
     lambda k, v: k == "seed"),
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
    step size a_t = lr sqrt(1 - beta2^t) / (1 - beta1^t) is at most lr / (1 - beta1), its decay 1 - lr weight_decay.
    A decay factor below 0 (lr x weight_decay > 1) is taken: it diverges, which the lr sweep is there to show."""
    if c["optimizer"] not in ("adamw", "adam", "muon"):  # the others have no bias correction and no decay
        return ""
    step, decay = c["lr"] / (1 - c["beta1"]), c["lr"] * c["weight_decay"] * (c["optimizer"] != "adam")
    if step > FLOAT32_MAX:
        return (f"--lr {c['lr']} is too large: AdamW's bias correction scales its step size by up to 1 / (1 - "
                f"--beta1), to {step:.3g}, above float32's largest number {FLOAT32_MAX:.3g}, where the run computes; "
                "lower --lr.")
    if decay > FLOAT32_MAX:
        return (f"--lr {c['lr']} x --weight-decay {c['weight_decay']} = {decay:.3g}, AdamW's decay, is above float32's "
                f"largest number {FLOAT32_MAX:.3g}, where the run computes; lower one of them.")
    return ""


EMPTY_PATHS = {  # a path flag given as '' (an unset shell variable: --tokenizer "$TOK") -> what to pass instead
    "data": f"{', '.join(CORPORA)}, a .txt file or a .npy file",
    "val_data": "a .npy file of held-out ids, or drop it",
    "tokenizer": "the folder of a vocab.json and merges.txt, or drop it",
    "init_from": "a trained run's folder, or drop it",
    "out_dir": "a folder (. for this one)",
    "data_dir": "a folder (. for this one)",
}


def refuse_empty_paths(cfg):
    """UsageError for the first path flag given as '': the system reads it as the current folder, unasked (--out-dir
    '' wrote there, --init-from '' read it), and train.py took --tokenizer '' and --val-data '' for flags not given."""
    if flag := next((k for k in EMPTY_PATHS if cfg[k] == ""), None):
        raise UsageError(f"--{flag.replace('_', '-')} is empty; pass {EMPTY_PATHS[flag]}.")


def trains(c):  # a training run, not a mode that reads a run (--sample, --export) or times steps (--benchmark)
    return not (c["sample"] or c["export"] is not None or c["benchmark"])


NAME_ROOM = len("-0123abcd.sha256") + TMP_ROOM  # what the project adds to a name it derives: data.py's digest memo
# "NAME-<8 hex digits>.sha256", and a temporary's ".NAME.cs336tmp<pid>" around that


def too_long(c):
    """The first path flag the file system would refuse (ENAMETOOLONG) once the project adds its
    suffixes, as a sentence, or "": a name over NAME_MAX bytes, one the project derives names from (the data's file,
    --val-data's, the run's) over NAME_MAX - NAME_ROOM, or a path near PATH_MAX. The folders above are only read."""
    for flag in ("data", "val_data", "data_dir", "out_dir", "run_name"):
        if not c[flag] or (flag == "data" and not c["data_is_file"]):  # --data python, tinystories, owt: no path
            continue
        names = [len(os.fsencode(part)) for part in Path(c[flag]).parts] or [0]
        longest = max(max(names), names[-1] + NAME_ROOM if flag in ("data", "val_data", "run_name") else 0)
        if longest > NAME_MAX or len(os.fsencode(os.path.abspath(c[flag]))) > PATH_MAX - 2 * NAME_MAX:
            return (f"--{flag.replace('_', '-')} is too long for the file system (with what the run adds: names of at "
                    f"most {NAME_MAX} bytes, {NAME_MAX - NAME_ROOM} for a data file's or a run's, paths of at most "
                    f"{PATH_MAX - 2 * NAME_MAX}); pass a shorter one.")
    return ""


def training_bytes(c):
    """The least memory one process's training step takes (accounting.py's formulas): float32 weights and gradients
    (bf16 autocast keeps them float32 too), the optimizer's state, one micro-batch's logits (the fused head holds a
    chunk of them) and what autograd keeps of its forward (bf16 halves it): the reference path's exact count; the
    fast path's fused attention keeps no T x T scores, and what every fast graph keeps of a block counts (its input,
    q, k, v, attention's output, W1 x and W3 x); activation checkpointing keeps each block's input, and one block's
    insides while it is recomputed."""
    dims = c["vocab_size"], c["d_model"], c["num_layers"], c["d_ff"]
    counts = accounting.lm_param_counts(*dims, silu_ffn=c["silu_ffn"], no_norm=c["no_norm"],
                                        tie_embeddings=c["tie_embeddings"])
    state = 2 * accounting.FP32_BYTES * sum(counts.values()) + accounting.optimizer_state_bytes(c["optimizer"], counts)
    B, T, half = c["batch_size"] // (c["world_size"] * c["grad_accum"]), c["context_length"], c["dtype"] == "bf16"
    N, L, d, ffn = B * T, c["num_layers"], c["d_model"], (1 if c["silu_ffn"] else 2) * c["d_ff"]
    outside, one = (accounting.saved_activation_bytes(B, T, d, c["num_heads"], c["d_ff"], n) for n in (0, 1))
    block = accounting.FP32_BYTES * N * (5 * d + ffn) if c["fast"] else one - outside  # what one block keeps
    inputs = accounting.FP32_BYTES * N * d * (L - 1)  # the other blocks' inputs, under checkpointing
    saved = outside + block + (inputs if c["activation_checkpointing"] else (L - 1) * block)
    logits = B * T * c["vocab_size"] * (accounting.BF16_BYTES if half else accounting.FP32_BYTES)
    logits //= fused_head.CHUNKS if c["fused_head"] else 1  # the fused head: one chunk at least
    return state + logits + saved // (2 if half else 1)


def gate_runs(c):  # --triton-gate's kernels can run here (CHECKS names each condition a given --triton-gate fails)
    return c["device"].startswith("cuda") and c["fast"] and not c["silu_ffn"] and fast_gpu.triton is not None


def levers_on(cfg):  # the fast path's switches a run has on, as flags: "--fused-head --bf16-residual", or "none"
    keys = ("cuda_graph", "fused_head", "triton_gate", "bf16_residual", "max_autotune")
    return " ".join(FLAG_ROWS[k][0] for k in keys if cfg[k]) or "none"


def too_big(c):  # the run would not fit in memory: a sentence with the estimate, or ""
    need, (have, what) = training_bytes(c), memory_bytes(c["device"], c["world_size"])
    if need <= have:
        return ""
    return (f"this model and batch need at least {need / 2**30:,.1f} GiB to train (weights, gradients, "
            f"{c['optimizer']} state, one micro-batch's logits and activations), more than {what} "
            f"({have / 2**30:,.1f} GiB); lower "
            "--batch-size (or raise --grad-accum), --vocab-size, --d-model, --d-ff, --num-layers or --context-length.")


DATA_CHECKS = [  # the rows of a run that tokenizes its text: --benchmark (random tokens) skips them, experiments.py not
    (lambda c: not c["data_is_ids"] and not writable(Path(c["data_dir"])) and not c["cached"](),
     "--data-dir {data_dir} is not a writable directory (a file, or read-only) for the token cache, and does not hold "
     "this data's tokens already; pick another."),
    (lambda c: not c["data_is_ids"] and c["vocab_size"] < MIN_TEXT_VOCAB,
     f"--vocab-size {{vocab_size}} is too small for BPE on text data: 256 bytes + 1 special token need {MIN_TEXT_VOCAB}."),
]


COMPILER_HINT = {"darwin": "xcode-select --install", "win32": "Visual Studio's C++ build tools"}.get(
    sys.platform, "e.g. apt install g++")  # what --compile's refusal suggests installing

CHECKS = [  # (is_wrong(c), message or message(c)), in order; the first wrong row stops, so rows rely on those above
    (lambda c: bad_environment(), lambda c: bad_environment()),
    (lambda c: c["max_iters"] is not None and c["total_tokens"] is not None,
     "--max-iters and --total-tokens both set the run length; pass only one of them."),
    (bad_number, bad_number),
    (lambda c: c["optimizer"] not in OPTIMIZERS, f"--optimizer {{optimizer}}: use one of {', '.join(OPTIMIZERS)}."),
    (adamw_overflow, adamw_overflow),
    (too_long, too_long),
    (lambda c: c["max_iters"] is None and c["total_tokens"] < c["batch_size"] * c["context_length"],
     "--total-tokens {total_tokens} is smaller than one batch (batch size x context length); raise it."),
    (lambda c: c["data_is_file"] and c["reads_data"] and unreadable(c["data"]),
     lambda c: f"--data {c['data']}{unreadable(c['data'])}; pass {', '.join(CORPORA)}, a .txt file or a .npy file."),
    (lambda c: c["data_is_file"] and c["reads_data"] and Path(c["data"]).stat().st_size == 0,
     "--data {data} is empty; pass a file with text or token ids."),
    (lambda c: c["val_data"] and not c["data_is_ids"],
     "--val-data goes with --data PATH.npy only; text data is split automatically."),
    (lambda c: c["val_data"] and c["reads_data"] and unreadable(c["val_data"]),
     lambda c: f"--val-data {c['val_data']}{unreadable(c['val_data'])}."),
    *[(lambda c, wrong=wrong: trains(c) and wrong(c), message) for wrong, message in
      DATA_CHECKS],
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
    (lambda c: c["init_from"] is not None and (c["benchmark"] or c["sample"] or c["export"] is not None),
     "--init-from starts a training run from another run's weights; drop it with --benchmark, --sample and --export."),
    (lambda c: c["sample"] and c["num_samples"] == 0, "--sample with --num-samples 0 prints nothing; pass 1 or more."),
    (lambda c: c["world_size"] > 1 and (c["sample"] or c["export"] is not None),  # each process would do it again
     "--sample and --export read a run in one process; run them with python train.py, not torchrun."),
    (lambda c: c["benchmark_steps"] is not None and not c["benchmark"],  # a training run started in its place
     "--benchmark-steps counts the steps --benchmark times; pass --benchmark too, or drop --benchmark-steps."),
    (lambda c: c["prompt"] == "-" and not c["sample"],
     "--prompt - reads prompts from stdin for --sample only; pass the prompt's text."),
    (lambda c: c["prompt"] == "-" and sys.stdin is None,  # fd 0 closed (`<&-`, a job runner): Python's None
     "--prompt - reads prompts from stdin, which is closed; give it a file or a pipe (< prompts.txt), or pass the "
     "prompt's text."),
    (lambda c: c["batch_size"] % (c["world_size"] * c["grad_accum"]), lambda c: f"--batch-size {c['batch_size']} does "
     f"not divide into {counted(c['world_size'], 'process')} x --grad-accum {c['grad_accum']}; make it a multiple of "
     "their product."),
    (lambda c: device_error(c["device"]), lambda c: f"--device {c['device']}: {device_error(c['device'])}"),
    (lambda c: c["dtype"] not in ("float32", "bf16"), "--dtype {dtype}: use float32 or bf16."),
    (lambda c: c["dtype"] == "bf16" and c["device"].startswith("cuda") and not torch.cuda.is_bf16_supported(),
     "--dtype bf16: this GPU has no bfloat16 support; use --dtype float32."),
    (lambda c: c["sdpa_backend"] not in SDPA_BACKENDS,
     f"--sdpa-backend {{sdpa_backend}}: use {', '.join(SDPA_BACKENDS)}."),
    (lambda c: c["sdpa_backend"] in ("cudnn", "efficient") and not c["device"].startswith("cuda"),
     "--sdpa-backend {sdpa_backend} is a CUDA kernel; on {device} pass auto, flash or math."),
    (lambda c: c["sdpa_backend"] != "auto" and not c["fast"],
     "--sdpa-backend picks the fast path's attention kernel, and --no-fast runs model.py's own; drop one of them."),
    (lambda c: c["fused_head"] and not c["fast"],  # given (off by default there): it was dropped without a word
     "--fused-head is a kernel of the fast path, and --no-fast runs model.py's logits and loss; drop one of them."),
    (lambda c: c["triton_gate"] and not c["device"].startswith("cuda"),
     "--triton-gate runs Triton kernels on a GPU; on {device} drop it."),
    (lambda c: c["triton_gate"] and not c["fast"],
     "--triton-gate is a kernel of the fast path, and --no-fast runs model.py's own; drop one of them."),
    (lambda c: c["triton_gate"] and c["silu_ffn"],
     "--triton-gate computes SwiGLU's gate, which --silu-ffn's ungated FFN does not have; drop one of them."),
    (lambda c: c["triton_gate"] and fast_gpu.triton is None,
     "--triton-gate needs triton, which this torch lacks: pip install triton (or drop --triton-gate)."),
    (lambda c: c["bf16_residual"] and c["dtype"] != "bf16",
     "--bf16-residual narrows the residual stream under bf16 autocast; with --dtype {dtype} drop it, or pass --dtype "
     "bf16."),
    (lambda c: (c["cuda_graph"] or c["max_autotune"]) and not c["compile"],
     "--cuda-graph and --max-autotune change how torch.compile builds the step; pass --compile too."),
    (lambda c: c["cuda_graph"] and not c["device"].startswith("cuda"),
     "--cuda-graph replays the compiled step on a GPU; on {device} drop it."),
    (lambda c: c["cuda_graph"] and c["grad_accum"] > 1,  # a graph's outputs live in its memory until it replays
     "--cuda-graph with --grad-accum {grad_accum}: each micro-step's replay would overwrite the gradients the last one "
     "left in the graphs' memory; drop one of them."),
    (lambda c: c["export"] is None and not c["sample"] and too_big(c), too_big),  # before anything is allocated
    (lambda c: c["plot"] and trains(c) and importlib.util.find_spec("matplotlib") is None,  # others draw nothing
     "--plot needs matplotlib: pip install matplotlib (or drop --plot)."),
    (lambda c: c["tensorboard"] and trains(c) and importlib.util.find_spec("tensorboard") is None,
     "--tensorboard needs the tensorboard package: pip install tensorboard (or drop --tensorboard)."),
    (lambda c: c["run_name"].strip() in ("", ".", "..") or "/" in c["run_name"] or os.sep in c["run_name"]
     or any(ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in "\u2028\u2029" for ch in c["run_name"]),  # a log's lines
     "--run-name {run_name!r} must be one plain name inside --out-dir (no '/' or control character such as a line "
     "break, not '..', '.' or blank); pick another."),
    (lambda c: trains(c) and run_dir_problem(c), run_dir_problem),
    (lambda c: c["compile"] and c["export"] is None  # last: it takes seconds (--sample's generate compiles too)
     and compile_error(c["device"]),
     lambda c: f"--compile needs a working C++ compiler (torch inductor failed on {c['device']}: "
               f"{compile_error(c['device'])}); install one ({COMPILER_HINT}) or drop --compile."),
]


def check_flags(cfg, rows=CHECKS):
    """UsageError at the first of rows (CHECKS) cfg fails. What the rows ask of the data: is --data a file (not a
    corpus name), does it hold ids, is it read (not by --sample, --export: it names their run), and does --data-dir
    hold its tokens already (a read-only one will do)?"""
    c = dict(cfg, data_is_file=cfg["data"] not in CORPORA, data_is_ids=is_ids(cfg["data"]),  # --sample and --export
             reads_data=not (cfg["sample"] or cfg["export"] is not None),  # read the run alone: its data may be gone
             cached=lambda: is_cached(cfg["data"], cfg["data_dir"], cfg["vocab_size"], cfg["tokenizer"]))
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
    made = tok is not None and cfg["tokenizer"] is None and not is_ids(cfg["data"])  # BPE trained on --data's text
    if made and cfg["num_samples"] == 0 and len(tok.vocab) < cfg["vocab_size"]:  # with samples: refused below
        log(f"note: the BPE tokenizer of --data {cfg['data']} has {len(tok.vocab):,} tokens, not --vocab-size "
            f"{cfg['vocab_size']:,} (the text has no pair left to merge): ids {len(tok.vocab):,} and up are never "
            "seen.")
    if tok is None or cfg["num_samples"] == 0:
        return
    n, V, where = len(tok.vocab), cfg["vocab_size"], tok_files[0]
    # a run's model (resumed, or --init-from's) keeps its vocabulary: another --vocab-size is refused (verify_resume,
    # verify_init), so only fewer samples goes on
    kept = "pass --num-samples 0 (the model's vocabulary is its run's)" if cfg["resume"] or cfg["init_from"] else ""
    if top >= n:
        raise UsageError(f"the data holds token id {top}, but {where}, which decodes the samples, has {n} tokens; "
                         f"{kept or 'use the tokenizer that made the ids, or --num-samples 0'}.")
    if V > n and kept:  # the size came with the run's model, often from no flag: the sentence names the run, and its
        run = run_dir(cfg) if cfg["resume"] else cfg["init_from"]  # tokenizer as its, not as the token cache's copy
        model = f"the model of the run in {run}" if cfg["resume"] else f"--init-from {run}'s model"
        its = "its tokenizer" if same_folder(cfg["tokenizer"], run) else where
        raise UsageError(f"{model} reads {V} token ids, but {its} has {n} tokens, so samples could hold ids that no "
                         "token decodes; pass --num-samples 0.")
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
        highest = max(tok.encode(text), default=-1)  # --prompt's bytes are UTF-8 (cli.user_text): it encodes
        if highest >= V:
            raise UsageError(f"{what} encodes to token id {highest}, at or above --vocab-size {V}, so the model cannot "
                             f"read it; {kept or 'pass a larger --vocab-size, or --num-samples 0'}.")


LONG_CPU_RUN = 3 * 3600  # seconds: a CPU run that needs longer is told so, once (tinystories' is days on a CPU)


def note_long_run(cfg, seconds_left):
    """At the first ETA (seconds_left, None before it): a CPU run that would need more than LONG_CPU_RUN is told so
    in one line, with what trains in minutes on a CPU. Returns True once the ETA is known (asked no more)."""
    if seconds_left is not None and seconds_left > LONG_CPU_RUN and torch.device(cfg["device"]).type == "cpu":
        log(f"note: at this speed the run needs about {fmt_time(seconds_left)} more on the "
            f"CPU ({cfg['max_iters']:,} steps of {cfg['batch_size'] * cfg['context_length']:,} tokens), a job for a "
            "GPU. On a CPU, `python train.py` (the built-in corpus) trains in minutes, or pass a smaller --max-iters; "
            "Ctrl-C stops this run with a checkpoint.")
    return seconds_left is not None


# ----------------------------------------------------------------------------
# 3. resolve_config: flags -> one flat dict

def rounded(x):  # x without float noise: 3e-3 / 10 is 3.0000000000000003e-04, rounded 3e-4
    return float(f"{x:.15g}")


def flags_parser(prog, description, flags, presets):
    """A table of (flag, type, default, help) rows and section titles -> its Parser. bool: a switch (one on by
    default, or decided later (None), also gets --no-...); default PRESET: None, filled in later, and --help lists
    each preset's value."""
    p = group = Parser(prog=prog, description=description)
    for row in flags:
        if isinstance(row, str):  # a section title
            group = p.add_argument_group(row)
        elif row[1] is bool:  # --fast is on by default (or None: decided later), so it also gets a --no-fast
            group.add_argument(row[0], action="store_true" if row[2] is False else argparse.BooleanOptionalAction,
                               default=row[2], help=row[3] + (" (default: on)" if row[2] else ""))
        else:
            name, kind, default, text = row
            shown = "" if default in (None, "") else f" (default: {default})"
            if default is PRESET:  # e.g. "(default: small 2048; tinystories 10000; owt 32000)"
                key = name[2:].replace("-", "_")
                shown = f" (default: {'; '.join(f'{n} {v[key]}' for n, v in presets.items() if v[key] is not None)})"
            group.add_argument(name, type=kind, default=None if default is PRESET else default, help=text + shown)
    return p


def build_parser():  # FLAGS as argparse: a mistake is one sentence and exit code 2 (cli.Parser)
    return flags_parser("train.py", "Train a Transformer LM (CS336 assignment 1). With no flags: a small model "
                               "on Python's own documentation and standard library, offline, in minutes on a CPU. Defaults marked "
                               "small/tinystories/owt depend on --data: small for python, pydoc and local files.", FLAGS, PRESETS)


def given_flags(argv):
    """{key: value} of the flags the command line sets, as train.py's parser reads them (abbreviated, as
    --flag=value, the last one given winning): parsed again with every default a marker."""
    unset, parser = object(), build_parser()
    parser.set_defaults(**dict.fromkeys(FLAG_ROWS, unset))
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not unset}


# each shape and trajectory key of a saved run config, with its flag's type (--data's paths aside: a str or None)
SAVED_TYPES = {k: FLAG_ROWS[k][1] for k in (*MODEL_KEYS, *TRAJECTORY_KEYS)
               if FLAG_ROWS[k][1] in (int, float, bool, str)}


def checked_run_config(run):
    """rundir.saved_config, its values checked: a config.json edited by hand into another type than the flag's (d_model
    "32", null) was compared as it is ("trained with --d-model 32, not 32") or built with (a traceback); UsageError
    naming the key. An int for a float (JSON's 10000 for 10000.0) is that float."""
    config = saved_config(run)
    for k, kind in SAVED_TYPES.items() if config is not None else ():
        if k in config:
            config[k] = as_kind(config[k], kind)
        if k in config and type(config[k]) is not kind:
            raise UsageError(f"{Path(run) / 'config.json'} holds {k} = {short_repr(config[k])}, where "
                             f"{FLAG_ROWS[k][0]} takes {'an' if kind is int else 'a'} {kind.__name__}; put back the "
                             "value the run was trained with, or delete config.json (its ckpt.pt holds the run's "
                             "config too).")
    return config


def same_start(cfg, recorded):
    """--resume: the --init-from a run began with (recorded, from its config.json; None if it was no fine-tune), which
    need not be given again; UsageError for another."""
    recorded = recorded if isinstance(recorded, str) and recorded else None
    given = cfg["init_from"]
    if given is not None and not same_folder(given, recorded):
        began = f"began from --init-from {recorded}" if recorded else "began without --init-from"
        raise UsageError(f"--resume: {run_dir(cfg)} {began}, not {given}; drop --init-from (a run keeps "
                         "its start).")
    return recorded


def same_run(cfg, recorded, given, mode):
    """--sample and --export take a run as it was trained: UsageError for a shape or training flag given with another
    value than the run's config (recorded: config.json's, else ckpt.pt's) holds, each resolved (--total-tokens: what
    it trains, whole batches); the training command with the mode added passes (a fine-tune's without --init-from)."""
    keys = [k for k in (*MODEL_KEYS, *TRAJECTORY_KEYS, "total_tokens") if k in given and k in recorded
            and k not in ("data", "val_data", "seed", "dtype") and recorded[k] != cfg[k]]
    trained = {}  # ckpt.pt's config, read once and only where a flag differs (a checkpoint is read whole)
    if keys:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            trained = read_checkpoint(run_dir(cfg) / "ckpt.pt").get("config")
    # a flag ckpt.pt was trained with: config.json is another run's beside it, which read_run names, not the flag
    k = next((k for k in keys if not (isinstance(trained, dict) and trained.get(k) == cfg[k])), None)
    if k is not None:
        flag, shown = FLAG_ROWS[k][0], [("on" if v else "off") if type(v) is bool else v for v in (recorded[k], cfg[k])]
        raise UsageError(f"{mode}: {run_dir(cfg)} was trained with {flag} {shown[0]}, not {shown[1]}; drop {flag} "
                         "(it reads the run as it was trained).")


def same_tokenizer(cfg, recorded, mode):
    """same_run's --tokenizer, checked before --vocab-size is (a tokenizer's size would be blamed on it): the run is
    read with the tokenizer it was trained with (its copy beside ckpt.pt), so UsageError for another: neither the
    folder it was given (however spelled) nor files equal to its own."""
    given = cfg["tokenizer"]
    if given is None or same_folder(given, recorded.get("tokenizer")):
        return
    with contextlib.suppress(OSError):  # no pair there: another tokenizer
        if holds_tokenizer(given, recorded.get("data_fingerprint")):
            return  # the same files (its own copy, the folder beside its ids): the same tokenizer
    raise UsageError(f"{mode}: {run_dir(cfg)} was trained with {tokenizer_origin(recorded, run_dir(cfg))[0]}, not "
                     f"--tokenizer {given}; drop --tokenizer (it reads the run as it was trained).")


def other_pair(folder, run):  # are folder's vocab.json and merges.txt not the run's, byte for byte? (both there)
    return any(a.read_bytes() != b.read_bytes() for a, b in zip(tokenizer_files(folder), tokenizer_files(run)))


def init_from_defaults(cfg, given, run, old, who):
    """The shape and tokenizer a run starts from, in folder run (--init-from's; a resumed fine-tune's own, which its
    start may since have left): old, its run config (rundir.saved_config: config.json's, else ckpt.pt's; None if
    neither reads), for each shape flag not given (a switch off by default, too), and its tokenizer unless --tokenizer
    is. who names run in a sentence. UsageError where it holds no run, or no tokenizer for text; train.py checks its
    checkpoint (rundir.verify_init)."""
    if old is None and (run / "ckpt.pt").exists():  # config.json gone too: nothing else tells its shape
        raise UsageError(f"{who} has no readable config.json, and its ckpt.pt cannot be read either; restore the run "
                         "from a copy, or start from another run.")
    if old is None:
        inside = f" (the run is {run.parent})" if run.is_file() else ""  # its ckpt.pt, say
        raise UsageError(f"{who} holds no run (no readable config.json or ckpt.pt); pass the folder of a trained "
                         f"run{inside}.")
    shape = {k: old[k] for k in MODEL_KEYS if k not in given and k in old}
    has_tokenizer = all(f.exists() for f in tokenizer_files(run))
    ids_folder = Path(cfg["data"]).parent
    beside = tokenizer_files(ids_folder)  # the tokenizer that made --data's ids, if it is there
    if is_ids(cfg["data"]) and not cfg["tokenizer"] and 0 < sum(f.exists() for f in beside) < 2:
        raise UsageError(f"--data {cfg['data']} has half a tokenizer beside it (vocab.json or merges.txt alone), so "
                         f"the one that made its ids cannot be told from {who}'s; restore the pair, or pass "
                         f"--tokenizer {shlex.quote(str(run))} if these ids are its.")
    if is_ids(cfg["data"]) and has_tokenizer and not cfg["tokenizer"] and all(f.exists() for f in beside) \
            and other_pair(ids_folder, run):
        raise UsageError(f"--data {cfg['data']} was made by the tokenizer beside it, not by {who}'s, so "
                         f"the model would read its ids as other tokens; encode the text with {run}'s (bpe.py encode "
                         f"FILE --tokenizer {shlex.quote(str(run))} --out IDS.npy), or pass --tokenizer "
                         f"{shlex.quote(str(run))} if these ids are its.")
    theirs = cfg["tokenizer"] and not same_folder(cfg["tokenizer"], run)  # another tokenizer, of the same size too
    if theirs and not cfg["resume"] and has_tokenizer and all(f.is_file() for f in tokenizer_files(cfg["tokenizer"])) \
            and other_pair(cfg["tokenizer"], run):
        raise UsageError(f"--tokenizer {cfg['tokenizer']} is not {who}'s tokenizer, so the model would read its ids "
                         f"as other tokens; drop --tokenizer to take the run's, or start from a run trained with it.")
    if not (cfg["tokenizer"] or has_tokenizer or is_ids(cfg["data"])):
        text, lack = not is_ids(str(old.get("data", ""))), [f.name for f in tokenizer_files(run) if not f.exists()]
        if text or len(lack) == 1:  # a text run's pair deleted, or half of any: damage, not a run of ids
            raise UsageError(f"{who} lacks its {' and '.join(lack)}{' (it trained on text)' if text else ''}; "
                             "restore the pair from a copy.")
        raise UsageError(f"{who} has no tokenizer (it trained on token ids alone), so it cannot read text; "
                         "pass --data as the token ids its tokenizer made (bpe.py encode).")
    return {**shape, "tokenizer": cfg["tokenizer"] or (str(run) if has_tokenizer else None)}


def start_from(cfg, argv):
    """In cfg: the run this one starts from (a resumed fine-tune's --init-from is its own, given or not: same_start),
    its shape and tokenizer unless given (init_from_defaults), and --vocab-size: a tokenizer's size (ids_vocab_size),
    except where model and tokenizer are both a run's own, which came together (its vocabulary may be padded past its
    tokenizer's): verify_init checks the shape, check_samples what samples need. A resumed run's --data-dir not given
    is its own, where that folder is still there."""
    sized_by = None  # names the run whose vocabulary --vocab-size holds, where its shape came from one
    own = checked_run_config(run_dir(cfg)) if cfg["resume"] else None  # a run under way: config.json, else ckpt.pt
    if own is not None:  # a fine-tune's --init-from is its own, given or not (None: not a fine-tune)
        cfg["init_from"] = same_start(cfg, own.get("init_from"))
        mine = own.get("data_dir")
        if "data_dir" not in given_flags(argv) and isinstance(mine, str) and os.path.isdir(mine):
            cfg["data_dir"] = mine  # (as typed from here: from_here) from another folder, the default
            # ./data would make its tokens again, or download its corpus again
    elif cfg["init_from"] is not None:  # recorded so that --resume finds it from any folder (an old run's, relative,
        cfg["init_from"] = os.path.abspath(cfg["init_from"])  # from where it began); symlinks kept as named
    if cfg["init_from"] is not None:  # the shape and tokenizer it starts from (a resumed run's: its own), unless given
        given, run = given_flags(argv), run_dir(cfg) if own is not None else Path(cfg["init_from"])
        who = f"the run {run}" if own is not None else f"--init-from {run}"
        cfg.update(init_from_defaults(cfg, given, run, own if own is not None else checked_run_config(run), who))
        its_own = "tokenizer" not in given or same_folder(cfg["tokenizer"], run)  # however spelled
        if its_own and cfg["vocab_size"] is not None:  # the run's own pair
            return
        sized_by = None if "vocab_size" in given else who
    cfg["vocab_size"] = ids_vocab_size(cfg["data"], cfg["tokenizer"], cfg["vocab_size"], sized_by)  # a tokenizer's


def lever_defaults(cfg):
    """The fast path's switches not given, in place. The levers a GPU decided (docs/results.md, H200): CUDA graphs with
    the fused head and the Triton gate won at both shapes; without graphs those two kernels' launches cost the host
    more time than they save the GPU."""
    compiled_gpu = cfg["compile"] and cfg["device"].startswith("cuda")
    if cfg["cuda_graph"] is None:
        cfg["cuda_graph"] = compiled_gpu and cfg["grad_accum"] == 1 and cfg["world_size"] == 1
    if cfg["fused_head"] is None:  # on a CPU it is faster and smaller than the logits path; --no-fast: model.py's own
        cfg["fused_head"] = cfg["fast"] and (not compiled_gpu or cfg["cuda_graph"])
    if cfg["triton_gate"] is None:  # compiled_gpu first: a --cuda-graph given on a CPU gets its own refusal
        cfg["triton_gate"] = compiled_gpu and cfg["cuda_graph"] and gate_runs(cfg)
    if cfg["bf16_residual"] is None:  # less time and memory on the H200; slower on a CPU (docs/results.md)
        cfg["bf16_residual"] = cfg["fast"] and cfg["dtype"] == "bf16" and cfg["device"].startswith("cuda")


def resolve_config(argv=None):
    """Flags -> one flat dict: the preset of --data fills what was not given, the environment decides
    device and processes, check_flags refuses mistakes, then the derived values. Raises UsageError."""
    parser = build_parser()
    cfg = vars(parser.parse_args(argv))
    refuse_empty_paths(cfg)  # before any is read: run_dir, --init-from's run
    cfg["run_name"] = Path(cfg["data"]).stem if cfg["run_name"] is None else cfg["run_name"]  # python, a file's name
    mode = "--sample" if cfg["sample"] else "--export" if cfg["export"] is not None else None
    recorded = checked_run_config(run_dir(cfg)) if mode else None  # a trained run, read as it was trained (same_run)
    if recorded is not None:
        same_tokenizer(cfg, recorded, mode)
    start_from(cfg, argv)
    # the paths as typed (the run's messages name them so) and resolved: a command in another folder, reading this
    # run's config, names them from where it runs (rundir.from_here)
    cfg["abs_paths"] = {k: os.path.abspath(cfg[k]) for k in PATH_KEYS
                        if cfg[k] and not (k == "data" and cfg[k] in CORPORA)}  # a corpus name is no path
    warmup_given, min_lr_given = cfg["warmup_iters"] is not None, cfg["min_lr"] is not None
    length_given = cfg["max_iters"] is not None or cfg["total_tokens"] is not None
    preset = PRESETS.get(cfg["data"], PRESETS["small"])
    rate = OPTIMIZERS.get(cfg["optimizer"], 1.0)  # an unknown name is refused below (CHECKS)
    for key, value in dict(preset, lr=preset["lr"] * rate).items():
        if cfg[key] is None and not (length_given and key in ("max_iters", "total_tokens")):
            cfg[key] = value
    cfg["min_lr"] = rounded(cfg["lr"] * MIN_LR_SHARE) if cfg["min_lr"] is None else cfg["min_lr"]
    cfg["world_size"], cfg["rank"] = env_int("WORLD_SIZE") or 1, RANK  # torchrun's (checked)
    cfg["device"] = run_device(cfg["device"])  # cpu:0 is cpu (a CPU run's settings)
    cfg["dtype"] = cfg["dtype"] or ("bf16" if cfg["device"].startswith("cuda") else "float32")
    lever_defaults(cfg)
    if cfg["device"].startswith("cuda") and cfg["world_size"] > 1:  # one GPU per process (checked: its memory, compile)
        cfg["device"] = f"cuda:{env_int('LOCAL_RANK')}"
    check_flags(cfg)  # refused before anything is read or written
    cfg["benchmark_steps"] = BENCHMARK_STEPS if cfg["benchmark_steps"] is None else cfg["benchmark_steps"]
    cfg["workers"] = cfg["workers"] and min(cfg["workers"], usable_cores())  # more than the cores: no faster
    cfg["micro_batch"] = cfg["batch_size"] // (cfg["world_size"] * cfg["grad_accum"])  # rows per forward pass
    if cfg["max_iters"] is None:
        cfg["max_iters"] = cfg["total_tokens"] // (cfg["batch_size"] * cfg["context_length"])
    cfg["total_tokens"] = cfg["max_iters"] * cfg["batch_size"] * cfg["context_length"]  # what is really trained on
    # a warm-up past the run's end needs its length, so it is no CHECKS row; a resumed run's length is its own, and
    # verify_resume compares the warm-up against it
    if warmup_given and cfg["warmup_iters"] > cfg["max_iters"] and (length_given or not cfg["resume"]):
        raise UsageError(f"--warmup-iters {cfg['warmup_iters']} is longer than the run "
                         f"({counted(cfg['max_iters'], 'step')}).")
    if not warmup_given:  # the preset's warm-up, scaled down to at most a tenth of a short run
        cfg["warmup_iters"] = min(cfg["warmup_iters"], cfg["max_iters"] // 10)
    # what the command line left to the defaults, which --resume takes from the run instead: its own length (only one
    # given extends it), warm-up (an extended run's follows its start) and --min-lr (a run's from before lr / 10)
    cfg["derived"] = [k for k, given in (("max_iters", length_given), ("warmup_iters", warmup_given),
                                         ("min_lr", min_lr_given)) if not given]
    # what this run's optimizer and model do not read: --resume does not compare them, and one given gets a note
    # (experiments.py's race gives every optimizer its flags; --resume asked for SGD's --eps back, before 2026-12-02)
    unread = {f"--optimizer {cfg['optimizer']}": UNREAD_BY.get(cfg["optimizer"], ()),
              "--nope": ["rope_theta"] * cfg["nope"]}
    cfg["unread"], given = [k for keys in unread.values() for k in keys], given_flags(argv)
    for who, keys in unread.items() if trains(cfg) else ():
        if flags := [FLAG_ROWS[k][0] for k in keys if k in given]:
            log(f"note: {who} does not read {', '.join(flags)}: this run ignores {'them' if flags[1:] else 'it'}.")
    if recorded is not None:
        same_run(cfg, recorded, given, mode)
    return cfg

