"""
accounting.py -- every napkin-math answer of CS336 lecture 2 and assignment 1, printed with its formula and proven
against the real model in model.py.

    python accounting.py                    # every answer, section by section
    python accounting.py --section adamw    # one section
    python accounting.py --verify           # the model's formulas against model.TransformerLM; exit 1 on a mismatch

Section 1 holds the FLOP, peak and MFU definitions; sections 2-12 state their formulas and print their answers
(lecture 2, assignment 1 and Muon beyond it, where the course notes are wrong); section 13, run by --verify, proves
the model's formulas against model.TransformerLM. A file that needs one of these formulas imports it from here.

Conventions. FLOPs count each multiply and each add (a matmul of (m, n) @ (n, p) costs 2*m*n*p). "Forward FLOPs"
count matmuls only. Causal attention's QK^T and AV are counted over the full T x T square, as FlopCounterMode counts
a masked matmul: the plain path computes the masked half and throws it away; a fused kernel (flash attention) skips
it, so an MFU of this count credits it with work it never did (a convention: PaLM's and nanoGPT's MFU count so too).
GB = 1e9 bytes, GiB = 2**30 bytes.
"""

import collections
import itertools
import math
import re
import time

import cli  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("accounting.py")
import torch

import bpe
import model
import optim

GB, MiB, GiB, DAY = 1e9, 2**20, 2**30, 86_400  # bytes, bytes, bytes, seconds
FP32_BYTES, BF16_BYTES = torch.float32.itemsize, torch.bfloat16.itemsize  # 4 and 2 bytes per value


def _q(question, *answers):
    print(f"\nQ: {question}", *answers, sep="\n   ")


def _a(*answers):
    print(*(f"   {a}" for a in answers), sep="\n")


def _gb(n_bytes):  # 1.5e9 -> "1.50 GB (1.40 GiB)"
    return f"{n_bytes / GB:,.2f} GB ({n_bytes / GiB:,.2f} GiB)"


def _terms(parts):  # {"params": 4, "grads": 4} -> "4 (params) + 4 (grads)": a sum, each term named
    return " + ".join(f"{v:,} ({k})" for k, v in parts.items())


# ---------------------------------------------------------------------------------------------
# 1. FLOPs, hardware and MFU

# Dense peak FLOP/s from NVIDIA's whitepapers, the one home of these numbers (train.py's MFU and kernels.py's roofline
# import them); the H100 datasheet's headline tensor-core figures assume 2:4 sparsity (two of every four weights zero,
# skipped by the hardware) and are twice these. H100 SXM bf16: 132 SMs x 4 tensor cores x 1024 FLOPs per clock x
# 1.83 GHz = 989.4e12 (the lecture halves the datasheet's rounded 1979e12: 989.5e12). "fp32" is the CUDA cores;
# "tf32" is fp32 matmuls on tensor cores, as torch runs them at torch.get_float32_matmul_precision() "high" or "medium".
PEAK_FLOPS = {
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 PCIe": {"bf16": 756.0e12, "fp16": 756.0e12, "tf32": 378.0e12, "fp32": 51.2e12},
    "A100": {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12},
}
H100_BF16 = PEAK_FLOPS["H100 SXM"]["bf16"]  # the lecture's peak: an H100's dense bf16 tensor cores
H100_BYTES_PER_SEC = 3.35e12  # H100 SXM HBM3 memory bandwidth
H100_MEMORY_BYTES = 80e9  # "80 GB" of HBM per H100

# Kaplan et al. (2020), Hoffmann et al. (2022): the backward pass costs twice the forward (one
# matmul for the gradient w.r.t. the input, one w.r.t. the weight), so a training step is 3x.
BACKWARD_PER_FORWARD = 2


def training_step_flops(forward_flops):
    """forward + backward = (1 + 2) x forward: the one place the 3 (and 6 = 3 x 2) lives."""
    return (1 + BACKWARD_PER_FORWARD) * forward_flops


def training_flops(num_params, num_tokens):
    """6 N D: a dense forward is one multiply and one add per parameter per token (2 N D)."""
    return training_step_flops(2 * num_params * num_tokens)


def flops_per_day(num_gpus, peak, mfu_fraction):
    """What num_gpus chips of `peak` FLOP/s deliver in a day at a given MFU: days = FLOPs / this."""
    return num_gpus * peak * mfu_fraction * DAY


def mfu(flops, seconds, peak):
    """Model FLOPs utilization = achieved FLOP/s (useful FLOPs only) / peak FLOP/s."""
    return flops / seconds / peak


def gpu_peak_key(device_name):
    """Which row of PEAK_FLOPS a torch.cuda.get_device_name() string means, or None. The H200 has the H100 SXM's
    compute (more, faster memory; its only PCIe card is the NVL); the H100 and H200 NVL are other cards (other
    clocks): no row, no guess. A model number counts whole: an RTX A1000 is no A100."""
    name = device_name.upper()
    if re.search(r"H[12]00(?!\d)", name) and "NVL" not in name:
        return "H100 PCIe" if "PCIE" in name else "H100 SXM"
    return "A100" if re.search(r"A100(?!\d)", name) else None


