"""Train a Transformer LM: from raw text to a checkpoint and samples, on one CPU or many GPUs.

CS336 assignment 1, sections 5-7. Data preparation (corpora, BPE, token files) lives in data.py; the
run's safety (flag checks, --resume's verification, --overwrite, Ctrl-C, a full disk) in safety.py.

    python train.py                          # offline: Python's own docs, a few minutes on a laptop CPU
    python train.py --data tinystories       # the handout's run (downloads into data/); also owt,
    python train.py --data my.txt            # any text file, or my.npy for pre-tokenized ids
    torchrun --nproc_per_node=8 train.py --data tinystories   # DistributedDataParallel
    python train.py --data tinystories --benchmark --device cuda  # tokens/s and MFU, random tokens
"""
import contextlib
import json
import sys
import time
from pathlib import Path
from statistics import median

import safety  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    safety.quiet_while_starting("train.py")
import numpy as np
import torch

import accounting
from bpe import catch_ctrl_c
from data import (DATASETS, EOT, check_data, fingerprint, ids_vocab_size, is_cached, is_ids, prepare_data,
                  read_tokenizer, unigram_loss)
from export import export_run
from model import TransformerLM, generate
from optim import AdamW, clip_grad_norm, cosine_lr, cross_entropy, perplexity
from safety import log  # only rank 0 talks, so that torchrun's N processes print one story


# ----------------------------------------------------------------------------
# 1. Configuration: flags, presets, derived values (safety.py checks them)

# The flags marked PRESET take their default from the data source: the built-in corpus and local files
# get "small", sized to train in minutes on 2 CPU cores; tinystories and owt get the handout's section 7
# run: its model shape (accounting.TINYSTORIES) and 327,680,000 tokens (batch 128 x 10,000 x context 256).
PRESETS = {
    "small": dict(vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=384,
                  batch_size=32, max_iters=700, total_tokens=None, lr=5e-3, min_lr=5e-4, warmup_iters=50,
                  eval_interval=100, eval_iters=10),
    "tinystories": dict(accounting.TINYSTORIES, batch_size=128, max_iters=None, total_tokens=327_680_000,
                        lr=3e-3, min_lr=3e-4, warmup_iters=200, eval_interval=500, eval_iters=50),
}
PRESETS["owt"] = dict(PRESETS["tinystories"], vocab_size=32_000)  # the same run, OpenWebText's larger vocabulary
PRESET = safety.PRESET  # a FLAGS default taken from PRESETS
CORPORA = ("pydoc", *DATASETS)  # --data's names; anything else is a path
UNTIMED_STEPS = 5  # not timed (torch.compile compiles, allocators fill their caches): --benchmark, the ETA

FLAGS = [  # (flag, type, default, help): the whole command line, by --help section; bool = a switch
    "data and output",
    ("--data", str, "pydoc", "pydoc (built-in, offline), tinystories, owt (downloaded), PATH.txt or PATH.npy (ids)"),
    ("--val-data", str, None, "validation ids (.npy) for --data PATH.npy; default: its last 10%%"),
    ("--tokenizer", str, None, "folder of the vocab.json, merges.txt that made --data PATH.npy (default: the .npy's)"),
    ("--data-dir", str, "data", "cache for downloads, tokenizers and token files"),
    ("--out-dir", str, "out", "runs are written to OUT_DIR/RUN_NAME/"),
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
    ("--batch-size", int, PRESET, "sequences per optimizer step, over all processes and accumulation steps"),
    ("--max-iters", int, PRESET, "optimizer steps (tinystories/owt: from --total-tokens)"),
    ("--total-tokens", int, PRESET, "instead of --max-iters: steps = total / (batch size x context length)"),
    ("--lr", float, PRESET, "peak learning rate"),
    ("--min-lr", float, PRESET, "final learning rate of the cosine (a preset one above --lr scales down with it)"),
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
    ("--tensorboard", bool, False, "also log the metrics to OUT_DIR/RUN_NAME/tensorboard/ (needs tensorboard)"),
    ("--export", str, None, "write the run OUT_DIR/RUN_NAME to this directory in the Hugging Face format, then exit"),
    "hardware",
    ("--device", str, None, "cpu, cuda, cuda:1, mps; default: cuda when available"),
    ("--dtype", str, None, "float32, or bf16 (bfloat16 autocast, float32 weights); default: bf16 on cuda"),
    ("--compile", bool, False, "torch.compile the model"),
    ("--fast", bool, True, "model.py's fused kernels; --no-fast runs the from-scratch reference path"),
    ("--activation-checkpointing", bool, False, "recompute each block's insides in backward: less memory"),
    ("--benchmark", bool, False, "time steps on random tokens (tokens/s; MFU: achieved / peak FLOP/s); writes nothing"),
    ("--benchmark-steps", int, 20, f"timed steps after {UNTIMED_STEPS} untimed ones"),
    "samples at the end, or of a trained run",
    ("--sample", bool, False, "print samples of the run OUT_DIR/RUN_NAME as it stands, then exit; writes nothing"),
    ("--num-samples", int, 3, "samples per prompt: in samples.txt at the end, or printed by --sample"),
    ("--sample-tokens", int, 200, "new tokens per sample"),
    ("--temperature", float, 0.8, "0 = greedy"),
    ("--top-p", float, 0.95, "nucleus sampling threshold"),
    ("--prompt", str, "", "text the samples continue; default: a new document; -: each line of stdin (--sample)"),
]


