"""
accounting.py -- every napkin-math answer of CS336 lecture 2 and assignment 1, printed
with its formula and proven against the real model in model.py.

Read it top to bottom, in the order of the lecture and then the handout:
  1. Units, hardware and MFU: published peak FLOP/s, a measured CPU peak, peak_flops()
  2. Transformer LM formulas: parameters and forward FLOPs per component, 3x for a step
     (the functions train.py imports for MFU)
  3. Lecture 2, motivating questions: days to train 70B on 15T tokens; largest model on 8 H100s
  4. Lecture 2, memory of tensors: bytes per dtype, torch.finfo, the 1e-8 underflow
  5. Lecture 2, compute: the linear model, forward 2x / backward 4x / step 6x, GPT-3, a week of 8 H100s
  6. Lecture 2, arithmetic intensity and the roofline
  7. Lecture 2, memory of a training step: deep network, gradient accumulation, checkpointing
  8. Assignment 1, transformer_accounting: GPT-2 XL parameters, matmuls, the FLOPs table
  9. Assignment 1, adamwAccounting: peak memory, a*batch + b, AdamW FLOPs, days on one A100
 10. Assignment 1, TinyStories configuration, uint16 token ids, tokenizer throughput
 11. Proof: meta-device parameter counts, FlopCounterMode, tensors saved for backward
 12. Printing and the command line

Conventions. FLOPs count each multiply and each add (a matmul of (m, n) @ (n, p) costs
2*m*n*p). "Forward FLOPs" count matmuls only. Causal attention's QK^T and AV are counted over
the full T x T square, as torch.utils.flop_counter.FlopCounterMode counts a masked matmul
(the masked half is computed and then thrown away). GB = 1e9 bytes, GiB = 2**30 bytes.
"""

import math
import time

import torch

GB, GiB = 1e9, 2**30
SECONDS_PER_DAY = 60 * 60 * 24

# ---------------------------------------------------------------------------------------------
# 1. Units, hardware and MFU
# ---------------------------------------------------------------------------------------------

# Published dense (no 2:4 sparsity) peak FLOP/s from NVIDIA's datasheets. The datasheets'
# headline tensor-core numbers (1979 TFLOP/s bf16 for the H100 SXM) assume 2:4 sparsity:
# dense is half of that. "fp32" is the plain CUDA-core rate; "tf32" is fp32 matmuls on tensor
# cores, what torch uses when torch.get_float32_matmul_precision() is "high" or "medium".
PEAK_FLOPS = {
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 PCIe": {"bf16": 756.0e12, "fp16": 756.0e12, "tf32": 378.0e12, "fp32": 51.2e12},
    "A100": {"bf16": 312.0e12, "fp16": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12},
}
H100_BYTES_PER_SEC = 3.35e12  # H100 SXM HBM3 memory bandwidth
H100_MEMORY_BYTES = 80e9  # "80 GB" of HBM per H100


def gpu_peak_key(device_name):
    """Which row of PEAK_FLOPS a torch.cuda.get_device_name() string means, or None."""
    name = device_name.upper()
    if "H100" in name and "PCIE" in name:
        return "H100 PCIe"
    if "H100" in name and "NVL" in name:
        return None  # a different card (two dies, other clocks): no row, no guess
    if "H100" in name or "H200" in name:
        return "H100 SXM"  # the H200 has the H100 SXM's compute with more, faster memory
    if "A100" in name:
        return "A100"
    return None


_measured_cpu_peak = {}  # dtype -> FLOP/s, measured once per process


