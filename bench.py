"""Every comparison of this project with other tools, and the scale tables README quotes.

    python bench.py              # the tables README quotes: train, cold, encode, step, generate
    python bench.py train        # train_bpe vs Hugging Face tokenizers and rustbpe, whole processes
    python bench.py cold         # train_bpe on a small file with an empty numba cache
    python bench.py encode       # Tokenizer.encode vs tiktoken with GPT-2's files; encode_file
    python bench.py scale        # how BPE training time grows with the corpus and the vocab
    python bench.py step [train.py flags]  # the training step vs HF's LlamaForCausalLM
    python bench.py generate     # generation with and without the KV cache

The lessons (bpe.py, model.py, train.py) hold no benchmark code; this file imports them and
the peers (tiktoken, tokenizers, rustbpe, transformers), each only when its table runs.
A comparison runs side by side: A and B alternate, and medians are reported, because a
shared machine's load changes under a benchmark. Default inputs come from ../shared; pass
--input (and --vocab/--merges) to use other files.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared"
EOT = "<|endoftext|>"


# ----------------------------------------------------------------------------
# Helpers: peers, timings, child processes

def peer(module, pip_name):
    """Import an optional peer, or None after one line saying how to install it."""
    try:
        return __import__(module)
    except ImportError:
        print(f"  ({module} is not installed, so it is left out: pip install {pip_name})")
        return None


def need_file(path, what):
    if not Path(path).is_file():
        sys.exit(f"bench.py: {what} {path} not found; pass another with the flags (see --help).")
    return str(path)


def med(xs, unit="s", fmt="{:.2f}"):
    """'a / b / c s (median m)'."""
    return " / ".join(fmt.format(x) for x in xs) + f" {unit} (median {fmt.format(statistics.median(xs))})"


def run_child(code):
    """Run Python code in a fresh process (cwd: this repo). The child's last line is a JSON
    dict (CHILD_PRELUDE's report: call time, its own peak RSS, its largest worker's);
    returned with the whole process's wall time added."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"child failed: {err.strip()[-500:]}")
    return {**json.loads(out.strip().splitlines()[-1]), "process_s": wall}


CHILD_PRELUDE = """
import json, resource, time
def report(call_s, **extra):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"call_s": call_s, "rss_mb": rss, "workers_mb": kids, **extra}))
"""


# ----------------------------------------------------------------------------
# 1. BPE training: this project, Hugging Face tokenizers, rustbpe (whole processes)

TRAINERS = {
    "bpe.train_bpe": """
import bpe
t0 = time.perf_counter()
vocab, merges = bpe.train_bpe(PATH, VOCAB, [EOT])
report(time.perf_counter() - t0, merges=len(merges), longest=max(map(len, vocab.values())))
""",
    "HF tokenizers BpeTrainer": """
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
t0 = time.perf_counter()
hf = Tokenizer(models.BPE())
hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
hf.train([PATH], trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
report(time.perf_counter() - t0, merges=VOCAB - 257)
""",
    # rustbpe has no special tokens: it gets the documents between them and one id fewer,
    # so that both learn the same number of merges.
    "rustbpe": """
import rustbpe, bpe
t0 = time.perf_counter()
docs = open(PATH, encoding="utf-8").read().split(EOT)
tok = rustbpe.Tokenizer()
tok.train_from_iterator(iter(docs), VOCAB - 1, pattern=bpe.GPT2_PAT)
report(time.perf_counter() - t0, merges=VOCAB - 257)
""",
}
PEER_MODULES = {"HF tokenizers BpeTrainer": ("tokenizers", "tokenizers"), "rustbpe": ("rustbpe", "rustbpe")}


def bench_train(args):
    path = need_file(args.input, "corpus")
    print(f"## BPE training: {Path(path).name} ({os.path.getsize(path) / 1e6:.1f} MB), vocab "
          f"{args.vocab_size}, {EOT} special; each tool in a fresh process, {args.repeats} alternating runs")
    tools = [name for name in TRAINERS if name not in PEER_MODULES or peer(*PEER_MODULES[name])]
    head = f"PATH, VOCAB, EOT = {path!r}, {args.vocab_size}, {EOT!r}\n"
    runs = {name: [] for name in tools}
    for _ in range(args.repeats):
        for name in tools:
            runs[name].append(run_child(CHILD_PRELUDE + head + TRAINERS[name]))
    print("| tool | training call | whole process | peak RSS (largest worker) |")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        rss = max(r["rss_mb"] for r in rs)
        workers = max(r["workers_mb"] for r in rs)
        print(f"| {name} | {med([r['call_s'] for r in rs])} | {med([r['process_s'] for r in rs])} | "
              f"{rss:.0f} MB ({workers:.0f} MB) |")
    ours = runs["bpe.train_bpe"][-1]
    print(f"bpe.train_bpe: {ours['merges']} merges, longest token {ours['longest']} bytes")


