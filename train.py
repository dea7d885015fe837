"""Train a Transformer LM: from raw text to a checkpoint and samples, on one CPU or many GPUs.

CS336 assignment 1, sections 5-7. Every flag and its default is in config.py (FLAGS), with the rules that
refuse a mistake; data preparation (corpora, BPE, token files) is in data.py; the run directory (its lock,
--resume's checks, Ctrl-C at a step boundary) in rundir.py.

    python train.py                          # offline: Python's docs and library, minutes on a laptop CPU
    python train.py --data tinystories       # the handout's run (downloads into data/); owt likewise
    python train.py --data my.txt            # any text file, or my.npy for pre-tokenized ids
    torchrun --nproc_per_node=8 train.py --data tinystories   # DistributedDataParallel
    python train.py --data tinystories --benchmark --device cuda  # tokens/s and MFU, random tokens

Sections, in reading order: 1. batches (random windows of the token file), 2. checkpoints, 3. the model, the
training step and its speed (--benchmark), 4. the training loop and samples, 5. main(): processes, data, run folder.
"""
import contextlib
import json
import sys
import time
from statistics import median

import cli  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("train.py")
import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

import accounting
import checkpoints
import config
import figures
import files
import fused_head
import machine
import rundir
from cli import log  # only rank 0 talks, so that torchrun's N processes print one story
from config import CORPORA, DATA_KEYS, MODEL_KEYS, SDPA_BACKENDS, UNTIMED_STEPS, model_kwargs, resolve_config
from data import EOT, check_data, fingerprint, prepare_data, read_tokenizer, unigram_loss
from export import export_run
from model import TransformerLM, check_count, generate
from optim import SGD, Adam, AdamW, Muon, RMSProp, clip_grad_norm, cosine_lr, cross_entropy, perplexity


# ----------------------------------------------------------------------------
# 1. Batches: random windows of the token file

def windows(data, starts, context_length, device):
    """x[b] = data[s:s+T] and its next tokens y[b] = data[s+1:s+T+1] for each start s, int64
    (len(starts), T) on device. Only the windows are read (data: data.TokenIds, a memmap or any 1-D array)."""
    w = torch.from_numpy(data[starts[:, None] + np.arange(context_length + 1)].astype(np.int64))  # (B, T+1)
    x, y = w[:, :-1], w[:, 1:]
    if torch.device(device).type == "cuda":  # pinned memory lets the copy overlap with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)


def random_starts(data, n, context_length, generator=None):  # n window starts, uniform over [0, len(data) - T)
    if len(data) <= context_length:  # a window needs its T tokens and the next one, its last target
        raise ValueError(f"{len(data)} tokens cannot fill a window of context_length {context_length} plus a target")
    return torch.randint(len(data) - context_length, (n,), generator=generator).numpy()


def get_batch(data, batch_size, context_length, device, generator=None):
    """CS336 data loader: batch_size windows at random starts. data: 1-D token ids (a memmap, data.TokenIds, an array,
    a CPU tensor), checked in O(1): its shape, its integer type and the lengths (their range: data.check_ids)."""
    if isinstance(data, torch.Tensor) and not data.is_cpu:  # .numpy() refuses it, .cpu() in here would copy it whole
        raise ValueError(f"get_batch reads windows on the CPU, got data on {data.device}: pass data.cpu(), once "
                         f"(each batch still goes to device {device!r}).")
    data = data.numpy() if isinstance(data, torch.Tensor) else data  # no copy (np.asarray: a TokenIds read whole)
    check_count("batch_size", batch_size)
    check_count("context_length", context_length)
    if getattr(data, "ndim", 1) != 1 or getattr(data, "dtype", np.dtype(float)).kind not in "iu":
        what = f"{getattr(data, 'ndim', 1)}-D {data.dtype}" if hasattr(data, "dtype") else type(data).__name__
        raise ValueError(f"get_batch takes a 1-D array of integer token ids as data, got {what}.")
    return windows(data, random_starts(data, batch_size, context_length, generator), context_length, device)


def micro_batches(data, cfg, generator):
    """This process's share of one global batch: grad_accum (x, y) pairs of micro_batch rows. Every process draws the
    same starts and reads only its windows: --grad-accum and the processes change the arithmetic's order, not data."""
    starts = random_starts(data, cfg["batch_size"], cfg["context_length"], generator)
    mine = starts.reshape(cfg["grad_accum"], cfg["world_size"], cfg["micro_batch"])[:, cfg["rank"]]
    return [windows(data, s, cfg["context_length"], cfg["device"]) for s in mine]


