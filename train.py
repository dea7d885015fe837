"""Train a Transformer LM: from raw text to a checkpoint and samples, on one CPU or many GPUs.

CS336 assignment 1, sections 5-7, grown into the script people actually run:

    python train.py                          # offline: Python's own docs, a few minutes on a laptop CPU
    python train.py --data tinystories       # the handout's TinyStories run (downloads into data/)
    python train.py --data owt               # the OpenWebText sample
    python train.py --data my.txt            # any text file; --data my.npy for pre-tokenized ids
    torchrun --nproc_per_node=8 train.py --data tinystories   # DistributedDataParallel
    python train.py --data tinystories --benchmark --device cuda  # tokens/s and MFU, random tokens

What this file teaches, in reading order:
  1. Data: the built-in corpus (the documentation topics that ship inside every Python, in
     `pydoc_data`), resumable downloads of the CS336 datasets, a BPE tokenizer from bpe.py,
     and token ids stored as uint16 .npy files that are read back with np.memmap.
  2. get_batch: random windows of the memmap -> inputs x and next-token targets y.
  3. Checkpoints: save_checkpoint / load_checkpoint (the CS336 adapters), atomic writes, and
     the extra state (config, RNG states) that makes a resumed run bitwise identical.
  4. Configuration: flags, per-dataset presets, and every check that runs before anything
     is written (a usage mistake exits with code 2 and one sentence).
  5. The training step: gradient accumulation, bf16 autocast, DDP, clipping, AdamW, cosine lr.
  6. The training loop: evaluation, logging (console + metrics.jsonl), checkpoints, NaN and
     Ctrl-C handling, samples at the end.
  7. --benchmark, --plot and main().
"""
import argparse
import contextlib
import gzip
import hashlib
import json
import math
import os
import shutil
import signal
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import torch

import accounting
from bpe import Tokenizer, atomic_file, encode_file, train_bpe
from model import TransformerLM, generate
from optim import AdamW, clip_grad_norm, cosine_lr, cross_entropy, perplexity

EOT = "<|endoftext|>"  # the document separator of every CS336 corpus


class UsageError(Exception):
    """A mistake in the flags or the inputs: main() prints the sentence and exits with 2."""


class DataError(Exception):
    """The data could not be fetched (offline, server down): main() prints it and exits with 1."""


def process_rank():
    """This process's rank under torchrun (0 when run alone)."""
    return int(os.environ.get("RANK", "0"))


def log(*args, **kwargs):
    # only rank 0 talks, so that N processes print one story
    if process_rank() == 0:
        print(*args, **kwargs, flush=True)


def atomic_write_text(path, text):
    with atomic_file(path, "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------
# 1. Data: built-in corpus, downloads, tokenizer, uint16 token files

HF = "https://huggingface.co"  # HF_ENDPOINT overrides it (a mirror, or a local server in the tests)
DATASETS = {
    "tinystories": {
        "train": "datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt",
        "valid": "datasets/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt",
    },
    "owt": {
        "train": "datasets/stanford-cs336/owt-sample/resolve/main/owt_train.txt.gz",
        "valid": "datasets/stanford-cs336/owt-sample/resolve/main/owt_valid.txt.gz",
    },
}


def pydoc_corpus(out_dir):
    """Python's reference-manual topics (the text behind `help('if')`): ~0.5 MB of English that
    every Python installation carries. Whole topics go to one split, so validation text is unseen."""
    try:
        from pydoc_data.topics import topics  # stdlib: present offline on standard Pythons
    except ImportError:
        raise DataError("this Python has no pydoc_data module (some distributions strip it); "
                        "pass --data PATH.txt with any English text file instead.") from None
    names = sorted(topics)
    valid = [topics[k] for i, k in enumerate(names) if i % 10 == 5]  # every 10th topic
    train = [topics[k] for i, k in enumerate(names) if i % 10 != 5]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.txt", out_dir / "valid.txt"
    for path, docs in zip(paths, (train, valid)):
        if not path.exists():
            atomic_write_text(path, EOT.join(docs))
    return paths


def _progress(name, done, total, t0):
    mb, rate = done / 1e6, done / 1e6 / max(time.time() - t0, 1e-9)
    if total:
        bar = "#" * int(30 * done / total)
        msg = f"\r  {name} [{bar:<30}] {100 * done / total:5.1f}% {mb:,.1f}/{total / 1e6:,.1f} MB {rate:.1f} MB/s"
    else:
        msg = f"\r  {name} {mb:,.1f} MB {rate:.1f} MB/s"
    print(msg, end="", file=sys.stderr, flush=True)


def download(url, dest, progress=True):
    """Fetch url into dest. Bytes land in dest.part first; a rerun after an interruption asks
    the server for the rest only (an HTTP Range request) and appends. dest appears, by rename,
    only when complete."""
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # "range not satisfiable": the .part already holds every byte
            os.replace(part, dest)
            return dest
        raise
    with resp:
        resumed = have > 0 and resp.status == 206  # a server that ignores Range sends it all again
        if not resumed:
            have = 0
        size = resp.headers.get("Content-Length")
        total = int(size) + have if size is not None else None
        t0, done = time.time(), have
        with open(part, "ab" if resumed else "wb") as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
                done += len(chunk)
                if progress:
                    _progress(dest.name, done, total, t0)
    if progress:
        print(file=sys.stderr)
    if total is not None and done != total:
        raise DataError(f"the download of {url} stopped at {done} of {total} bytes; run the same command again to resume it.")
    os.replace(part, dest)
    return dest


def downloaded_corpus(name, out_dir):
    """The CS336 train/valid text files, fetched once into data/<name>/ (gzip is unpacked)."""
    base = os.environ.get("HF_ENDPOINT", HF).rstrip("/")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, rel in DATASETS[name].items():
        url = f"{base}/{rel}"
        txt = out_dir / Path(rel).name.removesuffix(".gz")
        if not txt.exists():
            fetched = out_dir / Path(rel).name
            if not fetched.exists():
                log(f"downloading {url}")
                try:
                    download(url, fetched)
                except (urllib.error.URLError, OSError, TimeoutError) as e:
                    reason = getattr(e, "reason", e)
                    raise DataError(
                        f"could not download {url} ({reason}); download {Path(rel).name} yourself "
                        f"(the {split} split) and put it in {out_dir}/, or set HF_ENDPOINT to a mirror.") from None
            if fetched.suffix == ".gz":
                log(f"unpacking {fetched.name}")
                with gzip.open(fetched, "rb") as src, atomic_file(txt) as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)
        paths.append(txt)
    return tuple(paths)