def measure_matmul_flops(dtype=torch.float32, n=1024, seconds=0.5):
    """Best FLOP/s of an (n, n) @ (n, n) matmul on the CPU, over about `seconds` of repeats."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up: thread pool, caches
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def peak_flops(device, dtype):
    """Peak FLOP/s of `device` for matmuls in `dtype`: MFU's denominator. None if unknown.

    CUDA: the published dense figure for the card (PEAK_FLOPS). CPU: there is no datasheet
    figure that means anything for a shared dev box, so we measure the best rate of a square
    float matmul in that dtype (about half a second, once per process): MFU on CPU is
    "fraction of what torch's own matmul reaches here", not of a vendor number.
    """
    device = torch.device(device)
    if device.type == "cuda":
        key = gpu_peak_key(torch.cuda.get_device_name(device))
        if key is None:
            return None
        if dtype == torch.float32:
            tf32 = torch.get_float32_matmul_precision() != "highest"
            return PEAK_FLOPS[key]["tf32" if tf32 else "fp32"]
        return PEAK_FLOPS[key].get({torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype))
    if device.type == "cpu":
        if dtype not in _measured_cpu_peak:
            _measured_cpu_peak[dtype] = measure_matmul_flops(dtype)
        return _measured_cpu_peak[dtype]
    return None


def mfu(flops, seconds, peak):
    """Model FLOPs utilization = achieved FLOP/s / peak FLOP/s (the useful FLOPs only)."""
    return flops / seconds / peak


# ---------------------------------------------------------------------------------------------
# 2. Transformer LM formulas (model.TransformerLM: pre-norm blocks, RoPE, SwiGLU, untied head)
# ---------------------------------------------------------------------------------------------

# Kaplan et al. (2020) and Hoffmann et al. (2022): the backward pass costs twice the forward
# (one matmul for the gradient w.r.t. the input, one w.r.t. the weight), so a step is 3x.
BACKWARD_PER_FORWARD = 2


def training_step_flops(forward_flops):
    """FLOPs of forward + backward = (1 + 2) x forward. The one place the 3 (or 6 = 3 x 2) lives."""
    return (1 + BACKWARD_PER_FORWARD) * forward_flops


def lm_param_counts(vocab_size, d_model, num_layers, d_ff, *, silu_ffn=False, no_norm=False,
                    tie_embeddings=False):
    """Trainable parameters of TransformerLM per component (RoPE has none: its sin/cos are fixed).

    token_embeddings V*d | attn 4*d^2 per layer (q, k, v, output) | ffn 3*d*d_ff per layer
    (w1, w2, w3; 2 without the gate) | norms d per RMSNorm, 2 per layer + ln_final | lm_head V*d.
    """
    d, L, V = d_model, num_layers, vocab_size
    return {
        "token_embeddings": V * d,
        "attn": L * 4 * d * d,
        "ffn": L * (2 if silu_ffn else 3) * d * d_ff,
        "norms": 0 if no_norm else (2 * L + 1) * d,
        "lm_head": 0 if tie_embeddings else V * d,
    }


def lm_forward_flops_by_component(vocab_size, context_length, d_model, num_layers, d_ff,
                                  silu_ffn=False):
    """Matmul FLOPs of one sequence of T = context_length tokens through TransformerLM.

    Per layer: q, k, v projections 3 * 2*T*d*d | QK^T: h heads of (T, d_k) @ (d_k, T) =
    2*T*T*d | AV: h heads of (T, T) @ (T, d_k) = 2*T*T*d | output projection 2*T*d*d |
    w1, w3, w2: 2*T*d*d_ff each. Once: lm_head 2*T*d*V. num_heads cancels (h * d_k = d).
    """
    T, d, L, V = context_length, d_model, num_layers, vocab_size
    flops = {
        "attn q,k,v proj": L * 3 * 2 * T * d * d,
        "attn QK^T": L * 2 * T * T * d,
        "attn AV": L * 2 * T * T * d,
        "attn output proj": L * 2 * T * d * d,
        "ffn w1": L * 2 * T * d * d_ff,
        "ffn w3": 0 if silu_ffn else L * 2 * T * d * d_ff,
        "ffn w2": L * 2 * T * d_ff * d,
        "lm_head": 2 * T * d * V,
    }
    return flops


def lm_forward_flops(vocab_size, context_length, d_model, num_layers, d_ff, silu_ffn=False):
    """Forward matmul FLOPs of one sequence of context_length tokens (see the components above)."""
    return sum(lm_forward_flops_by_component(vocab_size, context_length, d_model, num_layers,
                                             d_ff, silu_ffn).values())