# ----------------------------------------------------------------------------
# 2. Checkpoints

# class -> its child: DDP's, torch.compile's and section 3's LMLoss (the LM and its loss as one module)
WRAPPERS = {"DistributedDataParallel": "module", "OptimizedModule": "_orig_mod", "LMLoss": "lm"}


def _unwrap(model):  # the LM inside DDP, torch.compile, LMLoss: by type, so a user's model with a child lm keeps its keys
    if not isinstance(model, torch.nn.Module):  # save_checkpoint(None, ...), load_checkpoint(src, None)
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inner = WRAPPERS.get(type(model).__name__)
    return model if inner is None else _unwrap(getattr(model, inner))


def save_checkpoint(model, optimizer, iteration, out, **extra):
    """Model, optimizer (or None), iteration and `extra` entries (config, RNG states) to a binary file or a path."""
    opt = {} if optimizer is None else {"optimizer": optimizer.state_dict()}  # None: weights alone, as load_run reads
    state = {"model": _unwrap(model).state_dict(), **opt, "iteration": checkpoints.step_count(iteration), **extra}
    checkpoints.check_loadable(state)  # refused before a byte is written, not by the load, hours later
    with files.atomic_file(out) as f:  # a path (replaced whole, atomically), or a file object
        torch.save(state, f)


def load_state(state, model, optimizer=None):
    """Restore model (and optimizer) from a checkpoint's dict, or ValueError, loading nothing; returns its step."""
    checkpoints.check_state(state, _unwrap(model), optimizer)  # every entry and shape before anything is loaded
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["iteration"]


def load_checkpoint(src, model, optimizer=None):
    """Restore model (and optimizer) from a path or file object, or ValueError, loading nothing; returns the step."""
    return load_state(checkpoints.read_checkpoint(src), model, optimizer)  # CRC-32s checked; tensors only, no code


# ----------------------------------------------------------------------------
# 3. The model, the training step, and its speed (--benchmark)

def autocast(cfg):
    """bf16 autocast: matmuls run in bfloat16 while weights, gradients and AdamW state stay float32 (the "master
    weights"), so small updates are not rounded away. float32: a no-op context (entered every micro-step)."""
    bf16 = cfg["dtype"] == "bf16"
    return torch.autocast(torch.device(cfg["device"]).type, torch.bfloat16) if bf16 else contextlib.nullcontext()


def use_activation_checkpointing(lm):
    """Lecture 2: keep only each block's input and recompute its insides in backward: activation
    memory drops to O(layers x d_model) per token, for the price of one more forward."""
    from torch.utils.checkpoint import checkpoint
    for block in lm.layers:
        def fwd(*args, _inner=block.forward, **kwargs):  # evaluation, generation: nothing to save anyway
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs) if torch.is_grad_enabled() else \
                _inner(*args, **kwargs)
        block.forward = fwd


def narrow_residual(lm, cfg):
    """--bf16-residual, for training and for sampling a run alike: the embedding's output in autocast's dtype, so each
    block adds bf16 to bf16 (the weights and their gradients stay float32)."""
    if cfg.get("bf16_residual"):
        lm.token_embeddings.register_forward_hook(lambda embedding, ids, x: x.to(fused_head.compute_dtype(x)))


class LMLoss(torch.nn.Module):
    """(x, y) -> the LM's mean cross-entropy, the module a step calls: torch.compile compiles the model and the loss as
    one graph, and DDP wraps both; checkpoints and samples take the LM inside (.lm, _unwrap). The loss, each tested
    equal to optim.cross_entropy: with --fast, fused_head.py's where --fused-head is on (by default: config.py
    decides), else torch's when compiled, else optim.cross_entropy fused; with --no-fast, optim.cross_entropy itself. --sdpa-backend pins the attention
    kernel of forward and backward (auto: torch's choice)."""

    def __init__(self, lm, cfg):
        super().__init__()
        self.lm, self.fast, self.in_graph = lm, cfg["fast"], cfg["fast"] and cfg["compile"]
        self.fused_head, self.attention = cfg["fast"] and cfg["fused_head"], SDPA_BACKENDS[cfg["sdpa_backend"]]

    def forward(self, x, y):
        with contextlib.nullcontext() if self.attention is None else sdpa_kernel(self.attention):
            if self.fused_head:  # head matmul and loss by row chunks: no (N, V) logits held
                return fused_head.linear_cross_entropy(self.lm(x, head=False), self.lm.lm_head.weight, y)
            if self.in_graph:  # inductor (torch.compile's code generator) fuses torch's loss over the logits (bf16
                # under autocast), its gradient pointwise: no float32 (N, V) is written (optim.cross_entropy's gather would scatter its
                # gradient into one)
                return torch.nn.functional.cross_entropy(self.lm(x).flatten(0, -2).float(), y.flatten())
            return cross_entropy(self.lm(x), y, fused=self.fast)  # in float32; --no-fast: the reference path