def local_corpus(path, out_dir, valid_fraction=0.1):
    """Split a local text file: whole documents (separated by <|endoftext|>) go to validation
    from the end until it holds ~10% of the text; a single document is cut at a line break."""
    paths = out_dir / "train.txt", out_dir / "valid.txt"
    if all(p.exists() for p in paths):
        return paths
    text = path.read_text(encoding="utf-8", errors="replace")
    docs = text.split(EOT)
    if len(docs) >= 10:
        k, tail = len(docs), 0
        while k > 1 and tail < valid_fraction * len(text):
            k -= 1
            tail += len(docs[k])
        train, valid = EOT.join(docs[:k]), EOT.join(docs[k:])
    else:
        cut = text.rfind("\n", 0, int(len(text) * (1 - valid_fraction)))
        cut = cut + 1 if cut > 0 else int(len(text) * (1 - valid_fraction))
        train, valid = text[:cut], text[cut:]
    out_dir.mkdir(parents=True, exist_ok=True)
    for p, t in zip(paths, (train, valid)):
        if not p.exists():
            atomic_write_text(p, t)
    return paths


def tokenize_corpus(train_txt, valid_txt, vocab_size, out_dir, workers=None):
    """Train BPE on the train split (bpe.py), then write both splits as token-id .npy files.
    Every file is written atomically, so 'it exists' means 'it is complete' and reruns skip it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_path, merges_path = out_dir / "vocab.json", out_dir / "merges.txt"
    if not (vocab_path.exists() and merges_path.exists()):
        log(f"training a {vocab_size}-token BPE tokenizer on {train_txt}")
        t0 = time.time()
        vocab, merges = train_bpe(str(train_txt), vocab_size, special_tokens=[EOT], num_workers=workers)
        tok = Tokenizer(vocab, merges, [EOT])
        tmp = out_dir / f"tmp{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        tok.save(str(tmp / "vocab.json"), str(tmp / "merges.txt"))
        os.replace(tmp / "merges.txt", merges_path)  # merges first: vocab.json marks completion
        os.replace(tmp / "vocab.json", vocab_path)
        tmp.rmdir()
        log(f"  done in {time.time() - t0:.1f}s")
    tok = Tokenizer.from_files(str(vocab_path), str(merges_path), [EOT])
    npys = []
    for txt, name in ((train_txt, "train.npy"), (valid_txt, "valid.npy")):
        npy = out_dir / name
        if not npy.exists():
            log(f"tokenizing {txt} -> {npy}")
            encode_file(tok, str(txt), str(npy), num_workers=workers, progress=process_rank() == 0)
        npys.append(npy)
    return tok, (vocab_path, merges_path), tuple(npys)


def prepare_data(cfg):
    """--data -> (train ids, valid ids, tokenizer or None, tokenizer files or None).
    Text is turned into token files under --data-dir once; the ids are opened as memmaps."""
    data_dir = Path(cfg["data_dir"])
    src = cfg["data"]
    tok, tok_files = None, None
    if src.endswith(".npy"):
        try:
            train = np.load(src, mmap_mode="r")
            valid = np.load(cfg["val_data"], mmap_mode="r") if cfg["val_data"] else None
        except (ValueError, OSError, EOFError) as e:
            raise UsageError(f"--data/--val-data: cannot read the .npy file ({e}); save ids with np.save.") from None
        for name, d in (("--data", train), ("--val-data", valid)):
            if d is not None and d.ndim != 1:
                raise UsageError(f"{name}: the ids must be a 1-D array, got shape {d.shape}.")
        if valid is None:  # the last 10% of the ids, still a memmap view
            cut = int(len(train) * 0.9)
            train, valid = train[:cut], train[cut:]
        here = Path(src).parent  # a tokenizer saved beside the ids decodes the samples
        if (here / "vocab.json").exists() and (here / "merges.txt").exists():
            tok_files = here / "vocab.json", here / "merges.txt"
            tok = Tokenizer.from_files(str(tok_files[0]), str(tok_files[1]), [EOT])
        return train, valid, tok, tok_files
    if src == "pydoc":
        texts = pydoc_corpus(data_dir / f"pydoc-py{sys.version_info[0]}{sys.version_info[1]}")
    elif src in DATASETS:
        texts = downloaded_corpus(src, data_dir / src)
    else:
        p = Path(src).resolve()
        st = p.stat()
        key = hashlib.sha1(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:8]
        texts = local_corpus(p, data_dir / f"{p.stem}-{key}")  # a changed file gets a fresh cache
    tok, tok_files, (train_npy, valid_npy) = tokenize_corpus(
        *texts, cfg["vocab_size"], texts[0].parent / f"bpe{cfg['vocab_size']}", cfg["workers"])
    return np.load(train_npy, mmap_mode="r"), np.load(valid_npy, mmap_mode="r"), tok, tok_files


def id_range(data, chunk=1 << 24):
    """(smallest, largest) token id, read chunk by chunk so a memmap is never loaded whole."""
    parts = [(int(data[i:i + chunk].min()), int(data[i:i + chunk].max())) for i in range(0, len(data), chunk)]
    return min(p[0] for p in parts), max(p[1] for p in parts)


def unigram_loss(train, valid, vocab_size, limit=100_000_000):
    """The baseline a model must beat: cross-entropy (nats/token) of the validation ids under
    the train ids' unigram distribution, add-one smoothed, from the first `limit` train ids.
        L = -sum_v q(v) log p(v),  p(v) = (count_train(v) + 1) / (N + V),  q = valid frequencies"""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, min(len(train), limit), 1 << 24):
        counts += np.bincount(train[i:min(i + (1 << 24), limit)], minlength=vocab_size)
    p = (counts + 1) / (counts.sum() + vocab_size)
    q = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(valid), 1 << 24):
        q += np.bincount(valid[i:i + (1 << 24)], minlength=vocab_size)
    return float(-(q * np.log(p)).sum() / q.sum())


# ----------------------------------------------------------------------------
# 2. Batches: random windows of a memmap

def sample_starts(n_tokens, context_length, batch_size, generator=None):
    """batch_size window starts, uniform over [0, n_tokens - context_length): the window
    start..start+context_length (inclusive) must fit, because y is x shifted by one."""
    return torch.randint(n_tokens - context_length, (batch_size,), generator=generator).numpy()


def windows(data, starts, context_length, device):
    """Gather the windows (only those pages of the memmap are read) -> x, y int64 (B, T)."""
    idx = starts[:, None] + np.arange(context_length + 1)  # (B, T+1)
    w = torch.from_numpy(data[idx].astype(np.int64))
    x, y = w[:, :-1], w[:, 1:]
    if str(device).startswith("cuda"):  # pinned memory lets the copy overlap with compute
        return (x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True))
    return x.contiguous().to(device), y.contiguous().to(device)


def get_batch(data, batch_size, context_length, device, generator=None):
    """CS336 data loader: (x, y), each (batch_size, context_length) int64 on `device`, where
    y[b, t] = data[s_b + t + 1] is the token that follows x[b, t] = data[s_b + t]."""
    return windows(data, sample_starts(len(data), context_length, batch_size, generator), context_length, device)


# ----------------------------------------------------------------------------
# 3. Checkpoints

def _unwrap(model):
    """The plain module inside DDP (.module) and torch.compile (._orig_mod): its state-dict keys
    are the contract (layers.0.attn.q_proj.weight, ...), without wrapper prefixes."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def save_checkpoint(model, optimizer, iteration, out, **extra):
    """Save model, optimizer and iteration (plus any `extra` entries: config, RNG states) to a
    path or binary file object. To a path the write is atomic: a kill mid-save leaves the
    previous checkpoint intact, because the new one only replaces it by rename when complete."""
    state = {"model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
             "iteration": int(iteration), **extra}
    if not isinstance(out, (str, os.PathLike)):
        torch.save(state, out)
        return
    with atomic_file(out) as f:
        torch.save(state, f)


