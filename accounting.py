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


# ---------------------------------------------------------------------------------------------
# 3. Lecture 2, motivating questions
# ---------------------------------------------------------------------------------------------

def dense_forward_flops(num_params, num_tokens):
    """Forward pass of a dense model: each parameter does one multiply and one add per token."""
    return 2 * num_params * num_tokens


def training_flops(num_params, num_tokens):
    """The 6 N D rule: training_step_flops(2 N D)."""
    return training_step_flops(dense_forward_flops(num_params, num_tokens))


def days_to_train(total_flops, num_gpus, peak, mfu_fraction):
    """days = FLOPs / (GPUs x peak FLOP/s x MFU x 86400 s/day)."""
    return total_flops / (num_gpus * peak * mfu_fraction * SECONDS_PER_DAY)


# Bytes of training state per parameter with AdamW (activations come on top).
ADAMW_BYTES_PER_PARAM = {
    "fp32 everywhere (naive)": {"params fp32": 4, "grads fp32": 4, "m fp32": 4, "v fp32": 4},
    "autocast (fp32 weights, bf16 matmuls)": {"params fp32": 4, "grads fp32": 4, "m fp32": 4,
                                              "v fp32": 4},
    "bf16 weights + fp32 master copy": {"params bf16": 2, "grads bf16": 2, "master fp32": 4,
                                        "m fp32": 4, "v fp32": 4},
    "bf16 weights, no master copy": {"params bf16": 2, "grads bf16": 2, "m fp32": 4, "v fp32": 4},
}


def largest_model(memory_bytes, bytes_per_param):
    """Parameters that fit when memory holds only the training state: memory / bytes per param."""
    return memory_bytes / bytes_per_param


# ---------------------------------------------------------------------------------------------
# 4. Lecture 2, memory of tensors
# ---------------------------------------------------------------------------------------------

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def tensor_bytes(shape, dtype):
    """memory = number of elements x bytes per element."""
    return math.prod(shape) * torch.empty(0, dtype=dtype).element_size()


def stored_value(x, dtype):
    """What `dtype` keeps of the float x (1e-8 underflows to 0 in fp16, survives in bf16)."""
    return torch.tensor(x, dtype=torch.float32).to(dtype).float().item()


# ---------------------------------------------------------------------------------------------
# 5. Lecture 2, compute
# ---------------------------------------------------------------------------------------------

def matmul_flops(m, n, p):
    """(m, n) @ (n, p): m*p dot products of length n, n multiplies + n adds each = 2 m n p."""
    return 2 * m * n * p


def two_layer_flops(B, D, K):
    """x (B, D) -> w1 (D, D) -> h1 -> w2 (D, K) -> h2. Backward needs, per matmul, the
    gradient w.r.t. the weight and w.r.t. the input: two matmuls of the forward's size."""
    forward = matmul_flops(B, D, D) + matmul_flops(B, D, K)
    return forward, BACKWARD_PER_FORWARD * forward


# ---------------------------------------------------------------------------------------------
# 6. Lecture 2, arithmetic intensity and the roofline (bf16: 2 bytes per value)
# ---------------------------------------------------------------------------------------------

def relu_cost(n, b=2):
    """(FLOPs, bytes): one comparison per element; read x, write y."""
    return n, 2 * b * n


def gelu_cost(n, b=2):
    """(FLOPs, bytes): the lecture's ~20 FLOPs per element for the tanh approximation."""
    return 20 * n, 2 * b * n


def dot_cost(n, b=2):
    """(FLOPs, bytes): n multiplies + n-1 adds; read x and w, write one number."""
    return 2 * n - 1, b * (2 * n + 1)


def matvec_cost(n, b=2):
    """(FLOPs, bytes): n dot products of length n; read x (n) and W (n^2), write y (n)."""
    return n * (2 * n - 1), b * (n * n + 2 * n)


def matmul_cost(n, b=2):
    """(FLOPs, bytes): n^2 dot products of length n; read X and W, write Y (n^2 each)."""
    return n * n * (2 * n - 1), b * 3 * n * n


def accelerator_intensity(peak, bytes_per_sec):
    """FLOPs the chip can do per byte it moves: above this a kernel is compute-bound."""
    return peak / bytes_per_sec


def roofline_mfu(intensity, accel_intensity):
    """Best MFU a kernel can reach: min(1, arithmetic intensity / accelerator intensity)."""
    return min(1.0, intensity / accel_intensity)


# ---------------------------------------------------------------------------------------------
# 7. Lecture 2, memory of a training step
# ---------------------------------------------------------------------------------------------

def deep_network_memory(B, D, L, optimizer_states_per_param, bytes_per_value=4):
    """The lecture's DeepNetwork (L blocks of D x D Linear + ReLU), in bytes:
    params D^2 L, activations B D L, gradients = params, optimizer state k x params
    (AdaGrad k=1: sum of g^2; AdamW k=2: m and v)."""
    params = D * D * L
    parts = {"parameters": params, "activations": B * D * L, "gradients": params,
             "optimizer state": optimizer_states_per_param * params}
    return {k: bytes_per_value * v for k, v in parts.items()}


def grad_accumulation(batch, micro_batch, D, L, bytes_per_value=2):
    """Activations scale with the micro-batch, the gradient with nothing: (steps, bytes, bytes)."""
    return batch // micro_batch, bytes_per_value * batch * D * L, bytes_per_value * micro_batch * D * L