def build_parser():  # FLAGS as argparse: a mistake is one sentence and exit code 2 (safety.Parser)
    return safety.flags_parser("train.py", "Train a Transformer LM (CS336 assignment 1). With no flags: a small model "
                               "on Python's built-in documentation, offline, in minutes on a CPU. Defaults marked "
                               "small/tinystories/owt depend on --data: small for pydoc and local files.", FLAGS, PRESETS)


def resolve_config(argv=None):
    """Flags -> one flat dict: the preset of --data fills what was not given, the environment decides
    device and processes, safety.check_flags refuses mistakes, then the derived values. Raises UsageError."""
    cfg = vars(build_parser().parse_args(argv))
    cfg["vocab_size"] = ids_vocab_size(cfg["data"], cfg["tokenizer"], cfg["vocab_size"])  # ids: their tokenizer's size
    warmup_given = cfg["warmup_iters"] is not None
    length_given = cfg["max_iters"] is not None or cfg["total_tokens"] is not None
    preset = PRESETS.get(cfg["data"], PRESETS["small"])
    for key, value in preset.items():  # a preset --min-lr above a given --lr scales down with it: lr / 10 stays
        if cfg[key] is None and not (length_given and key in ("max_iters", "total_tokens")):
            cfg[key] = value * cfg["lr"] / preset["lr"] if key == "min_lr" and value > cfg["lr"] else value
    cfg["run_name"] = Path(cfg["data"]).stem if cfg["run_name"] is None else cfg["run_name"]  # pydoc, a file's name
    cfg["world_size"], cfg["rank"] = safety.env_int("WORLD_SIZE") or 1, safety.RANK  # torchrun's (checked)
    cfg["device"] = safety.run_device(cfg["device"])  # cpu:0 is cpu (a CPU run's settings)
    cfg["dtype"] = cfg["dtype"] or ("bf16" if cfg["device"].startswith("cuda") else "float32")
    if cfg["device"].startswith("cuda") and cfg["world_size"] > 1:  # one GPU per process (checked: its memory, compile)
        cfg["device"] = f"cuda:{safety.env_int('LOCAL_RANK')}"
    safety.check_flags(cfg, CORPORA, is_ids, is_cached)  # refused before anything is read or written
    cfg["workers"] = cfg["workers"] and min(cfg["workers"], safety.usable_cores())  # more than the cores: no faster
    cfg["micro_batch"] = cfg["batch_size"] // (cfg["world_size"] * cfg["grad_accum"])  # rows per forward pass
    if cfg["max_iters"] is None:
        cfg["max_iters"] = cfg["total_tokens"] // (cfg["batch_size"] * cfg["context_length"])
    cfg["total_tokens"] = cfg["max_iters"] * cfg["batch_size"] * cfg["context_length"]  # what is really trained on
    if cfg["warmup_iters"] > cfg["max_iters"]:  # needs the run length just derived, so not a CHECKS row
        if warmup_given:
            raise safety.UsageError(f"--warmup-iters {cfg['warmup_iters']} is longer than the run "
                                    f"({cfg['max_iters']} steps).")
        cfg["warmup_iters"] = cfg["max_iters"] // 10
    return cfg


MODEL_KEYS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "no_norm",
              "post_norm", "nope", "silu_ffn", "tie_embeddings")  # the shape and the ablations