def read_checkpoint(src):
    """The checkpoint dict. weights_only=True: tensors and plain Python values only, so a
    checkpoint file cannot run code when it is loaded."""
    return torch.load(src, map_location="cpu", weights_only=True)


def load_checkpoint(src, model, optimizer=None, state=None):
    """Restore model (and optimizer) from a path or file object; return the saved iteration."""
    state = read_checkpoint(src) if state is None else state
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["iteration"]


# ----------------------------------------------------------------------------
# 4. Configuration: flags, presets, checks

# The flags below default to None and take their value from the preset of the data source:
# the built-in corpus and local files use "small", sized to train in minutes on 2 CPU cores;
# tinystories and owt use the handout's section 7 configuration.
PRESETS = {
    "small": dict(vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4, d_ff=384,
                  batch_size=32, max_iters=700, total_tokens=None, lr=5e-3, min_lr=5e-4, warmup_iters=50,
                  eval_interval=100, eval_iters=10),
    "tinystories": dict(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344,
                        batch_size=128, max_iters=None, total_tokens=327_680_000, lr=3e-3, min_lr=3e-4,
                        warmup_iters=200, eval_interval=500, eval_iters=50),
    "owt": dict(vocab_size=32000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344,
                batch_size=128, max_iters=None, total_tokens=327_680_000, lr=3e-3, min_lr=3e-4,
                warmup_iters=200, eval_interval=500, eval_iters=50),
}
ABLATIONS = ("no_norm", "post_norm", "nope", "silu_ffn", "tie_embeddings")
# What shapes the trajectory: --resume refuses a checkpoint that disagrees on any of these.
TRAJECTORY_KEYS = ("data", "val_data", "vocab_size", "context_length", "d_model", "num_layers", "num_heads",
                   "d_ff", "rope_theta", *ABLATIONS, "batch_size", "grad_accum", "max_iters", "lr", "min_lr",
                   "warmup_iters", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "dtype", "seed")


def preset_name(data):
    return data if data in ("tinystories", "owt") else "small"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # "(default: X)" only where X says something
        if action.default in (None, False) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line (no usage dump), exit code 2
        print(f"train.py: error: {message} (see python train.py --help)", file=sys.stderr)
        sys.exit(2)