def peak_flops(device, dtype):
    """MFU's denominator for matmuls in `dtype` on `device`: the card's published dense figure, or None
    where there is none: a CPU (no datasheet figure means anything on a shared box) or a GPU not in
    PEAK_FLOPS. An MFU against anything else would not be the MFU a paper reports."""
    device = torch.device(device)
    key = gpu_peak_key(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    fp32 = "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"  # "high", "medium": tensor cores
    column = {torch.float32: fp32, torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    return PEAK_FLOPS[key].get(column) if key else None


# ---------------------------------------------------------------------------------------------
# 2. Lecture 2, motivating questions

# Bytes of training state per parameter with AdamW (activations come on top).
ADAMW_BYTES_PER_PARAM = {
    "fp32 everywhere (naive)": {"params fp32": 4, "grads fp32": 4, "m fp32": 4, "v fp32": 4},
    "autocast (fp32 weights, bf16 matmuls)": {"params fp32": 4, "grads fp32": 4, "m fp32": 4, "v fp32": 4},
    "bf16 weights + fp32 master copy": {"params bf16": 2, "grads bf16": 2, "master fp32": 4, "m fp32": 4, "v fp32": 4},
    "bf16 weights, no master copy": {"params bf16": 2, "grads bf16": 2, "m fp32": 4, "v fp32": 4},
}


def lecture_70b_run():
    flops, per_day = training_flops(70e9, 15e12), flops_per_day(1024, H100_BF16, 0.5)
    return flops, per_day, flops / per_day


def largest_model(bytes_per_param):  # parameters whose training state fits in the lecture's 8 H100s
    return 8 * H100_MEMORY_BYTES / bytes_per_param


def section_motivation():
    flops, per_day, days = lecture_70b_run()
    _q("How long to train a 70B-parameter model on 15T tokens on 1024 H100s at 50% MFU?",
       f"FLOPs = 6 N D = 6 x 70e9 x 15e12 = {flops:.3e}",
       f"per day = 1024 x {H100_BF16:.4g} FLOP/s (bf16 dense) x 0.5 x 86400 s = {per_day:.3e} FLOPs",
       f"days = {flops:.3e} / {per_day:.3e} = {days:.1f} days (the lecture's 143.927 rounds the peak: 1979e12 / 2)")
    _q("What is the largest model 8 H100s (80 GB each) can train with AdamW, ignoring activations?")
    for name, parts in ADAMW_BYTES_PER_PARAM.items():
        bytes_per_param = sum(parts.values())
        billions = largest_model(bytes_per_param) / 1e9
        _a(f"{name}: {_terms(parts)} = {bytes_per_param} B/param -> 8 x 80e9 / {bytes_per_param} = {billions:.1f}B params")
    _a("mixed precision saves no state memory: bf16 weights need an fp32 master copy, because an",
       "update below 2^-9 of a weight rounds away in bf16 (up to 2^-8 can). It saves activation memory and time.")


# ---------------------------------------------------------------------------------------------
# 3. Lecture 2, memory of tensors

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
GPT3_FF_SHAPE = (4 * 12288, 12288)  # GPT-3's feed-forward matrix: d_ff = 4 d_model, d_model 12288


def tensor_bytes(shape, dtype):  # memory = number of elements x bytes per element
    return math.prod(shape) * dtype.itemsize


def stored_value(x, dtype):
    """What `dtype` keeps of the float x (1e-8 underflows to 0 in fp16, survives in bf16)."""
    return torch.tensor(x, dtype=torch.float32).to(dtype).float().item()


def section_tensors():
    (rows, cols), n_elements, small = GPT3_FF_SHAPE, math.prod(GPT3_FF_SHAPE), tensor_bytes((4, 8), torch.float32)
    names = {dt: str(dt).removeprefix("torch.") for dt in DTYPES}
    sizes, kept = {dt: tensor_bytes(GPT3_FF_SHAPE, dt) for dt in DTYPES}, {dt: stored_value(1e-8, dt) for dt in DTYPES}
    _q("How much memory does a tensor take, per dtype? (memory = elements x bytes per element)",
       f"torch.zeros(4, 8) float32: 32 x 4 = {small} bytes",
       *(f"GPT-3 feed-forward matrix {rows} x {cols} in {names[dt]:<13}: "
         f"{n_elements:,} x {dt.itemsize} B = {_gb(sizes[dt])}" for dt in DTYPES))
    _q("Range and resolution of each dtype (torch.finfo), and what happens to 1e-8?",
       f"{'dtype':<14}{'bits':>5}{'max':>13}{'smallest normal':>17}{'eps':>12}   1e-8 stored as")
    for dt in DTYPES:
        fi = torch.finfo(dt)
        _a(f"{names[dt]:<14}{fi.bits:>5}{fi.max:>13.4g}{fi.tiny:>17.4g}{fi.eps:>12.4g}   {kept[dt]:.6g}")
    fp16 = torch.finfo(torch.float16)
    smallest_subnormal = fp16.smallest_normal * fp16.eps  # 2^-24
    _a(f"fp16 rounds 1e-8 to 0 (its smallest subnormal is {smallest_subnormal:.3g}; below half of it rounds to 0): "
       "gradients this small vanish.",
       f"bf16 has float32's exponent, so 1e-8 survives (as {kept[torch.bfloat16]:.5g}: 7 stored mantissa bits).")


# ---------------------------------------------------------------------------------------------
# 4. Lecture 2, compute

def two_layer_flops(B, D, K):
    """(forward, backward) FLOPs of the lecture's two-layer linear model x (B, D) -> w1 (D, D) -> w2 (D, K)."""
    forward = 2 * B * D * D + 2 * B * D * K
    return forward, BACKWARD_PER_FORWARD * forward


def section_compute():
    B, D, K = 16384, 32768, 8192
    linear, (fwd, bwd) = 2 * B * D * K, two_layer_flops(B, D, K)
    step, gpt3, weeks = training_step_flops(fwd), training_flops(175e9, 300e9), flops_per_day(8, H100_BF16, 1) * 14
    peaks = {card: ", ".join(f"{k} {v:.4g}" for k, v in row.items()) for card, row in PEAK_FLOPS.items()}
    _q("FLOPs of the linear model y = x w, x (B, D), w (D, K), with the lecture's GPU sizes?",
       f"2 B D K = 2 x {B} x {D} x {K} = {linear:.4e} FLOPs")
    _q("Forward, backward and a training step of x -> w1 (D, D) -> w2 (D, K)?",
       f"forward 2 B (D D + D K) = {fwd:.4e} = 2 x tokens x params",
       f"backward: per matmul, grad wrt weight + grad wrt input = 4 x tokens x params = {bwd:.4e}",
       f"step = forward + backward = training_step_flops(forward) = {step:.4e} = 6 x tokens x params")
    _q("FLOPs to train GPT-3 (175B parameters, 300B tokens)?",
       f"6 x 175e9 x 300e9 = {gpt3:.3e} FLOPs (published: 3.14e23)")
    _q("FLOPs of 8 H100s for 2 weeks? (the 2025 lecture's code, under that heading, multiplies by one week: half)",
       f"8 x 14 x 86400 s x {H100_BF16:.4g} FLOP/s = {weeks:.4e} FLOPs (bf16 dense, 100% MFU)",
       "MFU = achieved FLOP/s / peak FLOP/s; >= 0.5 is good. Peaks (dense) used here:",
       *(f"  {card:<10} {row}" for card, row in peaks.items()))


# ---------------------------------------------------------------------------------------------
# 5. Lecture 2, arithmetic intensity and the roofline (bf16: 2 bytes per value)

# (FLOPs, bytes moved) of each operation on vectors of n values (matrices n x n), b bytes each:
ROOFLINE_COSTS = {
    "ReLU": lambda n, b=BF16_BYTES: (n, 2 * b * n),  # one comparison per element; read x, write y
    "GELU": lambda n, b=BF16_BYTES: (20 * n, 2 * b * n),  # the lecture's ~20 FLOPs per element (tanh form)
    "dot product": lambda n, b=BF16_BYTES: (2 * n - 1, b * (2 * n + 1)),  # n mul + n-1 add; read x, w; write 1
    "matrix-vector": lambda n, b=BF16_BYTES: (n * (2 * n - 1), b * (n * n + 2 * n)),  # n dots; read W, x; write y
    "matrix-matrix": lambda n, b=BF16_BYTES: (n * n * (2 * n - 1), b * 3 * n * n),  # n^2 dots; read X, W; write Y
}


def accelerator_intensity(peak, bytes_per_sec):
    """FLOPs the chip can do per byte it moves (the roofline's ridge): above it, compute-bound."""
    return peak / bytes_per_sec


def roofline_mfu(intensity, ridge):
    """Best MFU a kernel can reach: min(1, arithmetic intensity / accelerator intensity)."""
    return min(1.0, intensity / ridge)


def section_intensity():
    n, ridge = 4096, accelerator_intensity(H100_BF16, H100_BYTES_PER_SEC)
    _q("Is each operation compute- or memory-bound on an H100 (bf16, 2 bytes per value)?",
       f"accelerator intensity = {H100_BF16:.4g} FLOP/s / {H100_BYTES_PER_SEC:.3g} B/s = {ridge:.1f} FLOPs/byte")
    for name, cost in ROOFLINE_COSTS.items():
        flops, moved = cost(n)
        ai = flops / moved
        best, bound = roofline_mfu(ai, ridge), "compute" if ai >= ridge else "memory"
        _a(f"{name:<14} n={n}: {flops:.4g} FLOPs / {moved:.4g} bytes = {ai:7.3f} FLOPs/B -> roofline MFU "
           f"min(1, {ai:.3g} / {ridge:.1f}) = {best:.3f} ({bound}-bound)")
    _a(f"matrix-matrix intensity ~ n/3: compute-bound once n > 3 x {ridge:.0f} = {3 * ridge:.0f}")


# ---------------------------------------------------------------------------------------------
# 6. Lecture 2, memory of a training step

GRAD_ACCUMULATION = dict(batch=64, micro_batch=16, D=1024, L=16)  # the lecture's sizes (micro-batch B / 4), bf16


def checkpointing(L, every):
    """(peak activations held, recomputed block forwards) for L blocks g = xW, h = relu(g), in (B, D) tensors and
    block forwards, in the lecture's picture (autograd would keep h alone, relu's output and the next matmul's input).
    every=0: no checkpointing, keep g and h of every block. every=k: keep h of every k-th block; the
    backward re-runs one k-block segment at a time (holding its 2k tensors), so every block is recomputed once.
    every=None: keep only the input; block i's backward re-runs blocks 1..i, L(L+1)/2 forwards for 2 tensors held."""
    if every is None:
        return 2, L * (L + 1) // 2
    if every == 0:
        return 2 * L, 0
    return math.ceil(L / every) + 2 * every, L


def section_memory():
    B, D, L = 2, 4, 3  # the lecture's DeepNetwork (L blocks of D x D Linear + ReLU) and its dtypes
    params = BF16_BYTES * D * D * L
    _q(f"Memory of the lecture's DeepNetwork (B={B}, D={D}, L={L}; bf16, fp32 optimizer state) with AdaGrad, AdamW?")
    for opt, states in (("AdaGrad", 1), ("AdamW", 2)):  # optimizer state: AdaGrad's sum of g^2; AdamW's m, v
        parts = {"parameters": params, "activations": BF16_BYTES * B * D * L, "gradients": params,
                 "optimizer state": states * FP32_BYTES * D * D * L}
        _a(f"{opt}: {_terms(parts)} = {sum(parts.values())} bytes")
    _a("2 bytes x (params D^2 L, activations B D L, gradients D^2 L); state 4 bytes x 1 (AdaGrad) or 2 (AdamW) x D^2 L")
    # gradient accumulation: activations scale with the micro-batch, the gradient with nothing
    batch, micro, D, L = GRAD_ACCUMULATION.values()
    steps, full_mib, micro_mib = batch // micro, BF16_BYTES * batch * D * L / MiB, BF16_BYTES * micro * D * L / MiB
    _q(f"Gradient accumulation: batch {batch} in micro-batches of {micro} (D={D}, L={L}, bf16)?",
       f"activations 2 B D L = {full_mib:g} MiB -> 2 x {micro} x D x L = {micro_mib:g} MiB, "
       f"{steps} forward/backward passes per optimizer step, same gradient (sum of micro-batch grads / {steps})")
    for L in (9, 16):
        root = math.isqrt(L)
        _q(f"Activation checkpointing, L={L} blocks (held activations, recomputed block forwards)?")
        for label, every in (("no checkpointing", 0), ("checkpoint every layer", 1),
                             (f"every sqrt(L) = {root} layers", root), ("store nothing", None)):
            held, redo = checkpointing(L, every)
            _a(f"{label:<26} held {held:>3}  recompute {redo:>3}")
    _a("O(L) memory & no recompute | O(L) & one extra forward | O(sqrt L) & one extra forward | O(1) & O(L^2)")


# ---------------------------------------------------------------------------------------------
# 7. Assignment 1, transformer_accounting (model.TransformerLM: pre-norm blocks, RoPE, SwiGLU,
#    untied head). context_length, num_heads and fast change no parameter count, and num_heads no FLOP
#    count (h heads of d_k = d / h); the functions accept them (lm_param_counts all three) so a model
#    config passes as **cfg.

GPT2_VOCAB = 50_257
GPT2_SHAPES = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20),
               "XL": (48, 1600, 25)}  # num_layers, d_model, num_heads