def checkpointing(L, every):
    """(peak activations held, recomputed block forwards) for L blocks g = xW, h = relu(g).

    Units: one (B, D) tensor and one block's forward. Without checkpointing the forward keeps
    g and h of every block: 2L held, nothing recomputed. every=k keeps h of every k-th block
    (ceil(L/k) checkpoints); the backward re-runs one segment of k blocks at a time, holding
    its 2k tensors: every block is recomputed once. every=None keeps only the input: the
    backward of block i re-runs blocks 1..i, L(L+1)/2 block forwards for 2 tensors held.
    """
    if every is None:
        return 2, L * (L + 1) // 2
    if every == 0:  # no checkpointing
        return 2 * L, 0
    return math.ceil(L / every) + 2 * every, L


# ---------------------------------------------------------------------------------------------
# 8. Assignment 1, transformer_accounting
# ---------------------------------------------------------------------------------------------

GPT2_VOCAB, GPT2_CONTEXT = 50_257, 1_024
GPT2_SHAPES = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20),
               "XL": (48, 1600, 25)}  # num_layers, d_model, num_heads


def gpt2_config(name, context_length=GPT2_CONTEXT):
    """TransformerLM keyword arguments of a GPT-2-shaped model with the handout's d_ff = 4 d_model."""
    L, d, h = GPT2_SHAPES[name]
    return dict(vocab_size=GPT2_VOCAB, context_length=context_length, d_model=d, num_layers=L,
                num_heads=h, d_ff=4 * d)


def lm_num_params(cfg, **ablations):
    return sum(lm_param_counts(cfg["vocab_size"], cfg["d_model"], cfg["num_layers"], cfg["d_ff"],
                               **ablations).values())


def lm_flops_of(cfg, silu_ffn=False):
    """lm_forward_flops_by_component for a config dict."""
    return lm_forward_flops_by_component(cfg["vocab_size"], cfg["context_length"], cfg["d_model"],
                                         cfg["num_layers"], cfg["d_ff"], silu_ffn)


# ---------------------------------------------------------------------------------------------
# 9. Assignment 1, adamwAccounting (float32 everywhere, d_ff = 4 d_model)
# ---------------------------------------------------------------------------------------------

def handout_activation_elements(B, T, d_model, num_heads, vocab_size, num_layers):
    """Activations as the handout lists them, one tensor per item, d_ff = 4d:
    per layer: 2 RMSNorm outputs 2BTd | Q, K, V 3BTd | Q^T K scores BhT^2 | softmax BhT^2 |
    weighted sum of values BTd | output projection BTd | W1 4BTd | SiLU 4BTd | W2 BTd
    = 16BTd + 2BhT^2;  then final RMSNorm BTd, output embedding (logits) BTV, cross-entropy BTV.
    (The handout's list has no W3 and no gate product: counting SwiGLU's would add 8BTd.)"""
    d, h, L, V = d_model, num_heads, num_layers, vocab_size
    return L * (16 * B * T * d + 2 * B * h * T * T) + B * T * d + 2 * B * T * V


def adamw_memory(B, vocab_size, context_length, num_layers, d_model, num_heads):
    """Peak bytes of an AdamW step in float32: params 4P, grads 4P, m and v 8P, activations 4A."""
    P = lm_num_params(dict(vocab_size=vocab_size, d_model=d_model, num_layers=num_layers,
                           d_ff=4 * d_model))
    A = handout_activation_elements(B, context_length, d_model, num_heads, vocab_size, num_layers)
    return {"parameters": 4 * P, "gradients": 4 * P, "optimizer state": 8 * P, "activations": 4 * A}


def adamw_memory_line(cfg):
    """Total peak bytes as a * batch_size + b."""
    args = (cfg["vocab_size"], cfg["context_length"], cfg["num_layers"], cfg["d_model"], cfg["num_heads"])
    b = sum(adamw_memory(0, *args).values())
    return sum(adamw_memory(1, *args).values()) - b, b


def max_batch(a, b, memory_bytes):
    """Largest integer batch with a * batch + b <= memory."""
    return math.floor((memory_bytes - b) / a)


# FLOPs per parameter of one AdamW step (the handout's Algorithm 1; scalars like the
# bias-corrected alpha_t are computed once per step, not per parameter):
ADAMW_FLOPS_PER_PARAM = {
    "m = b1 m + (1 - b1) g": 3,  # 2 multiplies, 1 add
    "v = b2 v + (1 - b2) g^2": 4,  # g*g, 2 multiplies, 1 add
    "p -= a_t m / (sqrt(v) + eps)": 5,  # sqrt, add, divide, multiply, subtract
    "p -= a lambda p": 2,  # multiply, subtract
}


def adamw_step_flops(num_params):
    """One AdamW update: 14 FLOPs per parameter, elementwise (no matmul anywhere)."""
    return sum(ADAMW_FLOPS_PER_PARAM.values()) * num_params


def lm_training_days(cfg, batch_size, steps, peak, mfu_fraction):
    """days = steps x 3 x batch x forward FLOPs per sequence / (peak x MFU x 86400)."""
    step = training_step_flops(batch_size * lm_forward_flops(**_flops_args(cfg)))
    return days_to_train(steps * step, 1, peak, mfu_fraction), step


def _flops_args(cfg):
    return {k: cfg[k] for k in ("vocab_size", "context_length", "d_model", "num_layers", "d_ff")}


# ---------------------------------------------------------------------------------------------
# 10. Assignment 1, TinyStories configuration, token ids, tokenizer throughput
# ---------------------------------------------------------------------------------------------