def bench_cold(args):
    """A fresh process with an empty numba cache: what a student's first run costs."""
    path = need_file(args.input, "corpus")
    with tempfile.TemporaryDirectory() as d:
        small = os.path.join(d, "small.txt")
        with open(path, "rb") as f:
            Path(small).write_bytes(f.read(args.cold_bytes))
        code = CHILD_PRELUDE + f"""
import os; os.environ["NUMBA_CACHE_DIR"] = {d!r}
t0 = time.perf_counter()
import bpe
t1 = time.perf_counter()
bpe.train_bpe({small!r}, {args.cold_vocab}, ["<|endoftext|>"])
report(time.perf_counter() - t1, import_s=t1 - t0)
"""
        r = run_child(code)
    print(f"## Cold start: empty numba cache, first {args.cold_bytes / 1e3:.0f} KB of {Path(path).name}, "
          f"vocab {args.cold_vocab}: train_bpe call {r['call_s']:.2f} s (import of bpe {r['import_s']:.2f} s)")


def bench_scale(args):
    """Pre-tokenizing grows with the bytes, the merge loop with the distinct pre-tokens."""
    import bpe
    data = Path(need_file(args.input, "corpus")).read_bytes()
    corpora = []
    for mb in (1, 2, 5):
        piece = data[:mb * 1_000_000]
        corpora.append((f"{len(piece) / 1e6:.1f} MB", piece[:piece.rindex(b"\n") + 1]))
    corpora.append((f"{10 * len(data) / 1e6:.0f} MB (10 copies)", data * 10))
    bpe._load_compiled_merge_loop()  # numba's one-off cache load stays out of the table
    print(f"## How BPE training time grows ({Path(args.input).name}, {EOT} special)")
    print("| corpus | pre-tokenize | vocab | merge loop | total | pre-tokenize share |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corpus.txt")
        for name, blob in corpora:
            Path(path).write_bytes(blob)
            t0 = time.perf_counter()
            counts = bpe.count_pretokens(path, [EOT])
            t_pre = time.perf_counter() - t0
            for v in (1000, 10_000, 32_000):
                t0 = time.perf_counter()
                _, merges = bpe.train_from_counts(counts, v, [EOT], compiled=True)
                t_m = time.perf_counter() - t0
                print(f"| {name} | {t_pre:.2f} s | {v} ({len(merges)} merges) | {t_m:.2f} s | "
                      f"{t_pre + t_m:.2f} s | {100 * t_pre / (t_pre + t_m):.0f}% |", flush=True)


# ----------------------------------------------------------------------------
# 2. Encoding with GPT-2's files: this project vs tiktoken

def bench_encode(args):
    import bpe
    path = need_file(args.input, "text")
    files = need_file(args.vocab, "GPT-2 vocab"), need_file(args.merges, "GPT-2 merges")
    text = Path(path).read_text(encoding="utf-8")
    mb = len(text.encode("utf-8")) / 1e6
    print(f"## Encoding {Path(path).name} ({mb:.1f} MB) with GPT-2's vocab and merges, one thread, "
          f"a fresh Tokenizer each run, {args.repeats} runs alternating with tiktoken")
    tiktoken = peer("tiktoken", "tiktoken")
    enc = None
    if tiktoken:  # tiktoken's GPT-2 built offline from the same vocab file
        vocab = bpe._load_vocab_file(files[0])
        enc = tiktoken.Encoding(name="gpt2_local", pat_str=bpe.GPT2_PAT, special_tokens={EOT: 50256},
                                mergeable_ranks={t: i for i, t in vocab.items() if t != EOT.encode()})
    ours, theirs = [], []
    for _ in range(args.repeats):
        tok = bpe.Tokenizer.from_files(*files, [EOT])
        t0 = time.perf_counter()
        ids = tok.encode(text)
        ours.append(mb / (time.perf_counter() - t0))
        if enc:
            t0 = time.perf_counter()
            ref = enc.encode(text, allowed_special="all")
            theirs.append(mb / (time.perf_counter() - t0))
            assert ids == ref, "the ids differ from tiktoken's"
    t0 = time.perf_counter()
    tok.encode(text)
    second = mb / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for part in text.split(EOT):
        bpe.pretokenize(part)
    regex_alone = mb / (time.perf_counter() - t0)
    print(f"Tokenizer.encode: {med(ours, 'MB/s')}")
    if enc:
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(f"tiktoken.encode:  {med(theirs, 'MB/s')}; ratio of medians {ratio:.2f}; ids identical")
    print(f"second pass (pre-token cache full) {second:.2f} MB/s; pre-tokenizing alone {regex_alone:.2f} MB/s")
    with tempfile.TemporaryDirectory() as d:
        for workers in (1, 2):
            tok = bpe.Tokenizer.from_files(*files, [EOT])
            t0 = time.perf_counter()
            bpe.encode_file(tok, path, os.path.join(d, "ids.npy"), workers, progress=False)
            dt = time.perf_counter() - t0
            assert np.load(os.path.join(d, "ids.npy")).tolist() == ids
            print(f"encode_file, {workers} process(es): {mb / dt:.2f} MB/s (fresh tokenizer)")