def compile_mode(cfg):
    """torch.compile's mode from the two switches: --cuda-graph replays the compiled forward and backward as CUDA
    graphs (one launch each instead of hundreds); --max-autotune times several kernels for each matmul."""
    return {(False, False): "default", (True, False): "reduce-overhead", (False, True): "max-autotune-no-cudagraphs",
            (True, True): "max-autotune"}[cfg["cuda_graph"], cfg["max_autotune"]]


def make_optimizer(cfg, lm):
    """--optimizer (optim.py's) for the LM's parameters (config.UNREAD_BY: what each ignores); Muon sorts by name."""
    name, lr, params = cfg["optimizer"], cfg["lr"], lm.parameters()
    adam = dict(betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], compiled=cfg["fast"] and cfg["compile"],
                fused=cfg["fast"])
    if name in ("sgd", "momentum"):
        return SGD(params, lr, momentum=cfg["beta1"] if name == "momentum" else 0.0)
    if name == "rmsprop":
        return RMSProp(params, lr, alpha=cfg["beta2"], eps=cfg["eps"])
    if name == "muon":
        return Muon(lm.named_parameters(), lr, weight_decay=cfg["weight_decay"], **adam)
    return Adam(params, lr, **adam) if name == "adam" else AdamW(params, lr, weight_decay=cfg["weight_decay"], **adam)


def build(cfg):
    """-> (lm, the LM; loss_model, what a step calls, (x, y) -> loss; optimizer): activation checkpointing and the
    LM's switches, then LMLoss, then torch.compile, then DDP (compile first, so DDP sees one module)."""
    torch.manual_seed(cfg["seed"])  # the same initial weights on every process
    lm = TransformerLM(**model_kwargs(cfg), device=cfg["device"])
    optimizer = make_optimizer(cfg, lm)
    if cfg["activation_checkpointing"]:
        use_activation_checkpointing(lm)
    narrow_residual(lm, cfg)
    for block in lm.layers:  # --triton-gate: SwiGLU's gate as fast_gpu.py's Triton kernels (on a GPU)
        block.ffn.triton_gate = cfg["triton_gate"]
    loss_model = torch.compile(LMLoss(lm, cfg), mode=compile_mode(cfg)) if cfg["compile"] else LMLoss(lm, cfg)
    if cfg["world_size"] > 1:
        ids = [torch.device(cfg["device"]).index] if cfg["device"].startswith("cuda") else None  # its one GPU
        loss_model = torch.nn.parallel.DistributedDataParallel(loss_model, device_ids=ids)
    return lm, loss_model, optimizer