def build_parser():
    def dflt(key):
        s, t, o = (PRESETS[p][key] for p in ("small", "tinystories", "owt"))
        if s == t == o:
            return f"default: {s}"
        return f"default: {s}; tinystories/owt {t}" if t == o else f"default: {s}; tinystories {t}; owt {o}"

    p = Parser(description="Train a Transformer LM (CS336 assignment 1). With no flags: a small model on "
                           "Python's built-in documentation, offline, in minutes on a CPU.",
               formatter_class=HelpFormatter)
    g = p.add_argument_group("data and output")
    g.add_argument("--data", default="pydoc", help="pydoc (built-in, offline), tinystories, owt (downloaded into "
                   "--data-dir), PATH.txt (trained on after a BPE tokenizer is fitted) or PATH.npy (token ids)")
    g.add_argument("--val-data", default=None, help="validation ids (.npy) for --data PATH.npy; default: its last 10%%")
    g.add_argument("--data-dir", default="data", help="cache for downloads, tokenizers and token files")
    g.add_argument("--out-dir", default="out", help="runs are written to OUT_DIR/RUN_NAME/")
    g.add_argument("--run-name", default=None, help="default: the data source's name")
    g.add_argument("--workers", type=int, default=None, help="processes for tokenizer training and tokenizing "
                   "(default: all cores)")
    g = p.add_argument_group("model shape (defaults depend on --data)")
    g.add_argument("--vocab-size", type=int, help=dflt("vocab_size"))
    g.add_argument("--context-length", type=int, help=dflt("context_length"))
    g.add_argument("--d-model", type=int, help=dflt("d_model"))
    g.add_argument("--num-layers", type=int, help=dflt("num_layers"))
    g.add_argument("--num-heads", type=int, help=dflt("num_heads"))
    g.add_argument("--d-ff", type=int, help=dflt("d_ff"))
    g.add_argument("--rope-theta", type=float, default=10000.0, help="RoPE base")
    g = p.add_argument_group("ablations (handout section 7.3)")
    g.add_argument("--no-norm", action="store_true", help="remove every RMSNorm")
    g.add_argument("--post-norm", action="store_true", help="normalize after each residual add")
    g.add_argument("--nope", action="store_true", help="no position embedding (no RoPE)")
    g.add_argument("--silu-ffn", action="store_true", help="W2 silu(W1 x) feed-forward instead of SwiGLU")
    g.add_argument("--tie-embeddings", action="store_true", help="lm_head shares the embedding matrix")
    g = p.add_argument_group("optimization (defaults of the first four depend on --data)")
    g.add_argument("--batch-size", type=int, help="sequences per optimizer step, over all processes and "
                   "accumulation steps; " + dflt("batch_size"))
    g.add_argument("--max-iters", type=int, help=f"optimizer steps; default: {PRESETS['small']['max_iters']}; "
                   "tinystories/owt: set by --total-tokens")
    g.add_argument("--total-tokens", type=int, help="instead of --max-iters: steps = total / (batch * context); "
                   f"default for tinystories/owt: {PRESETS['tinystories']['total_tokens']:,}")
    g.add_argument("--lr", type=float, help="peak learning rate; " + dflt("lr"))
    g.add_argument("--min-lr", type=float, help="final learning rate of the cosine; " + dflt("min_lr"))
    g.add_argument("--warmup-iters", type=int, help="linear warm-up steps; " + dflt("warmup_iters"))
    g.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (same update, "
                   "less memory)")
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    g.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2")
    g.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="clip the global gradient L2 norm (0: off)")
    g.add_argument("--seed", type=int, default=1337, help="seeds the initialization and the batch order")
    g = p.add_argument_group("logging, evaluation, checkpoints")
    g.add_argument("--eval-interval", type=int, help="steps between validation runs; " + dflt("eval_interval"))
    g.add_argument("--eval-iters", type=int, help="batches per validation run; " + dflt("eval_iters"))
    g.add_argument("--log-interval", type=int, default=10, help="steps between metrics.jsonl lines")
    g.add_argument("--checkpoint-interval", type=int, default=500, help="steps between checkpoints "
                   "(one also at the start and the end)")
    g.add_argument("--resume", action="store_true", help="continue OUT_DIR/RUN_NAME/ckpt.pt; pass the same "
                   "flags as the first run")
    g.add_argument("--plot", action="store_true", help="draw loss.png (needs matplotlib)")
    g = p.add_argument_group("hardware")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps; default: cuda when available")
    g.add_argument("--dtype", default=None, choices=["float32", "bf16"], help="bf16 = bfloat16 autocast with float32 "
                   "weights and optimizer state; default: bf16 on cuda, float32 elsewhere")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--fast", action=argparse.BooleanOptionalAction, default=True,
                   help="model.py's fused kernels (same parameters and function); --no-fast runs the "
                        "from-scratch reference path")
    g.add_argument("--activation-checkpointing", action="store_true", help="keep only each block's input in "
                   "the forward pass and recompute the rest in backward (less memory, ~1/3 more compute)")
    g.add_argument("--benchmark", action="store_true", help="time training steps of this configuration on "
                   "random tokens (no dataset needed), print tokens/s and MFU, write nothing")
    g.add_argument("--benchmark-steps", type=int, default=20, help="timed steps after 5 warm-up steps")
    g.add_argument("--vs-llama", action="store_true", help="with --benchmark: also time Hugging Face "
                   "transformers' LlamaForCausalLM (SDPA attention) of the same shape with torch.optim.AdamW, "
                   "steps interleaved with ours (needs: pip install transformers)")
    g = p.add_argument_group("samples at the end")
    g.add_argument("--num-samples", type=int, default=3, help="samples written to samples.txt")
    g.add_argument("--sample-tokens", type=int, default=200, help="new tokens per sample")
    g.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling threshold")
    g.add_argument("--prompt", default="", help="text the samples continue; default: a new document")
    return p