TINYSTORIES = dict(vocab_size=10_000, context_length=256, d_model=512, num_layers=4, num_heads=16,
                   d_ff=1_344)
TINYSTORIES_TOKENS = 327_680_000  # batch size x steps x context length (handout, 1 H100)
TINYSTORIES_TOKENS_CPU = 40_960_000  # the handout's CPU / MPS budget: 32 x 5000 x 256
PILE_BYTES = 825e9


def smallest_uint(vocab_size):
    """Smallest unsigned numpy integer type that holds every id 0 .. vocab_size - 1."""
    for bits in (8, 16, 32, 64):
        if vocab_size <= 2**bits:
            return f"uint{bits}"
    raise ValueError(f"vocab_size={vocab_size} does not fit in 64 bits")


def measure_tokenizer_throughput(seconds=1.0):
    """(bytes/s, note) of bpe.py's Tokenizer with the GPT-2 vocabulary, encoding fresh text of
    the Shakespeare corpus for about `seconds` in one process. (None, reason) when bpe.py or
    the files are missing: then nothing is estimated."""
    from pathlib import Path
    shared = Path(__file__).resolve().parent.parent / "shared"
    files = [shared / "reference" / "gpt2_vocab.json", shared / "reference" / "gpt2_merges.txt",
             shared / "data" / "shakespeare.txt"]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        return None, f"file {missing[0]} not found"
    try:
        import bpe
        tok = bpe.Tokenizer.from_files(str(files[0]), str(files[1]), ["<|endoftext|>"])
    except Exception as e:  # bpe.py absent or broken: say so, estimate nothing
        return None, f"bpe.py unavailable ({type(e).__name__}: {e})"
    with open(files[2], encoding="utf-8") as f:
        text = f.read(8_000_000)
    chunk = 50_000  # characters; the first chunk only warms up (numba compilation, caches)
    tok.encode(text[:chunk])
    n_bytes, pos, start = 0, chunk, time.perf_counter()
    while pos < len(text) and time.perf_counter() - start < seconds:
        piece = text[pos:pos + chunk]
        tok.encode(piece)
        n_bytes, pos = n_bytes + len(piece.encode("utf-8")), pos + chunk
    return (n_bytes / (time.perf_counter() - start),
            f"bpe.Tokenizer.encode with the GPT-2 vocab, {n_bytes:,} bytes of shakespeare.txt")


# ---------------------------------------------------------------------------------------------
# 11. Proof: every formula above against the real model.TransformerLM
# ---------------------------------------------------------------------------------------------

def meta_lm(cfg, **ablations):
    """model.TransformerLM built on the meta device: shapes only, no memory, no init time."""
    import model
    return model.TransformerLM(**cfg, device="meta", **ablations)


def measured_param_counts(lm):
    """Parameters of a built model per component, by state-dict name (shared tensors once)."""
    counts = dict.fromkeys(("token_embeddings", "attn", "ffn", "norms", "lm_head"), 0)
    for name, p in lm.named_parameters():
        part = name.split(".")[0] if not name.startswith("layers.") else name.split(".")[2]
        counts[part if part in counts else "norms"] += p.numel()  # ln1, ln2, ln_final
    return counts


def measured_forward_flops(lm, T):
    """FlopCounterMode's matmul FLOPs of a meta-device forward of one sequence, per component."""
    from torch.utils.flop_counter import FlopCounterMode
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        lm(ids)
    by_module = {path: sum(ops.values()) for path, ops in counter.get_flop_counts().items()}
    parts = dict.fromkeys(("attn q,k,v proj", "attn output proj", "attn QK^T + AV", "ffn w1",
                           "ffn w3", "ffn w2", "lm_head"), 0)
    attn_total = 0
    for path, n in by_module.items():
        names = path.split(".")
        if "layers" not in names and names[-1] != "lm_head":
            continue  # the root and "Global" repeat their children's counts
        if names[-1] in ("q_proj", "k_proj", "v_proj"):
            parts["attn q,k,v proj"] += n
        elif names[-1] == "output_proj":
            parts["attn output proj"] += n
        elif names[-2:-1] == ["ffn"]:
            parts["ffn " + names[-1]] += n
        elif names[-1] == "attn":
            attn_total += n
        elif names[-1] == "lm_head":
            parts["lm_head"] += n
    parts["attn QK^T + AV"] = attn_total - parts["attn q,k,v proj"] - parts["attn output proj"]
    return parts, counter.get_total_flops()


def formula_forward_flops(cfg, silu_ffn=False):
    """lm_forward_flops_by_component grouped as FlopCounterMode can see it (QK^T and AV share
    a module and an op, so they are compared together; they are equal by symmetry)."""
    f = dict(lm_flops_of(cfg, silu_ffn))
    f["attn QK^T + AV"] = f.pop("attn QK^T") + f.pop("attn AV")
    return f