def train_step(loss_model, optimizer, micro_batches, lr, cfg):
    """One optimizer step's gradients (the caller steps) with build's loss_model -> (mean loss over the global batch,
    pre-clip gradient norm) on the device: no host wait. Each micro-batch loss is divided by their number, so the
    gradients sum to the batch mean's; under DDP, backward averages them, and no_sync() skips that but at the last."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n, mean = len(micro_batches), torch.zeros((), device=cfg["device"])
    for i, (x, y) in enumerate(micro_batches):
        if cfg["cuda_graph"]:  # the graphs' outputs of the last micro-step are spent: their memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        sync = i == n - 1 or not hasattr(loss_model, "no_sync")
        with (contextlib.nullcontext() if sync else loss_model.no_sync()), autocast(cfg):
            loss = loss_model(x, y)
        (loss / n).backward()
        mean += loss.detach() / (n * cfg["world_size"])  # the global batch's mean once all_reduce adds the processes'
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(mean)
    norm = clip_grad_norm(loss_model.parameters(), cfg["grad_clip"], fused=cfg["fast"]) if cfg["grad_clip"] > 0 else None
    return mean, norm


def step_flops(cfg):  # a training step's FLOPs per sequence (forward and backward) x sequences, per optimizer step
    fwd = accounting.lm_forward_flops(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                                      cfg["d_ff"], silu_ffn=cfg["silu_ffn"])
    return accounting.training_step_flops(fwd) * cfg["batch_size"]


def device_peak(cfg):
    """MFU's denominator: accounting.py's published peak for the run's device and dtype, or None. Called under the
    run's torch_settings: TF32 changes a float32 GPU's peak."""
    return accounting.peak_flops(cfg["device"], torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32)


def benchmark_peak(cfg):  # --benchmark's (peak, its words); a CPU has no published peak: its best square matmul's
    if peak := device_peak(cfg):
        return peak, f"vs the published peak of {peak / 1e12:.1f} TFLOP/s per device"
    if (kind := torch.device(cfg["device"]).type) != "cpu":
        return None, f"no published peak for this {kind} device in accounting.PEAK_FLOPS"
    dtypes = (torch.float32, torch.bfloat16) if cfg["dtype"] == "bf16" else (torch.float32,)  # float32's, if faster:
    peak, best = max((machine.measure_matmul_flops(d), str(d).removeprefix("torch.")) for d in dtypes)  # bf16 crawls
    return peak, f"vs a measured matmul peak of {peak / 1e12:.2f} TFLOP/s ({best}'s; a probe, not a published peak)"


def random_step(cfg):  # -> (a step of this configuration on fixed random tokens, its micro-batches, its optimizer)
    _, loss_model, optimizer = build(cfg)
    shape = (cfg["grad_accum"], cfg["micro_batch"], cfg["context_length"] + 1)
    micro = [(d[:, :-1], d[:, 1:]) for d in torch.randint(cfg["vocab_size"], shape, device=cfg["device"])]

    def step():
        train_step(loss_model, optimizer, micro, cfg["lr"], cfg)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step, micro, optimizer


def benchmark(cfg):
    """The median time of --benchmark-steps steps after UNTIMED_STEPS untimed ones (the GPU queue is
    drained around each, so a time is the step's own work), as tokens/s and MFU. Writes nothing."""
    sync = machine.synchronizer(cfg["device"])
    with machine.torch_settings(cfg):
        step, times = random_step(cfg)[0], []
        for _ in range(UNTIMED_STEPS + cfg["benchmark_steps"]):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        peak, basis = benchmark_peak(cfg)  # the matmuls' peak under the run's settings: TF32 on a GPU
    dt, flops, tokens = median(times[UNTIMED_STEPS:]), step_flops(cfg), cfg["batch_size"] * cfg["context_length"]
    log(f"benchmark: {', '.join(f'{k}={cfg[k]}' for k in (*MODEL_KEYS[:6], 'batch_size'))}, device {cfg['device']} "
        f"x{cfg['world_size']}, dtype {cfg['dtype']}, compile {cfg['compile']}, fast {cfg['fast']} "
        f"({config.levers_on(cfg)}), {torch.get_num_threads()} CPU threads, median of "
        f"{cli.counted(cfg['benchmark_steps'], 'step')}")
    log(f"  {1000 * dt:.1f} ms/step, {tokens / dt:,.0f} tokens/s, {flops / dt / 1e12:.3g} TFLOP/s achieved")
    log(f"  MFU {accounting.mfu(flops, dt, peak * cfg['world_size']):.1%} {basis}" if peak else f"  MFU: {basis}")
    log(f"  FLOPs per step = {accounting.training_step_flops(1)} x accounting.lm_forward_flops (forward matmuls "
        "incl. attention) x batch size")
    log(f"  {cfg['total_tokens']:,} tokens ({cli.counted(cfg['max_iters'], 'step')}) would take "
        f"{cli.fmt_time(cfg['total_tokens'] * dt / tokens)}")


# ----------------------------------------------------------------------------
# 4. The training loop, and samples from a run

@torch.no_grad()
def evaluate(loss_model, data, cfg):
    """Mean loss over eval_iters global batches, split as in training. Its own freshly seeded
    generator: every evaluation scores the same text and the training batches' RNG is untouched.
    No model.eval(): without dropout the two modes compute the same (and a compiled model would compile twice)."""
    g, total = torch.Generator().manual_seed(cfg["seed"] + 1), torch.zeros((), device=cfg["device"])
    for _ in range(cfg["eval_iters"]):
        for x, y in micro_batches(data, cfg, g):
            with autocast(cfg):
                total += loss_model(x, y)
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(total)
    return float(total) / (cfg["eval_iters"] * cfg["grad_accum"] * cfg["world_size"])


class Progress:
    """Console lines and metrics.jsonl (rank 0). tokens/s and MFU: the steps since the last metrics line, evaluations
    and checkpoints excluded; times from the first start, across resumes. Losses stay on the device until read."""

    def __init__(self, cfg, path, elapsed, ckpt_path):
        self.cfg, self.path, self.tty, self.ckpt_path, self.unread = cfg, path, sys.stdout.isatty(), ckpt_path, []
        self.t0, self.t_last, self.window = time.time() - elapsed, time.time(), [0.0, 0]
        self.eta, self.noted = cli.Eta(UNTIMED_STEPS), False  # noted: a CPU run of hours was told so
        self.flops, self.peak = step_flops(cfg), device_peak(cfg)  # made inside torch_settings, as train() runs

    def seconds(self):
        return time.time() - self.t0

    def record(self, step, **entry):
        if self.cfg["rank"] == 0:
            tokens = step * self.cfg["batch_size"] * self.cfg["context_length"]
            files.append_line(self.path, json.dumps({"step": step, "tokens": tokens, "time": round(self.seconds(), 3),
                                                     **entry}))
            figures.tensorboard(self.cfg, self.path.parent, {"step": step, **entry})  # --tensorboard: the same scalars

    def evaluated(self, step, val_loss):  # the steps before it were read back (stepped): a NaN stopped the run there
        self.record(step, val_loss=val_loss, val_ppl=perplexity(val_loss))
        line = f"step {step}: val loss {val_loss:.4f} (ppl {perplexity(val_loss):.4g})"
        log("\r" + line.ljust(cli.COLUMNS) if self.tty else line)  # over all of a progress line
        self.eta.evaluated(time.time() - self.t_last)  # the ETA counts the evaluations left at this one's seconds
        self.t_last = time.time()  # evaluation time does not count toward tokens/s

    def stepped(self, step, loss, lr, norm, last=False):  # loss, norm: device tensors, read back at log steps (below)
        """last: the run stops after this step (Ctrl-C), which gets a console line too, not a metrics record."""
        self.unread.append((step, loss, norm))
        logs = step % self.cfg["log_interval"] == 0 or step == self.cfg["max_iters"]
        # read back before the clock is read, and before an evaluation (it would wait for these steps), so that their
        # seconds are theirs; a NaN stops the run before it
        reads = logs or last or step % self.cfg["eval_interval"] == 0
        loss, norm = rundir.read_back(self.unread, self.ckpt_path) if reads else (loss, norm)
        cfg, now, (seconds, steps) = self.cfg, time.time(), self.window
        dt, self.t_last = now - self.t_last, now
        self.eta.stepped(dt)
        seconds, steps = self.window = [seconds + dt, steps + 1]
        if not (logs or last):
            return
        tps = cfg["batch_size"] * cfg["context_length"] * steps / seconds
        mfu = self.peak and accounting.mfu(self.flops * steps, seconds, self.peak * cfg["world_size"])
        self.window = [0.0, 0]
        if logs:
            self.record(step, loss=loss, lr=lr, grad_norm=norm, tokens_per_s=round(tps, 1), mfu=mfu and round(mfu, 5))
        left = self.eta.seconds_left(step, cfg["max_iters"], cfg["eval_interval"])
        line = (f"step {step}/{cfg['max_iters']}: loss {loss:.4f}, lr {lr:.1e}, {cli.fmt_count(tps)} tok/s"
                + (f", MFU {mfu:.0%}" if mfu else "") + f", ETA {cli.fmt_time(left)}")
        log("\r" + line.ljust(cli.COLUMNS) if self.tty else line, end="" if self.tty else "\n")
        self.noted = self.noted or config.note_long_run(cfg, left)  # at the first ETA, once


def load_run(path, device="cpu"):
    """A run directory, finished or still training -> (its model on device, in eval mode; its tokenizer with
    <|endoftext|>, None for ids without one; its config and "iteration"). No checkpoint yet: FileNotFoundError."""
    if problem := machine.device_error(device, cpu='device="cpu"'):  # not torch's words from deep inside model.py
        raise ValueError(f"load_run cannot use device {device!r}: {problem}")
    state = rundir.read_run(path, model_kwargs())  # a saved config's values: the types the flags' defaults have
    model = TransformerLM(**model_kwargs(state["config"]), device=device)
    load_state(state, model)
    narrow_residual(model, state["config"])  # as it was trained (a config without the key: the float32 stream)
    tok = read_tokenizer(path, text=rundir.on_text(state["config"]))[0]  # a text run's gone: damage
    return model.eval(), tok, dict(state["config"], iteration=state["iteration"])


def write_samples(model, tok, cfg, path):  # to samples.txt, or sys.stdout (--sample)
    g = torch.Generator(device=cfg["device"]).manual_seed(cfg["seed"])
    eot = tok.encode(EOT)[0]
    prompt = tok.encode(cfg["prompt"]) if cfg["prompt"] else [eot]
    with autocast(cfg):
        out = [cfg["prompt"] + tok.decode(generate(model, prompt[-model.context_length:], cfg["sample_tokens"],
               temperature=cfg["temperature"], top_p=cfg["top_p"], stop_id=eot, generator=g,
               fast=None if cfg["compile"] else False))  # the fast path compiles: on a GPU with --compile only
               for _ in range(cfg["num_samples"])]
    named = f", prompt {cli.short_repr(cfg['prompt'])}" if cfg["prompt"] else ""  # which of --prompt -'s lines
    text = "".join(f"--- sample {i + 1}{named} ---\n{s}\n" for i, s in enumerate(out))
    if path is sys.stdout:  # printed as each prompt's samples come, through a pipe too (a full disk names stdout)
        return cli.say(text, end="") or out
    with files.atomic_file(path, "w") as f:
        f.write(text)
    return out


def print_samples(cfg):
    """--sample: the last checkpoint continues --prompt (-: each stdin line as it comes; '': a document) to EOT."""
    path = rundir.run_dir(cfg)
    try:
        model, tok, saved = load_run(path, cfg["device"])
    except FileNotFoundError as e:
        raise cli.UsageError(f"--sample: {e}; pass the --data (or --out-dir and --run-name) of a trained run.") from None
    except (ValueError, OSError) as e:
        raise cli.UsageError(f"--sample: {str(e).rstrip('.')}; restore it from a copy, or train the run again.") from None
    if tok is None:  # a run of ids that came without one (a text run's is refused as damage by load_run)
        raise cli.UsageError(f"--sample: {path} holds no tokenizer to encode prompts and decode samples (its ids came "
                             "without one); put the vocab.json and merges.txt that made them there.")
    n, V, stop = len(tok.vocab), model.vocab_size, tok.encode(EOT)[0]
    if stop >= V or config.undecodable_ids(tok, V):  # ids trained with --num-samples 0 may sit beside any tokenizer
        raise cli.UsageError(f"--sample: the tokenizer in {path} ({n} tokens, {EOT} at id {stop}) does not fit its "
                             f"model, whose samples need a token for each id below {V}, {EOT} among them; put the "
                             "vocab.json and merges.txt that made its ids there.")
    # a run still training holds a CPU's cores: its threads and ours would wait for each other at every op, so
    # sampling takes one
    training = rundir.writer(path) is not None
    log(f"sampling the checkpoint of step {saved['iteration']:,} of {saved['max_iters']:,}"
        + (" (one thread: the run is training)" if training and cfg["device"] == "cpu" else ""), file=sys.stderr)
    with machine.one_thread_on_a_cpu(cfg["device"], threads=not training):
        for prompt in cli.stdin_lines("--prompt -") if cfg["prompt"] == "-" else [cfg["prompt"]]:
            try:
                write_samples(model, tok, dict(cfg, prompt=prompt), sys.stdout)
            except ValueError as e:  # an id past the model's vocabulary (user_text and stdin_lines read UTF-8 alone)
                raise cli.UsageError(f"--prompt {cli.short_repr(prompt)} cannot be sampled ({str(e).rstrip('.')}); "
                                     "pass other text.") from None
    return 0


def train(cfg, train_ids, valid_ids, tok, tok_files, run_dir, resume_state, baseline, init_state=None):
    """Evaluate, step on a fresh random batch, report, checkpoint; at the end a last evaluation, samples, the plot.
    resume_state, init_state: --resume's and --init-from's checkpoints. 0 done, 130 stopped; a NaN or inf: DataError."""
    rank, end, ckpt_path = cfg["rank"], cfg["max_iters"], run_dir / "ckpt.pt"
    lm, loss_model, optimizer = build(cfg)
    batch_gen = torch.Generator().manual_seed(cfg["seed"])  # the data order, on its own RNG
    start = 0 if resume_state is None else load_state(resume_state, lm, optimizer)
    if resume_state is not None:
        checkpoints.restore_rng(resume_state["rng"], batch_gen)
        log(f"resumed from {ckpt_path} at step {start}")
    elif init_state is not None:  # --init-from: the weights only; the optimizer, schedule and data order start anew
        log(f"initialized from {cfg['init_from']} (its step {load_state(init_state, lm)})")
    n_params, n_emb = sum(p.numel() for p in lm.parameters()), lm.token_embeddings.weight.numel()
    log(f"model: {n_params / 1e6:.2f}M parameters ({(n_params - n_emb) / 1e6:.2f}M without the embedding), "
        f"device {cfg['device']}, dtype {cfg['dtype']}, {cli.counted(cfg['world_size'], 'process')}")
    progress = Progress(cfg, run_dir / "metrics.jsonl", (resume_state or {}).get("elapsed", 0.0), ckpt_path)

    def save(step):
        rundir.read_back(progress.unread, ckpt_path)  # the steps since the last read first: a NaN or inf, exit 1
        t = time.time()  # from here the checkpoint's seconds: no step's, so tokens/s and MFU leave them out
        rundir.stop_non_finite(step, ckpt_path, model=lm)  # a NaN model is never saved, nor sampled (exit 1)
        if rank == 0:
            save_checkpoint(lm, optimizer, step, ckpt_path, config=cfg, rng=checkpoints.rng_state(batch_gen),
                            elapsed=progress.seconds())
        progress.t_last += time.time() - t
    with rundir.stop_requests(cfg) as stopped:  # from here a Ctrl-C waits for a step boundary
        if resume_state is None:
            save(0)  # a checkpoint exists from the first moment on, so --resume always has one
        if rank == 0:
            rundir.write_run_files(cfg, tok_files, start, new=resume_state is None)  # after the checkpoint
        for it in range(start, end):
            if it % cfg["eval_interval"] == 0:
                progress.evaluated(it, evaluate(loss_model, valid_ids, cfg))
            lr = cosine_lr(it, cfg["lr"], cfg["min_lr"], cfg["warmup_iters"], end)
            loss, norm = train_step(loss_model, optimizer, micro_batches(train_ids, cfg, batch_gen), lr, cfg)
            optimizer.step()  # even after a NaN loss (knowing would make the host wait): the next read stops the run
            optimizer.zero_grad(set_to_none=True)
            stop = stopped(it + 1)
            progress.stepped(it + 1, loss, lr, norm, last=stop)  # a stop's step gets its line too
            if stop or ((it + 1) % cfg["checkpoint_interval"] == 0 and it + 1 < end):  # the end saves below
                save(it + 1)
            if stop:
                log(f"stopped at step {it + 1}; checkpoint saved to {ckpt_path}. "
                    f"Continue with {rundir.resume_command(cfg)}.")
                return 130
    save(end)  # before the final evaluation: a stop in what follows loses no step, and --resume does the rest
    with cli.ctrl_c_says(f"train.py: stopped after the last step (saved): {rundir.resume_command(cfg)} finishes it."):
        progress.evaluated(end, val_loss := evaluate(loss_model, valid_ids, cfg))
        log(f"done: {cli.counted(end, 'step')}, {cli.fmt_count(cfg['total_tokens'])} tokens in "
            f"{cli.fmt_time(progress.seconds())}; final val loss {val_loss:.4f} (ppl {perplexity(val_loss):.4g}), "
            f"unigram baseline {baseline:.4f}\ncheckpoint: {ckpt_path}")
        if rank == 0 and tok is not None and cfg["num_samples"] > 0:
            samples = write_samples(lm, tok, cfg, run_dir / "samples.txt")
            log(f"sample (all in {run_dir / 'samples.txt'}):\n{samples[0]}")
        if rank == 0 and cfg["plot"]:
            figures.plot_run(run_dir / "metrics.jsonl", run_dir / "loss.png", f"{run_dir}: --data {cfg['data']}, "
                             f"{end:,} steps of {cfg['batch_size']} x {cfg['context_length']} tokens, lr {cfg['lr']:g}")
        return 0
    return 130


# ----------------------------------------------------------------------------
# 5. main(): processes, data, the run directory

def run(cfg):
    """Everything checked first (flags, resume, data); only then is the run directory written."""
    def prepare():  # -> train ids, valid ids, tokenizer, its files, and their fingerprint for --resume
        tr, va, tok, tok_files = prepare_data(*(cfg[k] for k in DATA_KEYS))
        return tr, va, tok, tok_files, fingerprint(tr, va, tok_files, cfg["data_dir"])
    if cfg["benchmark"]:
        return benchmark(cfg) or 0
    if cfg["export"] is not None:  # --export DIR (even ""): the run as a Hugging Face Llama, never a training run
        return export_run(rundir.run_dir(cfg), cfg["export"], cfg["overwrite"])
    if cfg["sample"]:  # the run's checkpoint as it stands continues the prompts; nothing is written
        return print_samples(cfg)
    ckpt_path, resume_state, init_state = rundir.run_dir(cfg) / "ckpt.pt", None, None
    meta = TransformerLM(**model_kwargs(cfg), device="meta")  # shapes only, no memory: what a checkpoint must fit
    if cfg["resume"]:  # the checkpoint is verified whole (config, shapes, RNG) before any data is read
        optimizer = make_optimizer(dict(cfg, compile=False), meta)
        resume_state = rundir.verify_resume(cfg, ckpt_path, MODEL_KEYS, meta, optimizer, CORPORA, config.FLAG_DEFAULTS)
    if cfg["init_from"] is not None and resume_state is None:  # another run's weights (a resumed run has its own)
        init_state = rundir.verify_init(cfg, MODEL_KEYS, model_kwargs(), meta)
    train_ids, valid_ids, tok, tok_files, cfg["data_fingerprint"] = machine.rank0_first(cfg, prepare)
    if resume_state is not None:  # the same config is not enough: the same token files and tokenizer too
        rundir.check_same_data(resume_state, cfg, ckpt_path)
        rundir.note_extension(resume_state, cfg)
        if rundir.run_complete(resume_state, cfg, ckpt_path, tok):  # its end written: says so, writes nothing
            return 0
    top = check_data(cfg, train_ids, valid_ids, tok)  # ids in the vocabulary (and their tokenizer's), windows fit
    config.check_samples(cfg, tok, tok_files, top, EOT)  # what would fail at the very end is refused now
    baseline = unigram_loss(train_ids, valid_ids, cfg["vocab_size"])
    log(f"data: {len(train_ids):,} train / {len(valid_ids):,} validation tokens; unigram baseline "
        f"{baseline:.4f} nats/token")
    with rundir.run_lock(cfg), machine.torch_settings(cfg), rundir.divergence_recorded(cfg):  # all checked: 1st write
        return train(cfg, train_ids, valid_ids, tok, tok_files, ckpt_path.parent, resume_state, baseline, init_state)


# what goes on after a fault, or a stop outside the loop (the loop's own stops say rundir.resume_command)
GO_ON = "rerun the same command (once the run has saved its first checkpoint: with --resume, without --overwrite)"
LESS_MEMORY = ("ask for less: a smaller --batch-size or model, or the same batch in more --grad-accum steps or with "
               "--activation-checkpointing (a run with a ckpt.pt goes on with those two and --resume).")


def main(argv=None):
    """Exit code: 0 done, 1 a fault (no data, a full disk, a diverged run), 2 a usage mistake, 130 stopped."""
    def go():
        cfg = resolve_config(argv)
        said = next((f"--{mode} writes nothing" for mode in ("sample", "benchmark") if cfg[mode]), None)  # not --resume
        then = ("run the same command again" if said or cfg["export"] is not None else GO_ON if cfg["overwrite"] else
                f"run {rundir.resume_command(cfg)} to continue from the last checkpoint")  # overwrite: whose checkpoint?
        with cli.ctrl_c_says(f"train.py: interrupted; {said}.") if said else contextlib.nullcontext():
            with machine.process_group(cfg), cli.disk_full(rundir.run_dir(cfg), then), rundir.compile_failures(cfg):
                return run(cfg)
        return 130
    return cli.exit_code("train.py", go, f"every file written is whole: {GO_ON} to go on.", less_memory=LESS_MEMORY,
                         then=GO_ON)


if __name__ == "__main__":
    cli.catch_ctrl_c()  # a KeyboardInterrupt (bpe.py's pool workers hold Ctrl-C blocked: this process ends them)
    cli.escaping_stdout()  # a terminal that cannot show a sample's text; a closed stdout (>&-) as /dev/null
    cli.exit_quietly(main())