def resolve_config(argv=None):
    """Flags -> one flat dict: preset values fill what was not given; the device and dtype are
    decided; the batch is split over processes and accumulation steps. Raises UsageError."""
    args = build_parser().parse_args(argv)
    cfg = vars(args)
    preset = PRESETS[preset_name(cfg["data"])]
    explicit_tokens, explicit_iters = cfg["total_tokens"] is not None, cfg["max_iters"] is not None
    explicit_warmup = cfg["warmup_iters"] is not None
    if explicit_tokens and explicit_iters:
        raise UsageError("--max-iters and --total-tokens both set the run length; pass only one of them.")
    for k, v in preset.items():
        if cfg.get(k) is None and not (k in ("max_iters", "total_tokens") and (explicit_tokens or explicit_iters)):
            cfg[k] = v
    src = cfg["data"]
    if src not in ("pydoc", *DATASETS):
        if not Path(src).is_file():
            raise UsageError(f"--data {src}: no such file; pass pydoc, tinystories, owt, a .txt file or a .npy file.")
        if Path(src).stat().st_size == 0:
            raise UsageError(f"--data {src} is empty; pass a file with text or token ids.")
    if cfg["val_data"] and not src.endswith(".npy"):
        raise UsageError("--val-data goes with --data PATH.npy only; text data is split automatically.")
    if cfg["val_data"] and not Path(cfg["val_data"]).is_file():
        raise UsageError(f"--val-data {cfg['val_data']}: no such file.")
    cfg["run_name"] = cfg["run_name"] or (src if src in ("pydoc", *DATASETS) else Path(src).stem)

    positive = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "batch_size",
                "grad_accum", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval", "benchmark_steps")
    for k in positive:
        if cfg[k] <= 0:
            raise UsageError(f"--{k.replace('_', '-')} must be positive, got {cfg[k]}.")
    for k in ("lr", "min_lr", "eps", "weight_decay", "grad_clip", "warmup_iters", "temperature", "num_samples",
              "sample_tokens"):
        if cfg[k] < 0:
            raise UsageError(f"--{k.replace('_', '-')} must not be negative, got {cfg[k]}.")
    if cfg["rope_theta"] <= 0:
        raise UsageError(f"--rope-theta must be positive, got {cfg['rope_theta']}.")
    if not src.endswith(".npy") and not cfg["benchmark"] and cfg["vocab_size"] < 257:
        raise UsageError(f"--vocab-size {cfg['vocab_size']} leaves no room for BPE on text data: it needs 256 bytes "
                         "+ 1 special token, so at least 257.")
    if cfg["d_model"] % cfg["num_heads"]:
        raise UsageError(f"--d-model {cfg['d_model']} is not divisible by --num-heads {cfg['num_heads']}.")
    if not cfg["nope"] and (cfg["d_model"] // cfg["num_heads"]) % 2:
        raise UsageError(f"RoPE needs an even head size, but --d-model/--num-heads = {cfg['d_model'] // cfg['num_heads']}; "
                         "change them or pass --nope.")
    if cfg["no_norm"] and cfg["post_norm"]:
        raise UsageError("--no-norm and --post-norm contradict each other; pass one of them.")
    if not (0 <= cfg["beta1"] < 1 and 0 <= cfg["beta2"] < 1):
        raise UsageError(f"--beta1 and --beta2 must lie in [0, 1), got {cfg['beta1']} and {cfg['beta2']}.")
    if not 0 < cfg["top_p"] <= 1:
        raise UsageError(f"--top-p must lie in (0, 1], got {cfg['top_p']}.")
    if cfg["min_lr"] > cfg["lr"]:
        raise UsageError(f"--min-lr {cfg['min_lr']} is above --lr {cfg['lr']}.")
    if cfg["workers"] is not None and cfg["workers"] <= 0:
        raise UsageError(f"--workers must be positive, got {cfg['workers']}.")
    if cfg["resume"] and cfg["benchmark"]:
        raise UsageError("--benchmark writes nothing and reads no checkpoint; drop --resume.")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg["world_size"] = world
    if cfg["batch_size"] % (world * cfg["grad_accum"]):
        raise UsageError(f"--batch-size {cfg['batch_size']} does not divide into {world} processes x "
                         f"--grad-accum {cfg['grad_accum']}; make it a multiple of {world * cfg['grad_accum']}.")
    cfg["micro_batch"] = cfg["batch_size"] // (world * cfg["grad_accum"])
    if cfg["max_iters"] is None:
        cfg["max_iters"] = cfg["total_tokens"] // (cfg["batch_size"] * cfg["context_length"])
    if cfg["max_iters"] <= 0:
        raise UsageError(f"--max-iters must be positive, got {cfg['max_iters']}." if explicit_iters else
                         "--total-tokens is smaller than one batch (batch size x context length); raise it.")
    cfg["total_tokens"] = cfg["max_iters"] * cfg["batch_size"] * cfg["context_length"]
    if cfg["warmup_iters"] > cfg["max_iters"]:
        if explicit_warmup:
            raise UsageError(f"--warmup-iters {cfg['warmup_iters']} is longer than the run ({cfg['max_iters']} steps).")
        cfg["warmup_iters"] = cfg["max_iters"] // 10  # a preset warm-up shrinks to fit a short run

    dev = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    kind = dev.split(":")[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device {dev}: unknown device; use cpu, cuda, cuda:N or mps.")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {dev}: this PyTorch sees no CUDA GPU; use --device cpu.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {dev}: MPS is not available here; use --device cpu.")
    if kind == "cuda" and world > 1:
        dev = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    cfg["device"] = dev
    cfg["dtype"] = cfg["dtype"] or ("bf16" if kind == "cuda" else "float32")
    if cfg["dtype"] == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--dtype bf16: this GPU has no bfloat16 support; use --dtype float32.")
    return cfg


def model_kwargs(cfg):
    keys = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", *ABLATIONS, "fast")
    return {k: cfg[k] for k in keys}


def check_output_dir(run_dir):
    """Refuse early, before anything is written, if the run directory cannot be created."""
    p = run_dir
    while not p.exists():
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--out-dir: cannot write to {p}; pick a writable --out-dir.")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir} exists and is not a directory; pick another --run-name or --out-dir.")


def check_resume(cfg, ckpt_path):
    """The saved config must agree with this one on everything that shapes the trajectory."""
    if not ckpt_path.exists():  # killed before its first checkpoint: step 0 is where it stood
        log(f"note: --resume found no checkpoint {ckpt_path}; starting from step 0")
        return None
    try:
        state = read_checkpoint(ckpt_path)
    except Exception as e:
        raise UsageError(f"--resume: {ckpt_path} is not a readable checkpoint ({type(e).__name__}).") from None
    old = state.get("config", {})
    diff = [f"{k} ({old.get(k)!r} -> {cfg[k]!r})" for k in TRAJECTORY_KEYS if old.get(k) != cfg[k]]
    if diff:
        raise UsageError(f"--resume: {ckpt_path} was trained with a different config; keys that differ: "
                         f"{', '.join(diff)}.")
    return state


# ----------------------------------------------------------------------------
# 5. The training step

def autocast(cfg):
    """bf16 autocast: matmuls run in bfloat16, while weights, gradients and AdamW state stay
    float32 (the "master weights"), so small updates are not rounded away."""
    if cfg["dtype"] != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=cfg["device"].split(":")[0], dtype=torch.bfloat16)


def use_activation_checkpointing(model):
    """Lecture 2: instead of keeping every activation of every block for backward, keep only
    each block's input (x h1 h2 ... in the lecture's picture) and recompute the block's
    internals (attention scores, FFN hidden layer) during backward. Memory for activations
    drops from O(L * per-block) to O(L * d_model) per token; the cost is one more forward."""
    from torch.utils.checkpoint import checkpoint
    for block in _unwrap(model).layers:
        def fwd(*args, _inner=block.forward, **kwargs):
            if not torch.is_grad_enabled():  # evaluation / generation: nothing to save anyway
                return _inner(*args, **kwargs)
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)
        block.forward = fwd


def build(cfg):
    """The model as configured, its AdamW, and the wrapped model the step calls: activation
    checkpointing, then torch.compile, then DDP (compile first, so DDP sees one module)."""
    torch.manual_seed(cfg["seed"])  # the same initial weights on every process
    raw = TransformerLM(**model_kwargs(cfg), device=cfg["device"])
    optimizer = AdamW(raw.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                      weight_decay=cfg["weight_decay"])
    if cfg["activation_checkpointing"]:
        use_activation_checkpointing(raw)
    model = torch.compile(raw) if cfg["compile"] else raw
    if cfg["world_size"] > 1:
        from torch.nn.parallel import DistributedDataParallel
        dev = torch.device(cfg["device"])
        model = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    return raw, model, optimizer