# The components grouped for the share table: (d, e) of transformer_accounting.
SHARE_GROUPS = {"attn projections": ("attn q,k,v proj", "attn output proj"),
                "attn QK^T + AV": ("attn QK^T", "attn AV"), "ffn (w1, w2, w3)": ("ffn w1", "ffn w2", "ffn w3"),
                "lm_head": ("lm_head",)}


def lm_param_counts(vocab_size, d_model, num_layers, d_ff, *, silu_ffn=False, no_norm=False,
                    tie_embeddings=False, context_length=None, num_heads=None, fast=False):
    """Trainable parameters of TransformerLM per component (RoPE has none: its sin/cos are fixed)."""
    d, L, V = d_model, num_layers, vocab_size
    return {"token_embeddings": V * d, "attn": L * 4 * d * d,  # q, k, v, output projections
            "ffn": L * (2 if silu_ffn else 3) * d * d_ff,  # w1, w2, w3 (no w3 without the gate)
            "norms": 0 if no_norm else (2 * L + 1) * d,  # ln1, ln2 per layer and ln_final: d each
            "lm_head": 0 if tie_embeddings else V * d}


# The matmuls of one forward pass of T tokens; each costs 2 x the product of its dimensions.
# QK^T and AV run h heads of d_k = d / h, so h cancels: 2 T^2 d each per layer.
MATMUL_SHAPES = {"attn q,k,v proj": "3 x (T, d) @ (d, d), x L", "attn QK^T": "h x (T, d_k) @ (d_k, T), x L",
                 "attn AV": "h x (T, T) @ (T, d_k), x L", "attn output proj": "(T, d) @ (d, d), x L",
                 "ffn w1": "(T, d) @ (d, d_ff), x L", "ffn w3": "(T, d) @ (d, d_ff), x L",
                 "ffn w2": "(T, d_ff) @ (d_ff, d), x L", "lm_head": "(T, d) @ (d, V), once"}


