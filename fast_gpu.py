"""The fast path's engine on a GPU. Two parts: SwiGLU's gate, silu(a) * b between the FFN's two matmuls, as one
Triton kernel each way; and generate's decode step with a static KV cache, compiled (on CUDA, a CUDA graph). model.py
calls each at one visible place: SwiGLU (fast=True with train.py's --triton-gate, on a GPU where Triton is
installed) and _generate_static (model.py section 8). test_all.py checks the gate against model.py's, forward and
backward, through Triton's interpreter on a CPU, and the decode step's tokens against generate's plain path; bench.py
gpu times both (--sections gate, the levers, generation).

The lessons it embodies:
  1. Between two matmuls, elementwise work is paid in memory traffic. The gate's forward reads a and b and writes
     their product: 3 numbers per element. Its backward reads a, b and the product's gradient and writes the
     gradients of a and b: 5. At the GPT-2-small shape (32,768 rows, d_ff 2,048, bf16, 12 layers) that is 4.8 GB
     forward and 8.1 GB backward in each step.
  2. On the H200 (docs/results.md) inductor's forward moved its bytes near the memory's peak, its backward at
     about half of it. For the same graph on a CPU, inductor's code computes exp(-a) twice and divides twice per
     element (silu's sigmoid, and its derivative's).
  3. One kernel each way, and the backward computes s = sigmoid(a) once for both gradients:
     da = dh b s (1 + a (1 - s)),  db = dh silu(a) = dh a s,
     written into the one (rows, 2 d_ff) buffer that the fused W1/W3 matmul's backward reads. The arithmetic is
     float32, the storage the input's dtype (bf16 under autocast), as inductor's.
  4. The kernels run inside custom ops (torch.library) that autograd pairs, so torch.compile treats each as one
     kernel and still fuses what is around it. On a CPU, and without Triton, model.py keeps torch's ops (usable();
     fused_head.py's loss kernel asks the same).
  5. Whether it wins is for the GPU to say. On the H200 (docs/results.md) the backward alone moved its bytes at the
     memory's speed, where inductor's did not; in a step whose kernels are launched one at a time the custom ops'
     launches cost the host more than that at the TinyStories shape. Under CUDA graphs the step with it and the
     fused head was the fastest measured (and turning it off from those defaults was slower), so it is on by default
     where the compiled step replays as CUDA graphs (config.resolve_config), off elsewhere.
"""
import contextlib
import os

import torch

# Triton is imported where its kernels can run: by a torch built for GPUs, or for Triton's interpreter on a CPU
# (TRITON_INTERPRET=1, as the tests check the kernels). A CPU build's processes never launch one and would pay its
# import at every start. Without it model.py and fused_head.py keep torch's ops.
triton = tl = None
if torch.backends.cuda.is_built() or os.environ.get("TRITON_INTERPRET") == "1":
    with contextlib.suppress(ImportError):  # torch's CPU wheels come without it
        import triton
        import triton.language as tl

BLOCK = 1024  # columns of one row per program: a power of two, half a GPT-2-small row of d_ff 2,048


# ----------------------------------------------------------------------------
# The kernels: program (row, block of columns); ab (rows, 2F) holds a = ab[:, :F] and b = ab[:, F:]