def train_step(model, optimizer, micro_batches, lr, cfg):
    """One optimizer step over the global batch.

    Gradient accumulation: each micro-batch loss is divided by the number of micro-steps, so
    the summed gradients equal the gradient of the mean loss over the whole batch (all
    micro-batches have the same size). Under DDP, backward all-reduces (averages) gradients
    over processes; no_sync() skips that on all but the last micro-step.
    Returns the mean loss over the global batch (a tensor) and the pre-clip gradient norm."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n = len(micro_batches)
    loss_sum = torch.zeros((), device=cfg["device"])
    for i, (x, y) in enumerate(micro_batches):
        sync = i == n - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast(cfg):
            logits = model(x)  # (B, T, vocab)
            loss = cross_entropy(logits.float(), y)
        (loss / n).backward()
        loss_sum += loss.detach()
    loss = loss_sum / n
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(loss)
        loss /= cfg["world_size"]
    norm = clip_grad_norm(model.parameters(), cfg["grad_clip"]) if cfg["grad_clip"] > 0 else None
    return loss, norm


def step_flops(cfg):
    """FLOPs of one optimizer step = 3 x forward FLOPs (backward is twice the forward) x sequences,
    with the forward counted by accounting.py (the matmuls, attention included)."""
    fwd = accounting.lm_forward_flops(cfg["vocab_size"], cfg["context_length"], cfg["d_model"], cfg["num_layers"],
                                      cfg["d_ff"], silu_ffn=cfg["silu_ffn"])
    return accounting.training_step_flops(fwd) * cfg["batch_size"]


def device_peak(cfg):
    """The device's peak FLOP/s for this dtype (accounting.py's table, or a measured CPU matmul peak)."""
    try:
        dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32
        return accounting.peak_flops(torch.device(cfg["device"]), dtype)
    except Exception:  # MFU is a nicety: a missing table entry must not stop training
        return None


# ----------------------------------------------------------------------------
# 6. The training loop

@torch.no_grad()
def evaluate(model, data, cfg, rank):
    """Mean loss over eval_iters batches. The windows come from a generator seeded afresh each
    time, so every evaluation scores the same text, and the training batch RNG is untouched
    (which a bitwise-identical resume relies on)."""
    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    model.eval()
    total = torch.zeros((), device=cfg["device"])
    for _ in range(cfg["eval_iters"]):
        # the global batch, split as in training: --grad-accum and the process count change nothing
        starts = sample_starts(len(data), cfg["context_length"], cfg["batch_size"], g)
        for mine in starts.reshape(cfg["grad_accum"], cfg["world_size"], cfg["micro_batch"])[:, rank]:
            x, y = windows(data, mine, cfg["context_length"], cfg["device"])
            with autocast(cfg):
                total += cross_entropy(model(x).float(), y)
    if cfg["world_size"] > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return float(total) / (cfg["eval_iters"] * cfg["grad_accum"] * cfg["world_size"])


def rng_state(batch_gen):
    state = {"batch_rng": batch_gen.get_state(), "torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state, batch_gen):
    # the "data position": batches are random windows, so where the data stream stands is the
    # state of the batch generator plus the step count
    batch_gen.set_state(state["batch_rng"])
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available() and len(state["cuda_rng"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def truncate_metrics(path, last_step):
    """On resume, drop what the interrupted run logged after its last checkpoint: those steps
    are about to be run again. The checkpoint's own step keeps its training line but not its
    validation line: a checkpoint is saved before that step's evaluation, which runs again."""
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
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to stop at the next step boundary, where the
    model and optimizer are consistent, so the checkpoint saved then is a valid one.
    A second Ctrl-C aborts at once."""

    def __init__(self):
        self.stop = False
        self.old = {}

    def _handler(self, signum, frame):
        if self.stop:
            raise KeyboardInterrupt
        self.stop = True
        log("\nstopping after this step; a checkpoint will be saved (Ctrl-C again to abort now)")

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            self.old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)


def write_samples(model, tok, cfg, path):
    g = torch.Generator(device=cfg["device"]).manual_seed(cfg["seed"])
    eot = tok.encode(EOT)[0]
    prompt = tok.encode(cfg["prompt"]) if cfg["prompt"] else [eot]
    out = []
    for i in range(cfg["num_samples"]):
        with autocast(cfg):
            ids = generate(model, prompt[-cfg["context_length"]:], cfg["sample_tokens"], temperature=cfg["temperature"],
                           top_p=cfg["top_p"], stop_id=eot, generator=g)
        out.append(cfg["prompt"] + tok.decode(ids))
    atomic_write_text(path, "".join(f"--- sample {i + 1} ---\n{s}\n" for i, s in enumerate(out)))
    return out


def train(cfg, train_data, valid_data, tok, run_dir, resume_state, rank):
    device, T = cfg["device"], cfg["context_length"]
    raw, model, optimizer = build(cfg)
    batch_gen = torch.Generator().manual_seed(cfg["seed"])  # the data order, on its own RNG
    start, elapsed = 0, 0.0
    metrics_path, ckpt_path = run_dir / "metrics.jsonl", run_dir / "ckpt.pt"
    if resume_state is not None:
        start = load_checkpoint(None, raw, optimizer, state=resume_state)
        restore_rng(resume_state["rng"], batch_gen)
        elapsed = resume_state.get("elapsed", 0.0)
        if rank == 0:
            truncate_metrics(metrics_path, start)
        log(f"resumed from {ckpt_path} at step {start}")
    elif rank == 0:
        metrics_path.write_text("")
    n_params = sum(p.numel() for p in raw.parameters())
    n_emb = raw.token_embeddings.weight.numel()
    log(f"model: {n_params / 1e6:.2f}M parameters ({(n_params - n_emb) / 1e6:.2f}M without the embedding), "
        f"device {device}, dtype {cfg['dtype']}, {cfg['world_size']} process(es)")

    def save(it):
        if rank == 0:
            save_checkpoint(raw, optimizer, it, ckpt_path, config=cfg, rng=rng_state(batch_gen),
                            elapsed=elapsed + time.time() - t_start)

    def record(entry):
        if rank == 0:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    flops, peak = step_flops(cfg), device_peak(cfg)
    tokens_per_step = cfg["batch_size"] * T
    t_start = time.time()
    if resume_state is None:
        save(0)  # a checkpoint exists from the first moment on, so --resume always has one
    val_loss = None
    tty = sys.stdout.isatty()
    t_last, dt_avg = time.time(), None
    window_time, window_steps = 0.0, 0  # step time since the last log line (evaluation excluded)
    with StopFlag() as stopper:
        for it in range(start, cfg["max_iters"]):
            if it % cfg["eval_interval"] == 0:
                val_loss = evaluate(model, valid_data, cfg, rank)
                record({"step": it, "tokens": it * tokens_per_step, "time": round(elapsed + time.time() - t_start, 3),
                        "val_loss": val_loss, "val_ppl": perplexity(val_loss)})
                log(("\r" if tty else "") + f"step {it}: val loss {val_loss:.4f} (ppl {perplexity(val_loss):.1f})"
                    + " " * 30)
                t_last = time.time()  # evaluation time does not count toward tokens/s
            # the global batch is drawn identically on every process; each takes its own slice
            starts = sample_starts(len(train_data), T, cfg["batch_size"], batch_gen)
            starts = starts.reshape(cfg["grad_accum"], cfg["world_size"], cfg["micro_batch"])[:, rank]
            micro = [windows(train_data, s, T, device) for s in starts]
            lr = cosine_lr(it, cfg["lr"], cfg["min_lr"], cfg["warmup_iters"], cfg["max_iters"])
            loss, norm = train_step(model, optimizer, micro, lr, cfg)
            loss_f = float(loss)
            if not math.isfinite(loss_f) or (norm is not None and not math.isfinite(norm)):
                what = f"the loss is {loss_f}" if not math.isfinite(loss_f) else f"the gradient norm is {norm}"
                log(f"\nerror: {what} at step {it + 1}; stopping. The last good checkpoint is "
                    f"{ckpt_path}; try a lower --lr or a --grad-clip.", file=sys.stderr)
                return 1
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step = it + 1
            now = time.time()
            dt, t_last = now - t_last, now
            dt_avg = dt if dt_avg is None else 0.9 * dt_avg + 0.1 * dt
            window_time, window_steps = window_time + dt, window_steps + 1
            tps = tokens_per_step * window_steps / window_time
            mfu = accounting.mfu(flops * window_steps, window_time, peak * cfg["world_size"]) if peak else None
            if step % cfg["log_interval"] == 0 or step == cfg["max_iters"]:
                window_time, window_steps = 0.0, 0
                record({"step": step, "tokens": step * tokens_per_step, "time": round(elapsed + now - t_start, 3),
                        "loss": loss_f, "lr": lr, "grad_norm": None if norm is None else float(norm),
                        "tokens_per_s": round(tps, 1), "mfu": None if mfu is None else round(mfu, 5)})
            if tty or step % cfg["log_interval"] == 0:
                line = (f"step {step}/{cfg['max_iters']} | loss {loss_f:.4f} | lr {lr:.2e} | "
                        f"{tps / 1e3:.1f}k tok/s" + (f" | MFU {100 * mfu:.1f}%" if mfu else "")
                        + f" | ETA {fmt_time(dt_avg * (cfg['max_iters'] - step))}")
                log(("\r" + line + "   ") if tty else line, end="" if tty else "\n")
            stop = stopper.stop
            if cfg["world_size"] > 1:  # every process must stop at the same step
                s = torch.tensor([float(stop)], device=device)
                torch.distributed.all_reduce(s)
                stop = bool(s.item())
            if (step % cfg["checkpoint_interval"] == 0 and step < cfg["max_iters"]) or stop:  # the end saves below
                save(step)
            if stop:
                log(f"\nstopped at step {step}; checkpoint saved to {ckpt_path}. Continue with the same "
                    "command plus --resume.")
                return 130
    if tty:
        log()
    final = cfg["max_iters"]
    val_loss = evaluate(model, valid_data, cfg, rank)
    record({"step": final, "tokens": final * tokens_per_step, "time": round(elapsed + time.time() - t_start, 3),
            "val_loss": val_loss, "val_ppl": perplexity(val_loss)})
    save(final)
    total = elapsed + time.time() - t_start
    log(f"done: {final} steps, {final * tokens_per_step / 1e6:.2f}M tokens in {fmt_time(total)}; "
        f"final val loss {val_loss:.4f} (ppl {perplexity(val_loss):.1f}), unigram baseline {cfg['unigram_loss']:.4f}")
    log(f"checkpoint: {ckpt_path}")
    if rank == 0 and tok is not None and cfg["num_samples"] > 0:
        samples = write_samples(raw, tok, cfg, run_dir / "samples.txt")
        log(f"sample (all in {run_dir / 'samples.txt'}):\n{samples[0]}")
    if rank == 0 and cfg["plot"]:
        plot(metrics_path, run_dir / "loss.png")
    return 0


# ----------------------------------------------------------------------------
# 7. --benchmark, --plot, main()

def llama_step(cfg, micro):
    """A standard implementation of the same shape, for comparison: Hugging Face's Llama
    (pre-norm RMSNorm, RoPE, SwiGLU, no biases, untied head) with torch's own AdamW and loss."""
    from transformers import LlamaConfig, LlamaForCausalLM
    V = cfg["vocab_size"]
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=cfg["d_model"], intermediate_size=cfg["d_ff"], num_hidden_layers=cfg["num_layers"],
        num_attention_heads=cfg["num_heads"], num_key_value_heads=cfg["num_heads"],
        max_position_embeddings=cfg["context_length"], rope_theta=cfg["rope_theta"], rms_norm_eps=1e-5,
        tie_word_embeddings=False, attn_implementation="sdpa")).to(cfg["device"])
    opt = torch.optim.AdamW(hf.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            weight_decay=cfg["weight_decay"])

    def step():
        for x, y in micro:
            logits = hf(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))
            (loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def benchmark(cfg):
    """Steps of the real training step on random tokens: warm-up (compilation, allocator),
    then timed steps, synchronized so the GPU's queue is really drained. With --vs-llama the
    two implementations alternate step by step, so both see the same machine load."""
    device, T = cfg["device"], cfg["context_length"]
    _, model, optimizer = build(cfg)
    data = torch.randint(cfg["vocab_size"], (cfg["grad_accum"], cfg["micro_batch"], T + 1), device=device)
    micro = [(d[:, :-1], d[:, 1:]) for d in data]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def step():
        train_step(model, optimizer, micro, cfg["lr"], cfg)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    steps = {"this project": step}
    if cfg["vs_llama"]:
        steps["HF LlamaForCausalLM + torch.optim.AdamW"] = llama_step(cfg, micro)
    for fn in steps.values():
        for _ in range(5):
            fn()
    times = {name: [] for name in steps}
    for _ in range(cfg["benchmark_steps"]):
        for name, fn in steps.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    dt = statistics.median(times["this project"])
    tps = cfg["batch_size"] * T / dt
    flops, peak = step_flops(cfg), device_peak(cfg)
    shape = ", ".join(f"{k}={cfg[k]}" for k in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads",
                                                 "d_ff", "batch_size"))
    log(f"benchmark: {shape}, device {device} x{cfg['world_size']}, dtype {cfg['dtype']}, compile {cfg['compile']}, "
        f"fast {cfg['fast']}, {torch.get_num_threads()} CPU threads, median of {cfg['benchmark_steps']} steps")
    log(f"  {1000 * dt:.1f} ms/step, {tps:,.0f} tokens/s, {flops / dt / 1e12:.2f} TFLOP/s achieved")
    if peak:
        log(f"  MFU {100 * flops / dt / (peak * cfg['world_size']):.1f}% of {peak / 1e12:.1f} TFLOP/s peak per device")
    log("  FLOPs per step = 3 x accounting.lm_forward_flops (forward matmuls incl. attention) x batch size")
    log(f"  {cfg['total_tokens']:,} tokens ({cfg['max_iters']} steps) would take {fmt_time(cfg['total_tokens'] / tps)}")
    for name, ts in times.items():
        if name != "this project":
            other = statistics.median(ts)
            log(f"  {name}: {1000 * other:.1f} ms/step, {cfg['batch_size'] * T / other:,.0f} tokens/s "
                f"(this project is {other / dt:.2f}x its speed)")
    return 0