DATA_KEYS = ("data", "data_dir", "vocab_size", "val_data", "workers", "tokenizer")  # prepare_data's arguments


def model_kwargs(cfg=None):  # TransformerLM's arguments from a cfg: this run's, a saved config.json, or (None) the
    cfg = {**vars(build_parser().parse_args([])), **PRESETS["small"]} if cfg is None else cfg  # flags' defaults
    return {k: cfg[k] for k in (*MODEL_KEYS, "fast")}


# ----------------------------------------------------------------------------
# 2. Batches: random windows of the token file

def windows(data, starts, context_length, device):
    """x[b] = data[s:s+T] and its next tokens y[b] = data[s+1:s+T+1] for each start s, int64
    (len(starts), T) on device. Only the windows are read (data: data.TokenIds, a memmap or any 1-D array)."""
    w = torch.from_numpy(data[starts[:, None] + np.arange(context_length + 1)].astype(np.int64))  # (B, T+1)
    x, y = w[:, :-1], w[:, 1:]
    if str(device).startswith("cuda"):  # pinned memory lets the copy overlap with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)


def random_starts(data, n, context_length, generator=None):  # n window starts, uniform over [0, len(data) - T)
    if len(data) <= context_length:  # a window needs its T tokens and the next one, its last target
        raise ValueError(f"{len(data)} tokens cannot fill a window of context_length {context_length} plus a target")
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

def _unwrap(model):  # the LM inside DDP (.module), torch.compile (._orig_mod) and LMLoss (.lm): keys without prefixes
    inner = next((m for n, m in model.named_children() if n in ("module", "_orig_mod", "lm")), None)
    # only a wrapper that holds nothing else: a user's model with weights beside its .lm (a value head) is kept whole
    return model if inner is None or len(inner.state_dict()) != len(model.state_dict()) else _unwrap(inner)


def save_checkpoint(model, optimizer, iteration, out, **extra):
    """Model, optimizer, iteration and `extra` entries (config, RNG states) to a binary file or a path (atomically)."""
    state = {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
             "iteration": int(iteration), **extra}
    with safety.atomic_file(out) as f:  # a path, or a file object
        torch.save(state, f)


def load_checkpoint(src, model, optimizer=None, state=None):
    """Restore model (and optimizer) from a path or file object, or ValueError, loading nothing; returns the step."""
    state = safety.read_checkpoint(src) if state is None else state  # CRC-32s checked; tensors only, no code
    safety.check_state(state, _unwrap(model), optimizer)  # every entry and shape before anything is loaded
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["iteration"]


def load_run(path, device="cpu"):
    """A run directory, finished or still training -> (its model on device, in eval mode; its tokenizer, which knows
    <|endoftext|>, or None for ids without one; its config). FileNotFoundError: no checkpoint yet; ValueError."""
    state = safety.read_run(path, model_kwargs())  # a saved config's values: the types the flags' defaults have
    model = TransformerLM(**model_kwargs(state["config"]), device=device)
    load_checkpoint(None, model, state=state)
    return model.eval(), read_tokenizer(path)[0], state["config"]


# ----------------------------------------------------------------------------
# 4. The model, the training step, and its speed (--benchmark)

def autocast(cfg):
    """bf16 autocast: matmuls run in bfloat16 while weights, gradients and AdamW state stay float32 (the "master
    weights"), so small updates are not rounded away. float32: a no-op context (entered every micro-step)."""
    bf16 = cfg["dtype"] == "bf16"
    return torch.autocast(cfg["device"].split(":")[0], torch.bfloat16) if bf16 else contextlib.nullcontext()


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


class LMLoss(torch.nn.Module):
    """(x, y) -> the LM's mean cross-entropy, the module a step calls: torch.compile compiles the model and the
    loss as one graph, and DDP wraps both. Checkpoints and samples take the LM inside (.lm, _unwrap)."""

    def __init__(self, lm, cfg):
        super().__init__()
        self.lm, self.fast, self.in_graph = lm, cfg["fast"], cfg["fast"] and cfg["compile"]

    def forward(self, x, y):
        if self.in_graph:  # inductor fuses the upcast, log-sum-exp and gradient over the bf16 logits: no float32
            # (N, V) is written. torch's loss (tested equal): cross_entropy's gather scatters its gradient into one
            return torch.nn.functional.cross_entropy(self.lm(x).flatten(0, -2).float(), y.flatten())
        return cross_entropy(self.lm(x), y, fused=self.fast)  # in float32; --no-fast: the reference path