if triton is not None:
    @triton.jit
    def _gate_forward_kernel(ab_ptr, h_ptr, F, BLOCK: tl.constexpr):  # h = silu(a) * b
        row, cols = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < F
        a = tl.load(ab_ptr + row * 2 * F + cols, mask=inside, other=0.0).to(tl.float32)
        b = tl.load(ab_ptr + row * 2 * F + F + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * F + cols, (a * tl.sigmoid(a) * b).to(h_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _gate_backward_kernel(ab_ptr, dh_ptr, dab_ptr, F, BLOCK: tl.constexpr):  # lesson 3's two gradients, into dab
        row, cols = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < F
        a = tl.load(ab_ptr + row * 2 * F + cols, mask=inside, other=0.0).to(tl.float32)
        b = tl.load(ab_ptr + row * 2 * F + F + cols, mask=inside, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + row * F + cols, mask=inside, other=0.0).to(tl.float32)
        s = tl.sigmoid(a)
        out = dab_ptr.dtype.element_ty
        tl.store(dab_ptr + row * 2 * F + cols, (dh * b * s * (1 + a * (1 - s))).to(out), mask=inside)
        tl.store(dab_ptr + row * 2 * F + F + cols, (dh * a * s).to(out), mask=inside)


def usable(t):  # Triton's kernels, these and fused_head.py's: on a GPU with Triton, in 16 or 32 bits (float64: torch)
    return triton is not None and t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32)


def on_its_gpu(t):  # Triton launches on the current GPU: make t's current for the launch (--device cuda:1)
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _launch(kernel, ab, *tensors, out_columns):
    """kernel over ab's rows (of any leading dims, any strides) -> its output (..., out_columns), contiguous."""
    ab, tensors, F = ab.contiguous(), [t.contiguous() for t in tensors], ab.shape[-1] // 2  # the kernels' layout
    out = ab.new_empty(*ab.shape[:-1], out_columns)
    with on_its_gpu(ab):
        kernel[(ab.numel() // ab.shape[-1], triton.cdiv(F, BLOCK))](ab, *tensors, out, F, BLOCK=BLOCK)
    return out


# ----------------------------------------------------------------------------
# As ops that autograd and torch.compile know (lesson 4)

@torch.library.custom_op("cs336_fast_gpu::silu_gate", mutates_args=())
def silu_gate(ab: torch.Tensor) -> torch.Tensor:
    """ab (..., 2F) = [W1 x, W3 x], the fused matmul's output -> silu(W1 x) * W3 x (..., F): model.py's SwiGLU gate,
    one Triton kernel forward and one backward."""
    return _launch(_gate_forward_kernel, ab, out_columns=ab.shape[-1] // 2)


@silu_gate.register_fake
def _(ab):
    return ab.new_empty(*ab.shape[:-1], ab.shape[-1] // 2)


@torch.library.custom_op("cs336_fast_gpu::silu_gate_backward", mutates_args=())
def silu_gate_backward(ab: torch.Tensor, dh: torch.Tensor) -> torch.Tensor:
    """ab (..., 2F), the gradient dh (..., F) of silu(a) * b -> the gradients of a and b, side by side (..., 2F)."""
    return _launch(_gate_backward_kernel, ab, dh, out_columns=ab.shape[-1])


@silu_gate_backward.register_fake
def _(ab, dh):
    return ab.new_empty(ab.shape)


def _keep_ab(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


silu_gate.register_autograd(lambda ctx, dh: silu_gate_backward(ctx.saved_tensors[0], dh), setup_context=_keep_ab)


# ----------------------------------------------------------------------------
# generate's fast path (model.py, section 8): a static KV cache and a compiled decode step

_COMPILED_STEPS = {}  # device type -> the compiled decode step, one per process


class StaticKVCache:
    """One layer's keys and values in (B, H, context_length, d_head) buffers, written at the columns in `slots` (a
    tensor shared by all layers): no Python number changes per token, so the compiled step never recompiles for one.
    Zeros at first: a column not yet written is masked out, and must be finite (0 * NaN is NaN)."""
    n = 0  # forward's length check before the prefill; the decode steps bypass forward (model._run)

    def __init__(self, context_length):
        self.context_length, self.slots, self.k, self.v = context_length, None, None, None

    def append(self, k, v):  # k, v: (B, H, T, d_k) written at columns slots (T,) -> the whole buffers
        B, H, T, d = k.shape
        if self.k is None or self.k.shape[:2] != (B, H) or self.k.dtype != k.dtype or self.k.device != k.device:
            self.k, self.v = (t.new_zeros(B, H, self.context_length, d) for t in (k, v))
            for t in (self.k, self.v) if k.is_cuda else ():  # a CUDA graph writes into them where they are
                torch._dynamo.mark_static_address(t)
        self.k.index_copy_(2, self.slots, k)
        self.v.index_copy_(2, self.slots, v)
        return self.k, self.v


def decode_step(model, caches, tok, valid, pad):
    """tok (B, 1), the token of each row at column caches[0].slots (1,) -> logits (B, V). Its RoPE position
    counts real tokens: the column less the row's padding (pad (B, 1)); it sees the columns up to its own
    that are not padding (valid (B, C)). Every input keeps its shape from token to token."""
    slot = caches[0].slots
    mask = valid & (torch.arange(valid.shape[1], device=valid.device) <= slot)  # (B, C)
    return model._run(tok, slot - pad, mask[:, None, None, :], caches)[:, -1]


def graph_limit_hit():  # fullgraph=True past dynamo's limit of graphs per function: an error, not an eager
    # fallback (torch 2.5 names it so); looked up only when an error comes: torch._dynamo takes a second to import
    return tuple(getattr(torch._dynamo.exc, n) for n in ("FailOnRecompileLimitHit", "CacheLimitExceeded")
                 if hasattr(torch._dynamo.exc, n))


def compiled_step(device_type):
    if device_type not in _COMPILED_STEPS:  # CUDA: reduce-overhead replays the step as a CUDA graph
        _COMPILED_STEPS[device_type] = torch.compile(  # fullgraph: no graph break; dynamic=False: a graph per B, dtype
            decode_step, mode="reduce-overhead" if device_type == "cuda" else None, fullgraph=True, dynamic=False)
    return _COMPILED_STEPS[device_type]