def lm_forward_flops_by_component(vocab_size, context_length, d_model, num_layers, d_ff,
                                  silu_ffn=False, num_heads=None):
    """Matmul FLOPs of one sequence of T = context_length tokens, per MATMUL_SHAPES entry."""
    T, d, L, V = context_length, d_model, num_layers, vocab_size
    return {"attn q,k,v proj": L * 3 * 2 * T * d * d, "attn QK^T": L * 2 * T * T * d, "attn AV": L * 2 * T * T * d,
            "attn output proj": L * 2 * T * d * d, "ffn w1": L * 2 * T * d * d_ff,
            "ffn w3": 0 if silu_ffn else L * 2 * T * d * d_ff, "ffn w2": L * 2 * T * d_ff * d, "lm_head": 2 * T * d * V}


def lm_forward_flops(*cfg, **kw_cfg):
    return sum(lm_forward_flops_by_component(*cfg, **kw_cfg).values())


def flop_shares(cfg):
    """(forward FLOPs, {SHARE_GROUPS group: its fraction of them}) of one sequence of a config."""
    flops = lm_forward_flops_by_component(**cfg)
    total = sum(flops.values())
    return total, {group: sum(flops[k] for k in keys) / total for group, keys in SHARE_GROUPS.items()}


def gpt2_config(name, context_length=1_024):
    """TransformerLM keyword arguments of a GPT-2-shaped model with the handout's d_ff = 4 d_model."""
    L, d, h = GPT2_SHAPES[name]
    return dict(vocab_size=GPT2_VOCAB, context_length=context_length, d_model=d, num_layers=L, num_heads=h, d_ff=4 * d)


def _shape(cfg):  # 'V=50257, T=1024, d=1600, L=48, h=25, d_ff=6400' for a TransformerLM config dict
    keys = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff")
    return ", ".join(f"{k}={cfg[n]}" for k, n in zip(("V", "T", "d", "L", "h", "d_ff"), keys))


def section_transformer():
    xl = gpt2_config("XL")
    counts, flops = lm_param_counts(**xl), lm_forward_flops_by_component(**xl)
    P, total = sum(counts.values()), sum(flops.values())
    fp32_size, tflops, shares = FP32_BYTES * P, total / 1e12, {k: v / total for k, v in flops.items()}
    table = {n: flop_shares(gpt2_config(n)) for n in GPT2_SHAPES} | {"XL@16K": flop_shares(gpt2_config("XL", 16_384))}
    groups, growth = table["XL"][1], table["XL@16K"][0] / total
    _q(f"(a) GPT-2 XL ({_shape(xl)}): parameters and fp32 size?",
       "V d (embeddings) + L (4 d^2 + 3 d d_ff + 2 d) + d (ln_final) + V d (lm_head)",
       f"{_terms(counts)} = {P:,}", f"fp32: 4 x {P:,} = {_gb(fp32_size)}")
    _q(f"(b) The matmuls of one forward pass of T={xl['context_length']} tokens and their FLOPs?",
       *(f"{k:<17} {MATMUL_SHAPES[k]:<30} {v:.4e}  {shares[k]:6.2%}" for k, v in flops.items()),
       f"{'total':<48} {total:.4e} FLOPs (= {tflops:.3f} TFLOPs)")
    _q("(c) Which parts need the most FLOPs?", f"the SwiGLU feed-forward: {groups['ffn (w1, w2, w3)']:.1%}; "
       f"then the attention projections {groups['attn projections']:.1%}")
    _q("(d, e) Share of each component, GPT-2 small..XL at T=1024 and XL at T=16384",
       f"{'component':<18}" + "".join(f"{n:>10}" for n in table),
       *(f"{g:<18}" + "".join(f"{col[g]:>10.2%}" for _, col in table.values()) for g in SHARE_GROUPS),
       f"{'total FLOPs':<18}" + "".join(f"{t:>10.3e}" for t, _ in table.values()),
       "bigger models: the FFN and projections (~ d^2 L) grow, lm_head (~ d V) shrinks, attention",
       "core (~ T^2 d L) shrinks relative to d^2 L at fixed T. Longer context: T^2 takes over; XL at",
       f"T=16384 costs {growth:.1f}x the FLOPs of T=1024 (16x for linear parts, 256x for QK^T + AV)")


# ---------------------------------------------------------------------------------------------
# 8. Assignment 1, adamwAccounting (float32 everywhere, d_ff = 4 d_model)

# FLOPs per parameter of one AdamW step (the handout's Algorithm 1; scalars like the
# bias-corrected alpha_t are computed once per step, not per parameter; no matmul anywhere):
ADAMW_FLOPS_PER_PARAM = {
    "m = b1 m + (1 - b1) g": 3,  # 2 multiplies, 1 add
    "v = b2 v + (1 - b2) g^2": 4,  # g*g, 2 multiplies, 1 add
    "p -= a_t m / (sqrt(v) + eps)": 5,  # sqrt, add, divide, multiply, subtract
    "p -= a lambda p": 2,  # multiply, subtract
}
XL_RUN = dict(batch_size=1024, steps=400_000, peak=PEAK_FLOPS["A100"]["fp32"], mfu_fraction=0.5)  # (d)


def handout_activation_elements(B, T, d_model, num_heads, vocab_size, num_layers):
    """Activations as the handout lists them, one tensor per item, d_ff = 4d: per layer
    2 RMSNorm outputs 2BTd | Q, K, V 3BTd | Q^T K scores BhT^2 | softmax BhT^2 | weighted sum of values BTd |
    output projection BTd | W1 4BTd | SiLU 4BTd | W2 BTd  = 16BTd + 2BhT^2;  then final RMSNorm BTd, output
    embedding (logits) BTV, cross-entropy BTV. (The handout's list has no W3 and no gate product: SwiGLU's add 8BTd.)"""
    d, h, L, V = d_model, num_heads, num_layers, vocab_size
    return L * (16 * B * T * d + 2 * B * h * T * T) + B * T * d + 2 * B * T * V