def saved_activation_bytes(B, T, d_model, num_heads, d_ff, num_layers):
    """Bytes autograd keeps after a float32 forward of model.TransformerLM (reference path,
    training mode), from token ids up to the logits (the logits are the output, not saved).

    With N = B*T, d_k = d_model / h, per layer:
      10 N d:  ln1 input, x*inv_rms, ln1 output (input of q/k/v proj), rotated q and k,
               v made contiguous for AV, heads concatenated (output_proj input), residual z,
               z*inv_rms, ln2 output (input of w1/w3)
       5 N d_ff: w1 x, sigmoid(w1 x), silu(w1 x), w3 x, the gated product (w2 input)
       2 N:      inv_rms of ln1 and ln2
       3 B h T^2: masked scores (for the max), exp(scores - max), probabilities
       2 B h T:  row max and row sum of the softmax
       2 T d_k:  RoPE cos and sin gathered for q and for k (T x d_k/2 each)
       T^2 bytes: the causal mask (bool)
    then ln_final: 3 N d + N, and the int64 token ids: 8 N bytes.
    """
    N, d, h, L = B * T, d_model, num_heads, num_layers
    per_layer = 10 * N * d + 5 * N * d_ff + 2 * N + 3 * B * h * T * T + 2 * B * h * T + 2 * T * (d // h)
    return 4 * (L * per_layer + 3 * N * d + N) + L * T * T + 8 * N


def measured_saved_bytes(lm, token_ids):
    """Bytes of the distinct storages autograd saves during lm(token_ids), parameters and
    buffers excluded (a view shares its base's storage, so each storage counts once)."""
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
}


def verification_checks(quick=False):
    """Yield (what, formula, measured) triples. quick skips the 16K-context and fast-path runs."""
    import model
    for name, (cfg, abl) in VERIFY_CONFIGS.items():
        if quick and "16384" in name:
            continue
        lm = meta_lm(cfg, **abl)
        form = lm_param_counts(cfg["vocab_size"], cfg["d_model"], cfg["num_layers"], cfg["d_ff"], **abl)
        meas = measured_param_counts(lm)
        for part in form:
            yield f"params  {name}: {part}", form[part], meas[part]
        f = formula_forward_flops(cfg, abl.get("silu_ffn", False))
        m, total = measured_forward_flops(lm, cfg["context_length"])
        for part in f:
            yield f"FLOPs   {name}: {part}", f[part], m[part]
        yield f"FLOPs   {name}: total", sum(f.values()), total
    if not quick:  # the fused path (torch's SDPA kernel) counts the same full T x T square
        cfg = gpt2_config("small")
        _, total = measured_forward_flops(meta_lm(cfg, fast=True), cfg["context_length"])
        yield "FLOPs   GPT-2 small fast=True: total", lm_forward_flops(**_flops_args(cfg)), total
    # forward + backward = 3 x forward, on a small real model on the CPU
    from torch.utils.flop_counter import FlopCounterMode
    cfg = dict(vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=48)
    lm = model.TransformerLM(**cfg)
    with FlopCounterMode(display=False) as counter:
        lm(torch.randint(0, 97, (2, 16))).sum().backward()
    yield "FLOPs   small LM forward+backward (B=2)", training_step_flops(
        2 * lm_forward_flops(**_flops_args(cfg))), counter.get_total_flops()
    B, D, K = 8, 32, 16
    x, w1, w2 = (torch.randn(*s, requires_grad=True) for s in ((B, D), (D, D), (D, K)))
    with FlopCounterMode(display=False) as fwd:
        loss = (x @ w1 @ w2).sum()
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    f, b = two_layer_flops(B, D, K)
    yield "FLOPs   two-layer linear model: forward (2x)", f, fwd.get_total_flops()
    yield "FLOPs   two-layer linear model: backward (4x)", b, bwd.get_total_flops()
    # activations: the bytes autograd saves, on small real models on the CPU
    for B, T, d, h, d_ff, L, V in ACTIVATION_SHAPES:
        torch.manual_seed(0)
        lm = model.TransformerLM(V, T, d, L, h, d_ff)
        meas, _, _ = measured_saved_bytes(lm, torch.randint(0, V, (B, T)))
        yield (f"bytes   saved for backward B={B} T={T} d={d} h={h} d_ff={d_ff} L={L}",
               saved_activation_bytes(B, T, d, h, d_ff, L), meas)