def plot(metrics_path, png_path):
    """Loss against steps and against wall-clock time, side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    tr = [r for r in rows if "loss" in r]
    va = [r for r in rows if "val_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step", "step"), (axes[1], "time", "wall-clock seconds")):
        ax.plot([r[key] for r in tr], [r["loss"] for r in tr], label="train")
        ax.plot([r[key] for r in va], [r["val_loss"] for r in va], "o-", label="validation")
        ax.set_xlabel(label)
        ax.set_ylabel("loss (nats/token)")
        ax.legend()
    fig.tight_layout()
    with atomic_file(png_path) as f:
        fig.savefig(f, format="png")
    log(f"plot: {png_path}")


def run(argv=None):
    cfg = resolve_config(argv)
    rank, world = process_rank(), cfg["world_size"]
    run_dir = Path(cfg["out_dir"]) / cfg["run_name"]
    if cfg["plot"]:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install matplotlib (or drop --plot).") from None
    # CPU runs are made bitwise reproducible (what makes a resumed run identical): the
    # embedding's backward (an index_put with accumulate) otherwise adds rows in a
    # thread-dependent order
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_precision = torch.get_float32_matmul_precision()
    if cfg["device"] == "cpu":
        torch.use_deterministic_algorithms(True)
    if cfg["device"].startswith("cuda"):
        torch.set_float32_matmul_precision("high")  # TF32 matmuls for float32 runs
    if world > 1:
        import datetime
        backend = "nccl" if cfg["device"].startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(cfg["device"])
        # generous timeout: rank 0 may spend a long time downloading and tokenizing
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(hours=6))
    try:
        if cfg["benchmark"]:
            return benchmark(cfg)
        check_output_dir(run_dir)
        resume_state = check_resume(cfg, run_dir / "ckpt.pt") if cfg["resume"] else None

        # rank 0 prepares the data cache; the others wait for its verdict, then open the files
        err, prepared = None, None
        if rank == 0:
            try:
                prepared = prepare_data(cfg)
            except (UsageError, DataError) as e:
                err = (type(e).__name__, str(e))
        if world > 1:
            box = [err]
            torch.distributed.broadcast_object_list(box, src=0)
            err = box[0]
        if err:
            raise (UsageError if err[0] == "UsageError" else DataError)(err[1])
        train_data, valid_data, tok, tok_files = prepared or prepare_data(cfg)

        # the data must fit the model: ids below the vocab size, windows shorter than the data
        for name, d in (("train", train_data), ("validation", valid_data)):
            if d.ndim != 1 or d.dtype.kind not in "ui":
                raise UsageError(f"the {name} ids must be a 1-D integer array, got {d.dtype} of shape {d.shape}.")
            if len(d) <= cfg["context_length"]:
                raise UsageError(f"--context-length {cfg['context_length']} is not shorter than the {name} data "
                                 f"({len(d)} tokens); lower it or use more data.")
            lo, hi = id_range(d)
            if lo < 0:
                raise UsageError(f"the {name} data holds a negative token id ({lo}); token ids start at 0.")
            if hi >= cfg["vocab_size"]:
                raise UsageError(f"the {name} data holds token id {hi}, at or above --vocab-size "
                                 f"{cfg['vocab_size']}; pass a --vocab-size above its largest id.")
        cfg["unigram_loss"] = unigram_loss(train_data, valid_data, cfg["vocab_size"])
        log(f"data: {len(train_data):,} train / {len(valid_data):,} validation tokens; unigram baseline "
            f"{cfg['unigram_loss']:.4f} nats/token")

        # everything is checked: from here on the run directory is written
        if rank == 0:
            if resume_state is None and (run_dir / "ckpt.pt").exists():
                log(f"note: starting a new run in {run_dir}, replacing the one there (use --resume to continue it)")
            run_dir.mkdir(parents=True, exist_ok=True)
            for stale in run_dir.glob("*.tmp*"):  # left by a run killed mid-write
                stale.unlink()
            if tok_files:
                for f in tok_files:
                    shutil.copyfile(f, run_dir / f.name)
            atomic_write_text(run_dir / "config.json", json.dumps(cfg, indent=2) + "\n")
        return train(cfg, train_data, valid_data, tok, run_dir, resume_state, rank)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_float32_matmul_precision(was_precision)
        if world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def main(argv=None):
    try:
        return run(argv)
    except (UsageError, DataError) as e:
        if process_rank() == 0:
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except KeyboardInterrupt:  # a second Ctrl-C: abort without a traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())