def saved_activation_bytes(B, T, d_model, num_heads, d_ff, num_layers):
    """Bytes autograd really keeps after a float32 forward of model.TransformerLM (reference path,
    training mode), from token ids up to the logits (the output, not saved). N = B*T, per layer:
      10 N d     ln1 input, x*inv_rms, ln1 output (q/k/v input), rotated q and k, v made contiguous
                 for AV, heads concatenated (output_proj input), residual z, z*inv_rms, ln2 output
       5 N d_ff  w1 x, sigmoid(w1 x), silu(w1 x), w3 x, the gated product (w2 input)
       2 N       inv_rms of ln1 and ln2
       3 B h T^2 masked scores (for the max), exp(scores - max), probabilities
       2 B h T   the softmax's row max and row sum
       2 T d_k   RoPE cos and sin gathered for q and for k (T x d_k/2 each)
       T^2 bytes the causal mask (bool)
    then ln_final 3 N d + N, and the int64 token ids 8 N bytes."""
    N, d, h, L = B * T, d_model, num_heads, num_layers
    per_layer = 10 * N * d + 5 * N * d_ff + 2 * N + 3 * B * h * T * T + 2 * B * h * T + 2 * T * (d // h)
    return 4 * (L * per_layer + 3 * N * d + N) + L * T * T + 8 * N


def adamw_memory_line(cfg):
    """Peak bytes of an AdamW step in float32 as (a, b) of a * batch_size + b: b holds params 4P,
    grads 4P, m and v 8P (the naive row of ADAMW_BYTES_PER_PARAM); a is activations 4A at B=1."""
    V, T, d, h, L = (cfg[k] for k in ("vocab_size", "context_length", "d_model", "num_heads", "num_layers"))
    P = sum(lm_param_counts(V, d, L, cfg["d_ff"]).values())
    A = handout_activation_elements(1, T, d, h, V, L)  # linear in B: every term has a factor B
    return FP32_BYTES * A, sum(ADAMW_BYTES_PER_PARAM["fp32 everywhere (naive)"].values()) * P


def lm_training_days(cfg, batch_size, steps, peak, mfu_fraction):
    """(days, FLOPs per step): days = steps x 3 x batch x forward FLOPs / (peak x MFU x 86400)."""
    step = training_step_flops(batch_size * lm_forward_flops(**cfg))
    return steps * step / flops_per_day(1, peak, mfu_fraction), step


def section_adamw():
    xl = gpt2_config("XL")
    a, b = adamw_memory_line(xl)
    _q("(a) Peak memory of AdamW in float32 (d_ff = 4d), by component?",
       "P = 2Vd + L(16d^2 + 2d) + d (embeddings, lm_head, attention 4d^2 + SwiGLU 12d^2, norms)",
       "parameters 4P | gradients 4P | optimizer state (m, v) 8P | activations 4A: total 16P + 4A bytes, with",
       "A = L(16 B T d + 2 B h T^2) + B T d + 2 B T V   (the handout's list; see handout_activation_elements)")
    kept = saved_activation_bytes(1, xl["context_length"], xl["d_model"], xl["num_heads"], xl["d_ff"], xl["num_layers"])
    listed = a - FP32_BYTES * 2 * xl["context_length"] * xl["vocab_size"]  # the handout's list up to the logits
    _q("(b) GPT-2 XL as a * batch_size + b, and the largest batch in 80 GB?",
       f"a = 4 A(B=1) = {a:,} B = {_gb(a)};  b = 16 P = {b:,} B = {_gb(b)}")
    for label, memory in (("80 GB (10^9 bytes each)", 80e9), ("80 GiB (what an '80GB' A100 holds)", 80 * GiB)):
        fit = (memory - b) / a
        _a(f"{label}: batch <= ({memory:.4g} - b) / a = {fit:.2f} -> {math.floor(fit)}")
    _a(f"model.py's autograd keeps {kept / GB:.1f} GB per sequence up to the logits (see --verify); the handout's list",
       f"is {listed / kept:.2f} x that: it omits SwiGLU's extra tensors, the softmax's exp, RMSNorm's inputs, the mask")
    P, per = sum(lm_param_counts(**xl).values()), sum(ADAMW_FLOPS_PER_PARAM.values())
    _q("(c) FLOPs of one AdamW step?", f"{_terms(ADAMW_FLOPS_PER_PARAM)} = {per} P",
       f"GPT-2 XL: {per} x {P:,} = {per * P:.3e} FLOPs (negligible next to forward + backward)")
    batch, steps, a100, m = XL_RUN.values()
    (days, step), fwd, thousands = lm_training_days(xl, **XL_RUN), lm_forward_flops(**xl), steps // 1000
    _q(f"(d) Days to train GPT-2 XL, {thousands}K steps of batch {batch}, on one A100 ({a100:.4g} fp32) at {m:.0%} MFU?",
       f"step = 3 x {batch} x {fwd:.4e} = {step:.4e} FLOPs (backward = 2 x forward)",
       f"days = {steps} x {step:.4e} / ({a100:.4g} x {m} x 86400) = {days:,.0f} days ({days / 365.25:.1f} years)")


def optimizer_state_bytes(optimizer, counts):
    """Bytes of optim.py's fp32 state for lm_param_counts' counts: SGD none; momentum, AdaGrad, RMSProp one buffer
    per parameter; Adam, AdamW two (m, v); Muon one on the hidden matrices (attention, FFN), AdamW's two elsewhere."""
    P, hidden = sum(counts.values()), counts["attn"] + counts["ffn"]
    buffers = dict(sgd=0, momentum=P, adagrad=P, rmsprop=P, adam=2 * P, adamw=2 * P, muon=hidden + 2 * (P - hidden))
    return FP32_BYTES * buffers[optimizer]


# ---------------------------------------------------------------------------------------------
# 9. Assignment 1, the TinyStories model and its token budget (their one home: config.py and bench.py import them)

TINYSTORIES = dict(vocab_size=10_000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1_344)
TINYSTORIES_TOKENS = 327_680_000  # batch size x steps x context length (handout, 1 H100)


def section_tinystories():
    cfg, T = TINYSTORIES, TINYSTORIES["context_length"]
    c, fwd = lm_param_counts(**cfg), lm_forward_flops(**cfg)
    total, blocks = sum(c.values()), c["attn"] + c["ffn"] + c["norms"]
    non_embedding = blocks + c["lm_head"]
    _q(f"TinyStories model ({_shape(cfg)}): parameters?", f"{_terms(c)} = {total:,}",
       f"blocks + norms alone: {blocks:,}; blocks + norms + lm_head: {non_embedding:,}, the handout's 'about",
       "17M non-embedding parameters': everything except the input embedding table (a lookup, no FLOPs)")
    seqs = TINYSTORIES_TOKENS // T
    steps_of_128, steps_of_32 = seqs // 128, seqs // 32
    flops, six_nd = training_step_flops(seqs * fwd), training_flops(non_embedding, TINYSTORIES_TOKENS)
    lo, hi = 30, 40  # the handout's wall-clock minutes for this budget on one H100
    ideal_seconds, handout_mfu = flops / H100_BF16, mfu(flops, 60 * (lo + hi) / 2, H100_BF16)  # ideal: at 100% MFU
    batch, steps = 32, 5_000  # the handout's CPU / MPS run
    cpu_tokens, cpu_flops = batch * steps * T, training_step_flops(batch * steps * fwd)
    _q(f"Token budget {TINYSTORIES_TOKENS:,} = batch x steps x context: what does it cost?",
       f"{TINYSTORIES_TOKENS:,} / {T} = {seqs:,} sequences, e.g. batch 128 x {steps_of_128:,} steps or 32 x {steps_of_32:,}",
       f"FLOPs = 3 x {seqs:,} x {fwd:.4e} = {flops:.3e} (6 N D with N = blocks + lm_head: {six_nd:.3e})",
       f"on one H100 (bf16) that is {ideal_seconds:.0f} s at 100% MFU: the handout's {lo}-{hi} minutes means "
       f"MFU ~ {handout_mfu:.1%} (a plain loop's budget: a compiled step at this shape does far better)",
       f"CPU budget: {batch} x {steps} x {T} = {cpu_tokens:,} tokens = {cpu_flops:.3e} FLOPs")


# ---------------------------------------------------------------------------------------------
# 10. Beyond the handout: Muon's state and Newton-Schulz's FLOPs (optim.Muon)

def muon_flops(d_model, num_layers, d_ff, silu_ffn=False, steps=optim.NS_STEPS, **_):
    """Matmul FLOPs of Muon's Newton-Schulz (optim.newton_schulz) per step, on TransformerLM's q, k, v, output (d, d)
    and w1, w2 (and w3) (d, d_ff). Each step on an (m, n) matrix, m <= n: X X^T 2 m^2 n, A A 2 m^3, (b A + c A A) X
    2 m^2 n (its O(m n) elementwise terms left out, as everywhere here); m = n = d gives 6 d^3."""
    def one_step(m, n):  # on an (m, n) matrix, m <= n
        return 4 * m * m * n + 2 * m ** 3
    ffn = (2 if silu_ffn else 3) * one_step(*sorted((d_model, d_ff)))
    return steps * num_layers * (4 * one_step(d_model, d_model) + ffn)


def section_muon():
    _q("Muon instead of AdamW: optimizer state, and Newton-Schulz's FLOPs per step (32,768 tokens a step)?",
       "state: one fp32 buffer (4 B) per hidden-matrix parameter (attention, FFN), AdamW's two (8 B) for the rest")
    for name, cfg in (("TinyStories", TINYSTORIES), ("GPT-2 small", gpt2_config("small"))):
        c, ns, seqs = lm_param_counts(**cfg), muon_flops(**cfg), 32_768 // cfg["context_length"]
        muon, adamw = optimizer_state_bytes("muon", c), optimizer_state_bytes("adamw", c)
        step = training_step_flops(seqs * lm_forward_flops(**cfg))
        _a(f"{name} ({_shape(cfg)}): {_gb(muon)} against AdamW's {_gb(adamw)}; {ns:.3e} FLOPs, "
           f"{ns / step:.1%} of a training step (a cost per step, not per token)")


# ---------------------------------------------------------------------------------------------
# 11. Assignment 1, token ids as uint16 and tokenizer throughput

PILE_BYTES = 825 * GiB  # the handout's "825GB": the Pile's paper gives "an 825 GiB English text corpus"


def encode_speed(tok, text, seconds=0.5):
    """(bytes/s, passes) of tok's encode over text in one process, a fresh copy of tok (empty cache) per pass."""
    passes, elapsed = 0, 0.0
    while passes == 0 or elapsed < seconds:
        fresh, start = bpe.Tokenizer(tok.vocab, tok.merges, tok.special_tokens), time.perf_counter()
        fresh.encode(text)
        elapsed, passes = elapsed + time.perf_counter() - start, passes + 1
    return passes * len(text.encode("utf-8")) / elapsed, passes


def measure_tokenizer_throughput(seconds=0.5):
    """(bytes/s, note) of bpe.Tokenizer.encode on Python's documentation (pydoc_data, in every CPython): merges
    learnt from its first quarter (the interpreted loop: no numba compile), encode_speed over the rest."""
    try:  # some distributions leave pydoc_data out; then throughput is not measured
        from pydoc_data.topics import topics
    except ImportError:
        return None, "pydoc_data (Python's documentation text) is not installed in this Python"
    text = "".join(topics[k] for k in sorted(topics))
    cut = len(text) // 4
    vocab, merges = bpe.train_from_counts(collections.Counter(bpe.pretokenize(text[:cut])), 1000)  # vocab size
    bps, passes = encode_speed(bpe.Tokenizer(vocab, merges), text[cut:], seconds)
    return bps, (f"bpe.Tokenizer.encode's plain path, {len(merges)} merges learnt from {cut:,} characters of "
                 f"Python's pydoc_data, over the other {len(text[cut:].encode()):,} bytes, {passes} passes, empty cache")


def section_tokenizer():
    _q("Why store token ids as uint16?", f"GPT-2's ids 0..{GPT2_VOCAB - 1:,} <= 65,535 = 2^16 - 1 (TinyStories' 10,000 "
       "and OWT's 32,000 too): uint16 holds every id in 2 bytes per token (half of int32, a quarter of torch's int64)")
    _q("Tokenizer throughput, and the time to tokenize the Pile (825 GiB: the handout's '825GB')?")
    bps, note = measure_tokenizer_throughput()
    if bps is None:
        _a(f"not measured: {note}")
        return
    mb_per_sec, pile_hours, pile_days = bps / 1e6, PILE_BYTES / bps / 3600, PILE_BYTES / bps / DAY
    _a(f"measured live: {mb_per_sec:.2f} MB/s ({note}, one process)",
       f"Pile: 825 x 2^30 B / {bps:,.0f} B/s = {pile_hours:,.1f} hours = {pile_days:.2f} days at most: encode gives "
       f"a text of {bpe.bpe_fast.COMPILED_MIN_CHARS:,}+ characters to its compiled engine (python bench.py encode); "
       "the handout's 10K and 32K tokenizers: python experiments.py tokenizer --data tinystories (or owt)")


# ---------------------------------------------------------------------------------------------
# 12. Where the course notes are wrong: the notes (../shared/reference/seeds, files 000-004)
#     and the lecture, each published figure against the formulas above, with its cause

def notes_corrections():
    """[(question, published, verified, cause)], in the order of the sections above."""
    per_day = lecture_70b_run()[1]
    bpp = sum(ADAMW_BYTES_PER_PARAM["bf16 weights + fp32 master copy"].values())
    billions = largest_model(bpp) / 1e9
    ff, square = tensor_bytes(GPT3_FF_SHAPE, torch.float32), tensor_bytes((12288, 12288), torch.float32)
    ff_mib, heads, (batch, micro, _, _) = ff / MiB, GPT2_SHAPES["XL"][2], GRAD_ACCUMULATION.values()
    (t1, xl), (t16, xl16) = flop_shares(gpt2_config("XL")), flop_shares(gpt2_config("XL", 16_384))
    tflops, tflops16, growth = t1 / 1e12, t16 / 1e12, t16 / t1
    each, attn16 = xl["attn QK^T + AV"] / 2, xl16["attn projections"] + xl16["attn QK^T + AV"]  # QK^T = AV
    adamw_flops, (xl_days, _) = sum(ADAMW_FLOPS_PER_PARAM.values()), lm_training_days(gpt2_config("XL"), **XL_RUN)
    a, b = adamw_memory_line(gpt2_config("XL"))  # GPT-2 XL's AdamW memory: a x batch_size + b bytes
    q70b, qxl, qadamw = "motivation: 70B on 15T tokens; 8 H100s", "transformer: GPT-2 XL", "adamw: GPT-2 XL"
    return [
        (q70b, "4.4e19 FLOPs/day (notes 001)", f"{per_day:.3e}",
         "a factor-1000 slip in the notes' text; their 144 days is right"),
        (q70b, "12 B/param, 53B params (notes 000, as the 2026 lecture: '2 + 2 + (4 + 4)')",
         f"{bpp} B/param, {billions:.0f}B params",
         "bf16 weights lose small updates (--section motivation), so mixed precision keeps an fp32 master copy (+4) "
         "that the sum leaves out (2025's lecture: 4 + 4 + (4 + 4)); without one: that section's 'no master copy' row"),
        ("tensors: GPT-3's feed-forward matrix", "2.3 GB for 12288 x 12288 x 4 bytes (notes 001)",
         f"{_gb(ff)} (= {ff_mib:.0f} MiB)",
         f"12288 x 12288 x 4 B is only {_gb(square)}: the matrix is (4 x 12288) x 12288"),
        ("memory: gradient accumulation", "batch 64 with micro-batch 256 (notes 000)", f"batch {batch} in "
         f"micro-batches of {micro}", f"the lecture's micro-batch is B / 4 = {micro}: 256 exceeds the batch"),
        (qxl, "4.20 TFLOPs, QK^T and AV 0.15% each (notes 003)", f"{tflops:.3f} TFLOPs, {each:.2%} each",
         f"QK^T counted for one head: 2 T^2 d_k L instead of 2 T^2 d L (h = {heads} times too small)"),
        (qxl, "~70.4 TFLOPs (about 20x), attention 27.58% (notes 003)",
         f"{tflops16:.1f} TFLOPs ({growth:.1f}x), attention {attn16:.1%}",
         "the same single-head QK^T and AV count; the 20x divides by 3.5T, not the notes' own 4.20T"),
        (qadamw, "(2 + 3 + 1 + 1 + 4 + 4 + 1)BTd = 16BTd a layer (notes 003)",
         f"{2 + 3 + 1 + 1 + 4 * 4 + 1}BTd by the list itself", "the list adds SwiGLU's W3 and gate (4BTd each), which "
         "the sum leaves out; the handout's list, 16BTd, is the answer (--section adamw), as the notes then say"),
        (qadamw, "14.45 x batch + 31.70 GB, batch 3 (notes 003)", f"{a / GB:.2f} x batch + {b / GB:.2f} GB, batch "
         f"{(80e9 - b) // a:.0f} ({(80 * GiB - b) // a:.0f} in 80 GiB)", "GiB labelled GB: batch 3 fits 80 GiB"),
        (qadamw, "10 P (notes 003)", f"{adamw_flops} P",
         "the notes count bias correction (2) as per-parameter work, though it is a per-step scalar, "
         "and leave out g^2, + eps, the (1 - beta) multiplies and weight decay"),
        (qadamw, "6354 days (notes 003)", f"{xl_days:,.0f}",
         "6 B T P counts the embedding table as matmul work and leaves out attention's T^2 matmuls"),
    ]


def section_corrections():
    for question, rows in itertools.groupby(notes_corrections(), key=lambda row: row[0]):
        _q(question, *(f"! published {p}, verified {v}: {cause}" for _, p, v, cause in rows))


# ---------------------------------------------------------------------------------------------
# 13. Proof: the model's formulas above against the real model.TransformerLM (test_all.py checks the optimizers')

# FlopCounterMode counts per module path; the last name of a path says which component it is.
# QK^T and AV run inside the attention module itself: its count minus its projections. fast=True
# runs q, k, v as one matmul inside attn too, and W1, W3 as one inside ffn (its count minus its Linears').
_COMPONENT_OF = {"q_proj": "attn q,k,v proj", "k_proj": "attn q,k,v proj", "v_proj": "attn q,k,v proj",
                 "output_proj": "attn output proj", "attn": "attn QK^T + AV", "w1": "ffn w1",
                 "w3": "ffn w3", "w2": "ffn w2", "ffn": "ffn w1 + w3", "lm_head": "lm_head"}


def measured_forward_flops(lm, T):
    """FlopCounterMode's matmul FLOPs per component of one sequence's forward on the meta device (shapes, no data)."""
    from torch.utils.flop_counter import FlopCounterMode  # here: it imports Triton, which train.py's start never needs
    with FlopCounterMode(display=False) as counter:
        lm(torch.zeros(1, T, dtype=torch.long, device="meta"))
    parts = dict.fromkeys(_COMPONENT_OF.values(), 0)
    for path, ops in counter.get_flop_counts().items():  # the root, "Global", a block: sums of their
        name = path.split(".")[-1]                        # children, skipped; attn and ffn: minus theirs below
        if name in _COMPONENT_OF:
            parts[_COMPONENT_OF[name]] += sum(ops.values())
    parts["attn QK^T + AV"] -= parts["attn q,k,v proj"] + parts["attn output proj"]
    parts["ffn w1 + w3"] -= parts["ffn w1"] + parts["ffn w2"] + parts["ffn w3"]
    return parts, counter.get_total_flops()


def measured_saved_bytes(lm, token_ids):
    """(bytes, count, output) of the distinct storages autograd saves during lm(token_ids),
    parameters and buffers excluded (a view shares its base's storage: each counts once)."""
    own = {t.untyped_storage().data_ptr() for t in list(lm.parameters()) + list(lm.buffers())}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = lm(token_ids)
    return sum(storages.values()), len(storages), out


ACTIVATION_SHAPES = [  # small real models for the saved-tensor check: B, T, d_model, h, d_ff, L, V
    (2, 16, 32, 4, 48, 2, 97), (3, 24, 64, 8, 96, 3, 50), (1, 32, 48, 2, 128, 1, 300)]
VERIFY_CONFIGS = {  # name -> (config, ablations)
    **{f"GPT-2 {n}": (gpt2_config(n), {}) for n in GPT2_SHAPES},
    "GPT-2 XL, T=16384": (gpt2_config("XL", 16_384), {}),
    "TinyStories": (TINYSTORIES, {}),
    "TinyStories silu_ffn d_ff=2048": ({**TINYSTORIES, "d_ff": 2048}, {"silu_ffn": True}),
    "TinyStories no_norm": (TINYSTORIES, {"no_norm": True}),
    "TinyStories tie_embeddings": (TINYSTORIES, {"tie_embeddings": True}),
    "GPT-2 small fast=True": (gpt2_config("small"), {"fast": True}),  # torch's fused attention counts T x T too
}
CUDA_BLOCK_ROUNDING = 512  # bytes: PyTorch's CUDA caching allocator rounds every block up to a multiple


def verification_checks():
    """Yield (what, formula, measured) triples."""
    from torch.utils.flop_counter import FlopCounterMode  # (as in measured_forward_flops)
    for name, (cfg, abl) in VERIFY_CONFIGS.items():
        lm, form = model.TransformerLM(**cfg, device="meta", **abl), lm_param_counts(**cfg, **abl)
        meas = dict.fromkeys(form, 0)  # parameters by state-dict name (a tied tensor counts once)
        for pname, p in lm.named_parameters():
            part = pname.split(".")[2 if pname.startswith("layers.") else 0]
            meas[part if part in meas else "norms"] += p.numel()  # ln1, ln2, ln_final
        for part in form:
            yield f"params  {name}: {part}", form[part], meas[part]
        form = lm_forward_flops_by_component(**cfg, silu_ffn=abl.get("silu_ffn", False))
        form["attn QK^T + AV"] = form.pop("attn QK^T") + form.pop("attn AV")  # one module, one op: seen together
        meas, total = measured_forward_flops(lm, cfg["context_length"])
        if abl.get("fast"):  # one matmul for q, k, v inside attn (counted with QK^T and AV), one for w1, w3 in ffn
            form["attn q,k,v proj + QK^T + AV"] = form.pop("attn q,k,v proj") + form.pop("attn QK^T + AV")
            meas["attn q,k,v proj + QK^T + AV"] = meas["attn QK^T + AV"]
            form["ffn w1 + w3"] = form.pop("ffn w1") + form.pop("ffn w3")
        for part in form:
            yield f"FLOPs   {name}: {part}", form[part], meas[part]
        yield f"FLOPs   {name}: total", sum(form.values()), total
    B, D, K = 8, 32, 16
    x, w1, w2 = (torch.randn(*s, requires_grad=True) for s in ((B, D), (D, D), (D, K)))
    with FlopCounterMode(display=False) as fwd:
        loss = (x @ w1 @ w2).sum()
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    f, b = two_layer_flops(B, D, K)
    yield "FLOPs   two-layer linear model: forward (2x)", f, fwd.get_total_flops()
    yield "FLOPs   two-layer linear model: backward (4x)", b, bwd.get_total_flops()
    for B, T, d, h, d_ff, L, V in ACTIVATION_SHAPES:  # small real models on the CPU
        torch.manual_seed(0)
        with FlopCounterMode(display=False) as counter:
            saved, _, out = measured_saved_bytes(model.TransformerLM(V, T, d, L, h, d_ff), torch.randint(0, V, (B, T)))
            out.sum().backward()
        step = training_step_flops(B * lm_forward_flops(V, T, d, L, d_ff))
        shape = f"B={B} T={T} d={d} h={h} d_ff={d_ff} L={L}"
        yield f"FLOPs   forward+backward = 3 x forward {shape}", step, counter.get_total_flops()
        yield f"bytes   saved for backward {shape}", saved_activation_bytes(B, T, d, h, d_ff, L), saved


def cuda_memory_check():
    """On a GPU: (saved tensors + logits by formula, bytes the forward leaves allocated, peak during
    it, slack of one rounding per allocation, bytes the warm-up left). None without CUDA. The warm-up
    runs the same forward before the baseline: a process's first matmul makes cuBLAS's workspace
    (~32 MiB, through PyTorch's allocator), which would otherwise count as activations."""
    if not torch.cuda.is_available():
        return None
    B, T, d, h, d_ff, L, V = 4, 256, 256, 8, 688, 4, 1000  # in ACTIVATION_SHAPES' order
    lm = model.TransformerLM(V, T, d, L, h, d_ff, device="cuda")
    ids = torch.randint(0, V, (B, T), device="cuda")
    before_warmup = torch.cuda.memory_allocated()
    lm(ids)  # the warm-up; its output and autograd graph are freed as soon as it returns
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _, n_storages, out = measured_saved_bytes(lm, ids)
    torch.cuda.synchronize()
    retained, peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
    formula = saved_activation_bytes(B, T, d, h, d_ff, L) + out.nbytes
    return formula, retained, peak, CUDA_BLOCK_ROUNDING * (n_storages + 1), base - before_warmup


def run_verify():  # returns the number of mismatches
    bad = 0
    print(f"{'check':<72}{'formula':>20}{'measured':>20}")
    for what, formula, measured in verification_checks():
        verdict = "" if formula == measured else "   MISMATCH"
        bad += bool(verdict)
        print(f"{what:<72}{formula:>20,}{measured:>20,}{verdict}")
    print("rule: parameter and FLOP counts equal exactly; saved-for-backward bytes equal exactly "
          "(distinct storages, parameters and buffers excluded)")
    gpu = cuda_memory_check()
    if gpu is None:
        print("GPU: no CUDA device; the memory_allocated / max_memory_allocated check was skipped")
    else:
        formula, retained, peak, slack, warmup = gpu
        verdict = "ok" if abs(retained - formula) <= slack else "MISMATCH"
        bad += verdict != "ok"
        print(f"GPU: saved + logits {formula:,} B vs memory_allocated after forward {retained:,} B "
              f"(rule: within {slack:,} B of {CUDA_BLOCK_ROUNDING}-byte rounding) {verdict}; "
              f"peak during forward {peak:,} B; held before it, by the warm-up forward: {warmup:,} B "
              "(a process's first matmul makes cuBLAS's workspace)")
    print(cli.counted(bad, "mismatch"))
    return bad


# ---------------------------------------------------------------------------------------------
# 14. Command line (SECTIONS: every section_* function above, by its name without the prefix, in reading order)

SECTIONS = {name.removeprefix("section_"): fn for name, fn in list(globals().items()) if name.startswith("section_")}


def main(argv=None):
    p = cli.Parser(prog="accounting.py", description="CS336 lecture 2 and assignment 1 resource accounting.")
    p.add_argument("--section", choices=SECTIONS, action="append", help="a section to print; repeat for more (default: all)")
    p.add_argument("--verify", action="store_true", help="check the model's formulas (parameters, FLOPs, saved "
                   "activations) against model.py; exit 1 on a mismatch")
    args = p.parse_args(argv)
    if args.verify and args.section:  # the check runs its own checks; a section would be silently ignored
        p.error(f"--verify runs its checks alone; drop --section {args.section[0]} or --verify")
    if args.verify:
        return 1 if run_verify() else 0
    for name in dict.fromkeys(args.section or SECTIONS):  # in the order named; a repeat prints once
        print("\n" + f"=== {name} ".ljust(93, "="))  # a 93-character rule
        SECTIONS[name]()
    return 0


if __name__ == "__main__":
    cli.end_quietly_on_closed_pipe()
    cli.catch_ctrl_c()  # a stop from here on: KeyboardInterrupt, then one line (exit_code)
    cli.exit_quietly(cli.exit_code("accounting.py", main, "nothing was written."))
