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
    """(bytes/s, note) of bpe.py's Tokenizer with the GPT-2 vocabulary on the TinyStories sample.

    Returns (None, reason) when bpe.py or the reference files are missing."""
    from pathlib import Path
    ref = Path(__file__).resolve().parent.parent / "shared" / "reference"
    files = [ref / "gpt2_vocab.json", ref / "gpt2_merges.txt", ref / "tinystories_sample.txt"]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        return None, f"reference file {missing[0]} not found"
    try:
        import bpe
        tok = bpe.Tokenizer.from_files(str(files[0]), str(files[1]), ["<|endoftext|>"])
    except Exception as e:  # bpe.py absent or not finished: say so, estimate nothing
        return None, f"bpe.py unavailable ({type(e).__name__}: {e})"
    docs = files[2].read_text(encoding="utf-8").split("<|endoftext|>")
    tok.encode(docs[0])  # warm-up (numba compilation, caches)
    n_bytes, start = 0, time.perf_counter()
    for doc in docs[1:]:
        tok.encode(doc)
        n_bytes += len(doc.encode("utf-8"))
        if time.perf_counter() - start > seconds:
            break
    return n_bytes / (time.perf_counter() - start), f"bpe.Tokenizer (GPT-2 vocab), {n_bytes:,} bytes of TinyStories"


# ---------------------------------------------------------------------------------------------
# 11. Proof: every formula above against the real model.TransformerLM
# ---------------------------------------------------------------------------------------------

class _MetaLM(torch.nn.Module):
    """TransformerLM.forward without its token-id range check (int(token_ids.min()) needs real
    values, which meta tensors do not have). Used only when the real forward refuses meta."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, token_ids):
        x = self.lm.token_embeddings(token_ids)
        for layer in self.lm.layers:
            x = layer(x)
        return self.lm.lm_head(self.lm.ln_final(x))


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
        try:
            lm(ids)
        except (RuntimeError, NotImplementedError):  # meta tensors have no values to check
            _MetaLM(lm)(ids)
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