def cuda_memory_check(B=4, cfg=None):
    """On a GPU: bytes the forward leaves allocated (memory_allocated) vs saved tensors + logits,
    and the peak (max_memory_allocated). None without CUDA. Each allocation rounds up to 512 B."""
    if not torch.cuda.is_available():
        return None
    import model
    cfg = cfg or dict(vocab_size=1000, context_length=256, d_model=256, num_layers=4, num_heads=8, d_ff=688)
    lm = model.TransformerLM(**cfg, device="cuda")
    ids = torch.randint(0, cfg["vocab_size"], (B, cfg["context_length"]), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    saved, n_storages, out = measured_saved_bytes(lm, ids)
    torch.cuda.synchronize()
    retained = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    formula = saved_activation_bytes(B, cfg["context_length"], cfg["d_model"], cfg["num_heads"],
                                     cfg["d_ff"], cfg["num_layers"]) + out.numel() * out.element_size()
    return formula, retained, peak, 512 * (n_storages + 1)


# ---------------------------------------------------------------------------------------------
# 12. Printing and the command line
# ---------------------------------------------------------------------------------------------

def _q(text):
    print(f"\nQ: {text}")


def _a(text):
    print(f"   {text}")


def _published(published, verified, cause):
    print(f"   ! published {published}, verified {verified}: {cause}")


def _gb(n):
    return f"{n / GB:,.2f} GB ({n / GiB:,.2f} GiB)"


def section_motivation():
    h100 = PEAK_FLOPS["H100 SXM"]["bf16"]
    _q("How long to train a 70B-parameter model on 15T tokens on 1024 H100s at 50% MFU?")
    flops = training_flops(70e9, 15e12)
    days = days_to_train(flops, 1024, h100, 0.5)
    _a(f"FLOPs = 6 N D = 6 x 70e9 x 15e12 = {flops:.3e}")
    _a(f"per day = 1024 x {h100:.4g} FLOP/s (bf16 dense) x 0.5 x 86400 s = {1024 * h100 * 0.5 * SECONDS_PER_DAY:.3e} FLOPs")
    _a(f"days = {flops:.3e} / {1024 * h100 * 0.5 * SECONDS_PER_DAY:.3e} = {days:.1f} days")
    _published("4.4e19 FLOPs/day (notes 001)", f"{1024 * h100 * 0.5 * SECONDS_PER_DAY:.3e}",
               "a factor-1000 slip in the notes' text; their 144 days is right")
    _published("143.927 days (lecture)", f"{days:.3f}", "the lecture uses 1979e12 / 2 = 989.5e12 as the dense peak; "
               "PEAK_FLOPS has NVIDIA's 989.4e12")
    _q("What is the largest model 8 H100s (80 GB each) can train with AdamW, ignoring activations?")
    mem = 8 * H100_MEMORY_BYTES
    for name, parts in ADAMW_BYTES_PER_PARAM.items():
        bpp = sum(parts.values())
        spelled = " + ".join(f"{v} ({k})" for k, v in parts.items())
        _a(f"{name}: {spelled} = {bpp} B/param -> 8 x 80e9 / {bpp} = {largest_model(mem, bpp) / 1e9:.1f}B params")
    _a("mixed precision saves no state memory: bf16 weights need an fp32 master copy, because an")
    _a("update below about 2^-9 of a weight can round away in bf16. It saves activation memory and time.")
    bpp16 = sum(ADAMW_BYTES_PER_PARAM["bf16 weights + fp32 master copy"].values())
    _published("12 B/param, 53B params (notes 000, '2 + 2 + (4 + 4)' as mixed precision)",
               f"{bpp16} B/param, {largest_model(mem, bpp16) / 1e9:.0f}B params",
               "that sum leaves out the fp32 master weights (the lecture's own count is fp32: 4 + 4 + (4 + 4))")


def section_tensors():
    _q("How much memory does a tensor take, per dtype? (memory = elements x bytes per element)")
    ff = (4 * 12288, 12288)  # GPT-3: d_model 12288, d_ff = 4 d_model
    _a(f"torch.zeros(4, 8) float32: 32 x 4 = {tensor_bytes((4, 8), torch.float32)} bytes")
    for dt in DTYPES:
        _a(f"GPT-3 feed-forward matrix {ff[0]} x {ff[1]} in {str(dt)[6:]:<13}: "
           f"{math.prod(ff):,} x {tensor_bytes((1,), dt)} B = {_gb(tensor_bytes(ff, dt))}")
    _published("2.3 GB for 12288 x 12288 x 4 bytes (notes 001)",
               f"{_gb(tensor_bytes(ff, torch.float32))} (= {tensor_bytes(ff, torch.float32) / 2**20:.0f} MiB)",
               f"12288 x 12288 x 4 B is only {_gb(tensor_bytes((12288, 12288), torch.float32))}: the matrix is (4 x 12288) x 12288")
    _q("Range and resolution of each dtype (torch.finfo), and what happens to 1e-8?")
    _a(f"{'dtype':<14}{'bits':>5}{'max':>13}{'smallest normal':>17}{'eps':>12}   1e-8 stored as")
    for dt in DTYPES:
        fi = torch.finfo(dt)
        _a(f"{str(dt)[6:]:<14}{fi.bits:>5}{fi.max:>13.4g}{fi.tiny:>17.4g}{fi.eps:>12.4g}   {stored_value(1e-8, dt):.6g}")
    sub16 = torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps  # 2^-24
    _a(f"fp16 rounds 1e-8 to 0 (its smallest subnormal is {sub16:.3g}; below half of it rounds to 0): "
       "gradients this small vanish.")
    _a(f"bf16 has float32's exponent, so 1e-8 survives (as {stored_value(1e-8, torch.bfloat16):.5g}: 7 stored mantissa bits).")


def section_compute():
    _q("FLOPs of the linear model y = x w, x (B, D), w (D, K), with the lecture's GPU sizes?")
    B, D, K = 16384, 32768, 8192
    _a(f"2 B D K = 2 x {B} x {D} x {K} = {matmul_flops(B, D, K):.4e} FLOPs")
    _q("Forward, backward and a training step of x -> w1 (D, D) -> w2 (D, K)?")
    fwd, bwd = two_layer_flops(B, D, K)
    _a(f"forward 2 B (D D + D K) = {fwd:.4e} = 2 x tokens x params")
    _a(f"backward: per matmul, grad wrt weight + grad wrt input = 4 x tokens x params = {bwd:.4e}")
    _a(f"step = forward + backward = training_step_flops(forward) = {training_step_flops(fwd):.4e} = 6 x tokens x params")
    _q("FLOPs to train GPT-3 (175B parameters, 300B tokens)?")
    _a(f"6 x 175e9 x 300e9 = {training_flops(175e9, 300e9):.3e} FLOPs (published: 3.14e23)")
    _q("FLOPs of 8 H100s for a week?")
    peak = PEAK_FLOPS["H100 SXM"]["bf16"]
    _a(f"8 x 7 x 86400 s x {peak:.4g} FLOP/s = {8 * 7 * SECONDS_PER_DAY * peak:.4e} FLOPs (bf16 dense, 100% MFU)")
    _a("MFU = achieved FLOP/s / peak FLOP/s; >= 0.5 is good. Peaks (dense) used here:")
    for card, row in PEAK_FLOPS.items():
        _a(f"  {card:<10} " + ", ".join(f"{k} {v / 1e12:g}e12" for k, v in row.items()))


def section_intensity():
    peak = PEAK_FLOPS["H100 SXM"]["bf16"]
    acc = accelerator_intensity(peak, H100_BYTES_PER_SEC)
    _q("Is each operation compute- or memory-bound on an H100 (bf16, 2 bytes per value)?")
    _a(f"accelerator intensity = {peak:.4g} FLOP/s / {H100_BYTES_PER_SEC:.3g} B/s = {acc:.1f} FLOPs/byte")
    n = 4096
    for name, cost in (("ReLU", relu_cost), ("GELU", gelu_cost), ("dot product", dot_cost),
                       ("matrix-vector", matvec_cost), ("matrix-matrix", matmul_cost)):
        f, b = cost(n)
        ai = f / b
        _a(f"{name:<14} n={n}: {f:.4g} FLOPs / {b:.4g} bytes = {ai:7.3f} FLOPs/B -> roofline MFU "
           f"min(1, {ai:.3g} / {acc:.1f}) = {roofline_mfu(ai, acc):.3f}"
           f" ({'compute' if ai >= acc else 'memory'}-bound)")
    _a(f"matrix-matrix intensity ~ n/3: compute-bound once n > 3 x {acc:.0f} = {3 * acc:.0f}")


def section_memory():
    B, D, L = 2, 4, 3
    _q(f"Memory of the lecture's DeepNetwork (B={B}, D={D}, L={L}, float32) with AdaGrad and AdamW?")
    for opt, k in (("AdaGrad", 1), ("AdamW", 2)):
        m = deep_network_memory(B, D, L, k)
        _a(f"{opt}: " + " + ".join(f"{v} ({n})" for n, v in m.items()) + f" = {sum(m.values())} bytes")
    _a("params D^2 L; activations B D L; gradients = params; state 1 x (AdaGrad) or 2 x (AdamW) params")
    batch, micro, D, L = 1024, 256, 1024, 16
    steps, full, small = grad_accumulation(batch, micro, D, L)
    _q(f"Gradient accumulation: batch {batch} in micro-batches of {micro} (D={D}, L={L}, bf16)?")
    _a(f"activations 2 B D L = {full / 2**20:.0f} MiB -> 2 x {micro} x D x L = {small / 2**20:.0f} MiB, "
       f"{steps} forward/backward passes per optimizer step, same gradient (sum of micro-batch grads / {steps})")
    _a("(the notes' example sets batch 64 and micro-batch 256: a micro-batch cannot exceed the batch)")
    for L in (9, 16):
        _q(f"Activation checkpointing, L={L} blocks (held activations, recomputed block forwards)?")
        for label, every in (("no checkpointing", 0), ("checkpoint every layer", 1),
                             (f"every sqrt(L) = {math.isqrt(L)} layers", math.isqrt(L)), ("store nothing", None)):
            held, redo = checkpointing(L, every)
            _a(f"{label:<26} held {held:>3}  recompute {redo:>3}")
        _a("O(L) memory & no recompute | O(L) & one extra forward | O(sqrt L) & one extra forward | O(1) & O(L^2)")


def section_transformer():
    xl = gpt2_config("XL")
    counts = lm_param_counts(xl["vocab_size"], xl["d_model"], xl["num_layers"], xl["d_ff"])
    P = sum(counts.values())
    _q("(a) GPT-2 XL (V=50257, T=1024, L=48, d=1600, h=25, d_ff=6400): parameters and fp32 size?")
    _a("V d (embeddings) + L (4 d^2 + 3 d d_ff + 2 d) + d (ln_final) + V d (lm_head)")
    _a(" + ".join(f"{v:,} ({k})" for k, v in counts.items()) + f" = {P:,}")
    _a(f"fp32: 4 x {P:,} = {_gb(4 * P)}")
    _q("(b) The matmuls of one forward pass of T=1024 tokens and their FLOPs?")
    flops = lm_flops_of(xl)
    shapes = {"attn q,k,v proj": "3 x (T, d) @ (d, d), x L", "attn QK^T": "h x (T, d_k) @ (d_k, T), x L",
              "attn AV": "h x (T, T) @ (T, d_k), x L", "attn output proj": "(T, d) @ (d, d), x L",
              "ffn w1": "(T, d) @ (d, d_ff), x L", "ffn w3": "(T, d) @ (d, d_ff), x L",
              "ffn w2": "(T, d_ff) @ (d_ff, d), x L", "lm_head": "(T, d) @ (d, V), once"}
    total = sum(flops.values())
    for k, v in flops.items():
        _a(f"{k:<17} {shapes[k]:<30} {v:.4e}  {100 * v / total:5.2f}%")
    _a(f"{'total':<48} {total:.4e} FLOPs (= {total / 1e12:.3f} TFLOPs)")
    _published("4.20 TFLOPs, QK^T and AV 0.15% each (notes 003)", f"{total / 1e12:.3f} TFLOPs, "
               f"{100 * flops['attn QK^T'] / total:.2f}% each",
               f"QK^T counted for one head: 2 T^2 d_k L instead of 2 T^2 d L (h = {xl['num_heads']} times too small)")
    _q("(c) Which parts need the most FLOPs?")
    ffn = flops["ffn w1"] + flops["ffn w2"] + flops["ffn w3"]
    _a(f"the SwiGLU feed-forward: {100 * ffn / total:.1f}%; then the attention projections "
       f"{100 * (flops['attn q,k,v proj'] + flops['attn output proj']) / total:.1f}%")
    _q("(d, e) Share of each component, GPT-2 small..XL at T=1024 and XL at T=16384")
    cols = [(n, gpt2_config(n)) for n in GPT2_SHAPES] + [("XL@16K", gpt2_config("XL", 16_384))]
    table = {n: formula_forward_flops(c) for n, c in cols}
    groups = {"attn projections": ("attn q,k,v proj", "attn output proj"), "attn QK^T + AV": ("attn QK^T + AV",),
              "ffn (w1, w2, w3)": ("ffn w1", "ffn w2", "ffn w3"), "lm_head": ("lm_head",)}
    _a(f"{'component':<18}" + "".join(f"{n:>10}" for n, _ in cols))
    for g, keys in groups.items():
        _a(f"{g:<18}" + "".join(f"{100 * sum(t[k] for k in keys) / sum(t.values()):>9.2f}%" for t in table.values()))
    _a(f"{'total FLOPs':<18}" + "".join(f"{sum(t.values()):>10.3e}" for t in table.values()))
    _a("bigger models: the FFN and projections (~ d^2 L) grow, lm_head (~ d V) shrinks, attention")
    _a("core (~ T^2 d L) shrinks relative to d^2 L at fixed T. Longer context: T^2 takes over.")
    t1, t16 = sum(table["XL"].values()), sum(table["XL@16K"].values())
    core16 = table["XL@16K"]["attn QK^T + AV"] / t16
    _a(f"XL: T 1024 -> 16384 multiplies FLOPs by {t16 / t1:.1f} (16x for linear parts, 256x for QK^T + AV);")
    _a(f"    attention core share {100 * table['XL']['attn QK^T + AV'] / t1:.1f}% -> {100 * core16:.1f}%")
    _published("~70.4 TFLOPs (about 20x), attention 27.58% (notes 003)", f"{t16 / 1e12:.1f} TFLOPs ({t16 / t1:.1f}x), "
               f"attention {100 * (core16 + sum(table['XL@16K'][k] for k in groups['attn projections']) / t16):.1f}%",
               "the same single-head QK^T and AV count")


def section_adamw():
    xl = gpt2_config("XL")
    _q("(a) Peak memory of AdamW in float32 (d_ff = 4d), by component?")
    _a("P = 2Vd + L(16d^2 + 2d) + d (embeddings, lm_head, attention 4d^2 + SwiGLU 12d^2, norms)")
    _a("parameters 4P | gradients 4P | optimizer state (m, v) 8P | activations 4A, with")
    _a("A = L(16 B T d + 2 B h T^2) + B T d + 2 B T V   (the handout's list; see handout_activation_elements)")
    _a("total = 16P + 4 [L(16 B T d + 2 B h T^2) + B T d + 2 B T V] bytes")
    a, b = adamw_memory_line(xl)
    _q("(b) GPT-2 XL as a * batch_size + b, and the largest batch in 80 GB?")
    _a(f"a = 4 A(B=1) = {a:,} B = {_gb(a)};  b = 16 P = {b:,} B = {_gb(b)}")
    _a(f"80 GB = 80e9 B: batch <= (80e9 - b) / a = {(80e9 - b) / a:.2f} -> {max_batch(a, b, 80e9)}")
    _a(f"80 GiB (what an '80GB' A100 holds): ({80 * GiB:.4g} - b) / a = {(80 * GiB - b) / a:.2f} -> {max_batch(a, b, 80 * GiB)}")
    _a(f"(model.py's autograd actually keeps {saved_activation_bytes(1, 1024, 1600, 25, 6400, 48) / GB:.1f} GB per sequence up to the logits; see --verify)")
    _q("(c) FLOPs of one AdamW step?")
    P = lm_num_params(xl)
    _a(" + ".join(f"{v} ({k})" for k, v in ADAMW_FLOPS_PER_PARAM.items()) + f" = {sum(ADAMW_FLOPS_PER_PARAM.values())} P")
    per = sum(ADAMW_FLOPS_PER_PARAM.values())
    _a(f"GPT-2 XL: {per} x {P:,} = {adamw_step_flops(P):.3e} FLOPs (negligible next to forward + backward)")
    _published("10 P (notes 003)", f"{per} P", "the notes count bias correction (2) as per-parameter work, though "
               "it is a per-step scalar, and leave out g^2, + eps, the (1 - beta) multiplies and weight decay")
    _q("(d) Days to train GPT-2 XL, 400K steps of batch 1024, on one A100 (19.5e12 fp32) at 50% MFU?")
    days, step = lm_training_days(xl, 1024, 400_000, PEAK_FLOPS["A100"]["fp32"], 0.5)
    _a(f"step = 3 x 1024 x {lm_forward_flops(**_flops_args(xl)):.4e} = {step:.4e} FLOPs (backward = 2 x forward)")
    _a(f"days = 400000 x {step:.4e} / (19.5e12 x 0.5 x 86400) = {days:,.0f} days ({days / 365.25:.1f} years)")
    _published("6354 days (notes 003)", f"{days:,.0f}",
               "6 B T P counts the embedding table as matmul work and leaves out attention's T^2 matmuls")


def section_tinystories():
    cfg = TINYSTORIES
    c = lm_param_counts(cfg["vocab_size"], cfg["d_model"], cfg["num_layers"], cfg["d_ff"])
    total, blocks = sum(c.values()), c["attn"] + c["ffn"] + c["norms"]
    _q("TinyStories model (V=10000, T=256, d=512, L=4, h=16, d_ff=1344): parameters?")
    _a(" + ".join(f"{v:,} ({k})" for k, v in c.items()) + f" = {total:,}")
    _a(f"blocks + norms alone: {blocks:,}; blocks + norms + lm_head: {blocks + c['lm_head']:,}")
    _a("the handout's 'about 17M non-embedding parameters' is everything except the input embedding")
    _a(f"table (a lookup, no FLOPs): {(blocks + c['lm_head']) / 1e6:.2f}M; the blocks alone are {blocks / 1e6:.2f}M")
    fwd = lm_forward_flops(**_flops_args(cfg))
    _q("Token budget 327,680,000 = batch x steps x context: what does it cost?")
    seqs = TINYSTORIES_TOKENS // cfg["context_length"]
    flops = training_step_flops(seqs * fwd)
    _a(f"{TINYSTORIES_TOKENS:,} / 256 = {seqs:,} sequences, e.g. batch 128 x {seqs // 128:,} steps or 32 x {seqs // 32:,}")
    _a(f"FLOPs = 3 x {seqs:,} x {fwd:.4e} = {flops:.3e} (6 N D with N = blocks + lm_head: "
       f"{training_flops(blocks + c['lm_head'], TINYSTORIES_TOKENS):.3e})")
    h100 = PEAK_FLOPS["H100 SXM"]["bf16"]
    _a(f"on one H100 (bf16) that is {flops / h100:.0f} s at 100% MFU: the handout's 30-40 minutes means "
       f"MFU ~ {flops / h100 / 2100:.1%} (small models are overhead-bound)")
    _a(f"CPU budget: 32 x 5000 x 256 = {TINYSTORIES_TOKENS_CPU:,} tokens = {training_step_flops(TINYSTORIES_TOKENS_CPU // 256 * fwd):.3e} FLOPs")


def section_tokenizer():
    _q("Why store token ids as uint16?")
    for v in (10_000, 32_000, GPT2_VOCAB):
        _a(f"vocab {v:,}: ids 0..{v - 1:,} <= 65,535 = 2^16 - 1 -> {smallest_uint(v)}, 2 bytes per token "
           f"(half of int32, a quarter of torch's int64)")
    _q("Tokenizer throughput, and the time to tokenize the Pile (825 GB)?")
    bps, note = measure_tokenizer_throughput()
    if bps is None:
        _a(f"not measured: {note}")
        return
    _a(f"measured live: {bps / 1e6:.2f} MB/s ({note}, one process)")
    _a(f"Pile: 825e9 B / {bps:,.0f} B/s = {PILE_BYTES / bps / 3600:,.1f} hours = {PILE_BYTES / bps / SECONDS_PER_DAY:.2f} days")
    _published("16.4 days at 626,519.6 B/s (notes 003)", f"{PILE_BYTES / 626_519.6 / SECONDS_PER_DAY:.1f} days at that rate",
               "the notes took 825 GB as 825 x 2^30 bytes")


SECTIONS = {"motivation": section_motivation, "tensors": section_tensors, "compute": section_compute,
            "intensity": section_intensity, "memory": section_memory, "transformer": section_transformer,
            "adamw": section_adamw, "tinystories": section_tinystories, "tokenizer": section_tokenizer}


def run_verify():
    """Print formula vs measured for every check; return the number of mismatches."""
    bad = 0
    print(f"{'check':<72}{'formula':>20}{'measured':>20}")
    for what, formula, measured in verification_checks():
        ok = formula == measured
        bad += not ok
        print(f"{what:<72}{formula:>20,}{measured:>20,}{'' if ok else '   MISMATCH'}")
    print("rule: parameter and FLOP counts equal exactly; saved-for-backward bytes equal exactly "
          "(distinct storages, parameters and buffers excluded)")
    for B, T, d, h, d_ff, L, V in ACTIVATION_SHAPES:  # the handout's list, logits and loss left out
        handout = 4 * (handout_activation_elements(B, T, d, h, V, L) - 2 * B * T * V)
        print(f"   handout's list for B={B} T={T} d={d}: {handout:,} B = "
              f"{handout / saved_activation_bytes(B, T, d, h, d_ff, L):.2f} x what autograd keeps "
              "(it omits SwiGLU's extra tensors, the softmax's exp, RMSNorm's inputs, the mask)")
    gpu = cuda_memory_check()
    if gpu is None:
        print("GPU: no CUDA device; the memory_allocated / max_memory_allocated check was skipped")
    else:
        formula, retained, peak, slack = gpu
        ok = abs(retained - formula) <= slack
        bad += not ok
        print(f"GPU: saved + logits {formula:,} B vs memory_allocated after forward {retained:,} B "
              f"(rule: within {slack:,} B of 512-byte rounding) {'ok' if ok else 'MISMATCH'}; "
              f"peak during forward {peak:,} B")
    print(f"{bad} mismatch(es)")
    return bad


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description="CS336 lecture 2 and assignment 1 resource accounting.")
    p.add_argument("--section", help="print one section: " + ", ".join(SECTIONS))
    p.add_argument("--verify", action="store_true", help="check every formula against model.py; exit 1 on a mismatch")
    args = p.parse_args(argv)
    if args.section is not None and args.section not in SECTIONS:
        p.error(f"--section {args.section!r} is not a section; choose one of: {', '.join(SECTIONS)}")
    if args.verify:
        return 1 if run_verify() else 0
    for name, fn in SECTIONS.items():
        if args.section in (None, name):
            print(f"\n=== {name} " + "=" * (88 - len(name)))
            fn()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