def build(cfg):
    """The model, its AdamW, and the wrapped model the step calls, (x, y) -> loss: activation checkpointing,
    LMLoss, then torch.compile, then DDP (compile first, so DDP sees one module)."""
    torch.manual_seed(cfg["seed"])  # the same initial weights on every process
    raw = TransformerLM(**model_kwargs(cfg), device=cfg["device"])
    optimizer = AdamW(raw.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                      weight_decay=cfg["weight_decay"], compiled=cfg["fast"] and cfg["compile"], fused=cfg["fast"])
    if cfg["activation_checkpointing"]:
        use_activation_checkpointing(raw)
    model = torch.compile(LMLoss(raw, cfg)) if cfg["compile"] else LMLoss(raw, cfg)
    if cfg["world_size"] > 1:
        dev = torch.device(cfg["device"])
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return raw, model, optimizer


def train_step(model, optimizer, micro_batches, lr, cfg):
    """One optimizer step's gradients (the caller steps) with build's model -> (mean loss over the global batch,
    pre-clip gradient norm) on the device: no host wait. Each micro-batch loss is divided by their number, so the
    gradients sum to the batch mean's; under DDP, backward averages them, and no_sync() skips that but at the last."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n, loss_sum = len(micro_batches), torch.zeros((), device=cfg["device"])
    for i, (x, y) in enumerate(micro_batches):
        sync = i == n - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(cfg):
            loss = model(x, y)
        (loss / n).backward()
        loss_sum += loss.detach()
    loss = loss_sum / n
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(loss)
        loss /= cfg["world_size"]
    norm = clip_grad_norm(model.parameters(), cfg["grad_clip"], fused=cfg["fast"]) if cfg["grad_clip"] > 0 else None
    return loss, norm


def step_flops(cfg):  # 3 x forward FLOPs (backward is twice the forward) x sequences, per optimizer step
    fwd = accounting.lm_forward_flops(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                                      cfg["d_ff"], silu_ffn=cfg["silu_ffn"])
    return accounting.training_step_flops(fwd) * cfg["batch_size"]


def device_peak(cfg, probe=False):  # accounting.py's published peak or None (probe: --benchmark's (peak, its words))
    peak = accounting.benchmark_peak if probe else accounting.peak_flops  # looked up under torch_settings
    return peak(cfg["device"], torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32)


def random_step(cfg):  # -> one optimizer step of this configuration on fixed random tokens, and its micro-batches
    _, model, optimizer = build(cfg)
    shape = (cfg["grad_accum"], cfg["micro_batch"], cfg["context_length"] + 1)
    micro = [(d[:, :-1], d[:, 1:]) for d in torch.randint(cfg["vocab_size"], shape, device=cfg["device"])]

    def step():
        train_step(model, optimizer, micro, cfg["lr"], cfg)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, micro


def synchronizer(device):  # drains a GPU's queue at a timing's edges; a CPU has none to wait for
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def benchmark(cfg):
    """The median time of --benchmark-steps steps after UNTIMED_STEPS untimed ones (the GPU queue is
    drained around each, so a time is the step's own work), as tokens/s and MFU. Writes nothing."""
    sync = synchronizer(cfg["device"])
    with safety.torch_settings(cfg):
        step, times = random_step(cfg)[0], []
        for _ in range(UNTIMED_STEPS + cfg["benchmark_steps"]):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        peak, basis = device_peak(cfg, probe=True)  # the matmuls' peak under the run's settings: TF32 on a GPU
    dt, flops, tokens = median(times[UNTIMED_STEPS:]), step_flops(cfg), cfg["batch_size"] * cfg["context_length"]
    log(f"benchmark: {', '.join(f'{k}={cfg[k]}' for k in (*MODEL_KEYS[:6], 'batch_size'))}, device {cfg['device']} "
        f"x{cfg['world_size']}, dtype {cfg['dtype']}, compile {cfg['compile']}, fast {cfg['fast']}, "
        f"{torch.get_num_threads()} CPU threads, median of {cfg['benchmark_steps']} steps")
    log(f"  {1000 * dt:.1f} ms/step, {tokens / dt:,.0f} tokens/s, {flops / dt / 1e12:.2f} TFLOP/s achieved")
    log(f"  MFU {accounting.mfu(flops, dt, peak * cfg['world_size']):.1%} {basis}" if peak else f"  MFU: {basis}")
    log("  FLOPs per step = 3 x accounting.lm_forward_flops (forward matmuls incl. attention) x batch size")
    log(f"  {cfg['total_tokens']:,} tokens ({cfg['max_iters']} steps) would take "
        f"{safety.fmt_time(cfg['total_tokens'] * dt / tokens)}")


# ----------------------------------------------------------------------------
# 5. The training loop

@torch.no_grad()
def evaluate(model, data, cfg):
    """Mean loss over eval_iters global batches, split as in training. Its own freshly seeded
    generator: every evaluation scores the same text and the training batches' RNG is untouched."""
    g, total = torch.Generator().manual_seed(cfg["seed"] + 1), torch.zeros((), device=cfg["device"])
    model.eval()
    for _ in range(cfg["eval_iters"]):
        for x, y in micro_batches(data, cfg, g):
            with autocast(cfg):
                total += model(x, y)
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return float(total) / (cfg["eval_iters"] * cfg["grad_accum"] * cfg["world_size"])


class Progress:
    """Console lines and metrics.jsonl (rank 0). tokens/s and MFU: the steps since the last metrics line, evaluations
    excluded; times from the first start, across resumes. Losses stay on the device until a log step reads them."""

    def __init__(self, cfg, path, elapsed, ckpt_path):
        self.cfg, self.path, self.tty, self.ckpt_path, self.unread = cfg, path, sys.stdout.isatty(), ckpt_path, []
        self.t0, self.t_last, self.window = time.time() - elapsed, time.time(), [0.0, 0]
        self.eta, self.noted = safety.Eta(UNTIMED_STEPS), False  # noted: a CPU run of hours was told so
        self.flops, self.peak = step_flops(cfg), device_peak(cfg)  # made inside torch_settings, as train() runs

    def seconds(self):
        return time.time() - self.t0

    def record(self, step, **entry):
        if self.cfg["rank"] == 0:
            with open(self.path, "a") as f:
                tokens = step * self.cfg["batch_size"] * self.cfg["context_length"]
                f.write(json.dumps({"step": step, "tokens": tokens, "time": round(self.seconds(), 3), **entry}) + "\n")
            safety.tensorboard(self.cfg, self.path.parent, {"step": step, **entry})  # --tensorboard: the same scalars

    def evaluated(self, step, val_loss):
        safety.read_back(self.unread, self.ckpt_path)  # a NaN or inf in the steps before it stops the run first
        self.record(step, val_loss=val_loss, val_ppl=perplexity(val_loss))
        line = f"step {step}: val loss {val_loss:.4f} (ppl {perplexity(val_loss):.4g})"
        log("\r" + line.ljust(safety.COLUMNS) if self.tty else line)  # over all of a progress line
        self.eta.evaluated(time.time() - self.t_last)  # the ETA counts the evaluations left at this one's seconds
        self.t_last = time.time()  # evaluation time does not count toward tokens/s

    def stepped(self, step, loss, lr, norm):  # loss, norm: device tensors, read back at log steps
        self.unread.append((step, loss, norm))
        logs = step % self.cfg["log_interval"] == 0 or step == self.cfg["max_iters"]  # read before the clock: the
        loss, norm = safety.read_back(self.unread, self.ckpt_path) if logs else (loss, norm)  # window's work is done
        cfg, now, (seconds, steps) = self.cfg, time.time(), self.window
        dt, self.t_last = now - self.t_last, now
        self.eta.stepped(dt)
        seconds, steps = self.window = [seconds + dt, steps + 1]
        tps = cfg["batch_size"] * cfg["context_length"] * steps / seconds
        mfu = self.peak and accounting.mfu(self.flops * steps, seconds, self.peak * cfg["world_size"])
        if logs:
            self.window = [0.0, 0]
            self.record(step, loss=loss, lr=lr, grad_norm=norm, tokens_per_s=round(tps, 1), mfu=mfu and round(mfu, 5))
            left = self.eta.seconds_left(step, cfg["max_iters"], cfg["eval_interval"])
            line = (f"step {step}/{cfg['max_iters']}: loss {loss:.4f}, lr {lr:.1e}, {safety.fmt_count(tps)} tok/s"
                    + (f", MFU {mfu:.0%}" if mfu else "") + f", ETA {safety.fmt_time(left)}")
            log("\r" + line.ljust(safety.COLUMNS) if self.tty else line, end="" if self.tty else "\n")
            self.noted = self.noted or safety.note_long_run(cfg, left, self.tty)  # at the first ETA, once


def write_samples(model, tok, cfg, path):  # to samples.txt, or a file object (--sample: stdout)
    g = torch.Generator(device=cfg["device"]).manual_seed(cfg["seed"])
    eot = tok.encode(EOT)[0]
    prompt = tok.encode(cfg["prompt"]) if cfg["prompt"] else [eot]
    with autocast(cfg):
        out = [cfg["prompt"] + tok.decode(generate(model, prompt[-model.context_length:], cfg["sample_tokens"],
               temperature=cfg["temperature"], top_p=cfg["top_p"], stop_id=eot, generator=g,
               fast=None if cfg["compile"] else False))  # the fast path compiles: on a GPU with --compile only
               for _ in range(cfg["num_samples"])]
    with safety.atomic_file(path, "w") as f:
        f.write("".join(f"--- sample {i + 1} ---\n{s}\n" for i, s in enumerate(out)))
    return out


def train(cfg, train_ids, valid_ids, tok, tok_files, run_dir, resume_state, baseline):
    """Evaluate, step on a fresh random batch, report, checkpoint; at the end a last evaluation,
    checkpoint, samples, the plot. Returns 0 done, 130 stopped; a non-finite loss, gradient or weight: DataError."""
    rank, last, ckpt_path = cfg["rank"], cfg["max_iters"], run_dir / "ckpt.pt"
    raw, model, optimizer = build(cfg)
    batch_gen = torch.Generator().manual_seed(cfg["seed"])  # the data order, on its own RNG
    start = 0 if resume_state is None else load_checkpoint(None, raw, optimizer, state=resume_state)
    if resume_state is not None:
        safety.restore_rng(resume_state["rng"], batch_gen)
        log(f"resumed from {ckpt_path} at step {start}")
    n_params, n_emb = sum(p.numel() for p in raw.parameters()), raw.token_embeddings.weight.numel()
    log(f"model: {n_params / 1e6:.2f}M parameters ({(n_params - n_emb) / 1e6:.2f}M without the embedding), "
        f"device {cfg['device']}, dtype {cfg['dtype']}, {cfg['world_size']} process(es)")
    progress = Progress(cfg, run_dir / "metrics.jsonl", (resume_state or {}).get("elapsed", 0.0), ckpt_path)

    def save(step):
        safety.read_back(progress.unread, ckpt_path)  # the steps since the last read first: a NaN or inf, exit 1
        safety.stop_non_finite(step, ckpt_path, model=raw)  # a NaN model is never saved, nor sampled (exit 1)
        if rank == 0:
            save_checkpoint(raw, optimizer, step, ckpt_path, config=cfg, rng=safety.rng_state(batch_gen),
                            elapsed=progress.seconds())
    with safety.stop_requests(cfg) as stopped:  # from here a Ctrl-C waits for a step boundary
        if resume_state is None:
            save(0)  # a checkpoint exists from the first moment on, so --resume always has one
        if rank == 0:
            safety.write_run_files(cfg, tok_files, start, new=resume_state is None)  # after the checkpoint
        for it in range(start, last):
            if it % cfg["eval_interval"] == 0:
                progress.evaluated(it, evaluate(model, valid_ids, cfg))
            lr = cosine_lr(it, cfg["lr"], cfg["min_lr"], cfg["warmup_iters"], last)
            loss, norm = train_step(model, optimizer, micro_batches(train_ids, cfg, batch_gen), lr, cfg)
            optimizer.step()  # even after a NaN loss (knowing would make the host wait): the next read stops the run
            optimizer.zero_grad(set_to_none=True)
            progress.stepped(it + 1, loss, lr, norm)
            stop = stopped(it + 1)
            if stop or ((it + 1) % cfg["checkpoint_interval"] == 0 and it + 1 < last):  # the end saves below
                save(it + 1)
            if stop:
                log(f"\nstopped at step {it + 1}; checkpoint saved to {ckpt_path}. Continue with "
                    f"{safety.resume_command(cfg)}.")
                return 130
    save(last)  # before the final evaluation: a stop during it loses no step, and --resume does the rest
    val_loss = evaluate(model, valid_ids, cfg)
    progress.evaluated(last, val_loss)
    log(f"done: {last} steps, {safety.fmt_count(cfg['total_tokens'])} tokens in {safety.fmt_time(progress.seconds())}; "
        f"final val loss {val_loss:.4f} (ppl {perplexity(val_loss):.4g}), unigram baseline {baseline:.4f}")
    log(f"checkpoint: {ckpt_path}")
    if rank == 0 and tok is not None and cfg["num_samples"] > 0:
        samples = write_samples(raw, tok, cfg, run_dir / "samples.txt")
        log(f"sample (all in {run_dir / 'samples.txt'}):\n{samples[0]}")
    if rank == 0 and cfg["plot"]:
        safety.plot(run_dir / "metrics.jsonl", run_dir / "loss.png")
    return 0


# ----------------------------------------------------------------------------
# 6. main(): processes, data, the run directory

def run(cfg):
    """Everything checked first (flags, resume, data); only then is the run directory written."""
    def prepare():  # -> train ids, valid ids, tokenizer, its files, and their fingerprint for --resume
        tr, va, tok, files = prepare_data(*(cfg[k] for k in DATA_KEYS))
        return tr, va, tok, files, fingerprint(tr, va, files, cfg["data_dir"])
    if cfg["benchmark"]:
        return benchmark(cfg) or 0
    if cfg["export"] is not None:  # --export DIR (even ""): the run as a Hugging Face Llama, never a training run
        return export_run(safety.run_dir(cfg), cfg["export"], cfg["overwrite"], model_kwargs, model_kwargs(cfg))
    if cfg["sample"]:  # the run's checkpoint as it stands continues the prompts; nothing is written
        return safety.print_samples(cfg, load_run, write_samples, EOT)
    ckpt_path, resume_state = safety.run_dir(cfg) / "ckpt.pt", None
    if cfg["resume"]:  # the checkpoint is verified whole (config, shapes, RNG) before any data is read
        meta = TransformerLM(**model_kwargs(cfg), device="meta")  # shapes only: no memory, no time
        resume_state = safety.verify_resume(cfg, ckpt_path, MODEL_KEYS, meta, AdamW(meta.parameters()), CORPORA)
    train_ids, valid_ids, tok, tok_files, cfg["data_fingerprint"] = safety.rank0_first(cfg, prepare)
    if resume_state is not None:  # the same config is not enough: the same token files and tokenizer too
        safety.check_same_data(resume_state, cfg, ckpt_path)
        if safety.run_complete(resume_state, cfg, ckpt_path, tok):  # its end written: says so, writes nothing
            return 0
    top = check_data(cfg, train_ids, valid_ids, tok)  # ids in the vocabulary (and their tokenizer's), windows fit
    safety.check_samples(cfg, tok, tok_files, top, EOT)  # what would fail at the very end is refused now
    baseline = unigram_loss(train_ids, valid_ids, cfg["vocab_size"])
    log(f"data: {len(train_ids):,} train / {len(valid_ids):,} validation tokens; unigram baseline "
        f"{baseline:.4f} nats/token")
    with safety.run_lock(cfg), safety.torch_settings(cfg):  # all checked: the first write; a second writer is refused
        return train(cfg, train_ids, valid_ids, tok, tok_files, ckpt_path.parent, resume_state, baseline)


def main(argv=None):
    """Exit code: 0 done, 1 no data (download failed), a full disk or a diverged run, 2 a usage mistake,
    130 stopped: safety.exit_code turns each mistake or fault into one sentence, without a traceback."""
    def go():
        cfg = resolve_config(argv)
        resume = f"run {safety.resume_command(cfg)} to continue from the last checkpoint"
        with safety.process_group(cfg), safety.disk_full(safety.run_dir(cfg), resume), \
                safety.compile_failures(cfg):  # one the CHECKS' probe did not foresee
            return run(cfg)
    return safety.exit_code("train.py", go, "every file written is whole: rerun the same command (once the run has a "
                            "ckpt.pt: with --resume, without --overwrite) to go on.")


if __name__ == "__main__":
    catch_ctrl_c()  # a KeyboardInterrupt (bpe.py's pool workers hold Ctrl-C blocked: this process ends them)
    safety.escaping_stdout()  # a terminal that cannot show a sample's text; a closed stdout (>&-) as /dev/null
    sys.exit(main())