# ----------------------------------------------------------------------------
# 3. The training step: this project vs Hugging Face's Llama of the same shape

def llama_step(cfg, micro):
    """A standard implementation of the same shape: HF's LlamaForCausalLM (pre-norm RMSNorm,
    RoPE, SwiGLU, no biases, untied head, SDPA attention) with torch's own AdamW and loss."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    V = cfg["vocab_size"]
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=cfg["d_model"], intermediate_size=cfg["d_ff"],
        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
        num_key_value_heads=cfg["num_heads"], max_position_embeddings=cfg["context_length"],
        rope_theta=cfg["rope_theta"], rms_norm_eps=1e-5, tie_word_embeddings=False,
        attn_implementation="sdpa")).to(cfg["device"])
    opt = torch.optim.AdamW(hf.parameters(), lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                            eps=cfg["eps"], weight_decay=cfg["weight_decay"])

    def step():
        for x, y in micro:
            logits = hf(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1))
            (loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def bench_step(argv):
    """train.py's --benchmark with HF Llama's steps interleaved; argv: train.py's flags."""
    import train
    argv = argv or ["--data", "tinystories", "--device", "cpu", "--batch-size", "4"]
    print(f"## Training step: python train.py --benchmark {' '.join(argv)}, with HF Llama interleaved")
    try:
        cfg = train.resolve_config(["--benchmark", *argv])
    except train.UsageError as e:
        sys.exit(f"bench.py step: {e}")
    rivals = {"HF LlamaForCausalLM + torch.optim.AdamW": llama_step} if peer("transformers", "transformers") else {}
    train.benchmark(cfg, rivals)
    return 0


# ----------------------------------------------------------------------------
# 4. Generation with and without the KV cache

def bench_generate(args):
    import torch
    from accounting import TINYSTORIES
    from model import TransformerLM, generate
    torch.manual_seed(0)
    m = TransformerLM(**TINYSTORIES, fast=args.fast)
    print(f"## Generation: {args.new_tokens} tokens after a 1-token prompt, TinyStories shape, greedy, "
          f"fast={args.fast}, {torch.get_num_threads()} threads")
    out = {}
    for use_cache in (True, False):
        generate(m, [1], 4, temperature=0, use_cache=use_cache)  # warm-up
        t0 = time.perf_counter()
        out[use_cache] = generate(m, [1], args.new_tokens, temperature=0, use_cache=use_cache)
        dt = time.perf_counter() - t0
        print(f"use_cache={use_cache!s:5s} {dt:6.2f} s  {len(out[use_cache]) / dt:7.1f} tokens/s")
    print(f"same tokens with and without the cache: {out[True] == out[False]}")


# ----------------------------------------------------------------------------
# Command line

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["step"]:  # the rest are train.py's flags
        return bench_step(argv[1:])
    ap = argparse.ArgumentParser(description="Comparisons with other tools (see the docstring).")
    ap.add_argument("what", nargs="?", default="all",
                    choices=["all", "train", "cold", "encode", "scale", "generate"])
    ap.add_argument("--input", default=str(SHARED / "data" / "shakespeare.txt"), help="corpus (UTF-8 text)")
    ap.add_argument("--vocab-size", type=int, default=10_000, help="train: vocabulary size")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per tool")
    ap.add_argument("--cold-bytes", type=int, default=133_120, help="cold: bytes of --input to train on")
    ap.add_argument("--cold-vocab", type=int, default=500, help="cold: vocabulary size")
    ap.add_argument("--vocab", default=str(SHARED / "reference" / "gpt2_vocab.json"), help="encode: GPT-2 vocab")
    ap.add_argument("--merges", default=str(SHARED / "reference" / "gpt2_merges.txt"), help="encode: GPT-2 merges")
    ap.add_argument("--new-tokens", type=int, default=256, help="generate: tokens to generate")
    ap.add_argument("--fast", action="store_true", help="generate: model.py's fused path")
    args = ap.parse_args(argv)
    for flag in ("vocab_size", "repeats", "cold_bytes", "cold_vocab", "new_tokens"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}", flush=True)
    tables = {"train": bench_train, "cold": bench_cold, "encode": bench_encode, "scale": bench_scale,
              "generate": bench_generate}
    todo = ["train", "cold", "encode", "step", "generate"] if args.what == "all" else [args.what]
    for what in todo:
        if what == "step":
            bench_step([])
        else:
            tables[what](args)
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
