"""A Transformer language model from scratch, and text generation with a KV cache.

Sections, in reading order (CS336 assignment 1, sections 3 and 6):
  1. Parameters: Linear, Embedding (truncated-normal init).
  2. Small pieces: RMSNorm, silu, softmax (max-subtracted).
  3. The feed-forward network: SwiGLU (the default; gated=False: a plain SiLU FFN, an ablation).
  4. Rotary position embeddings (RoPE): rotate adjacent pairs by position-dependent angles.
  5. Attention: scaled_dot_product_attention, then causal MultiHeadSelfAttention.
  6. TransformerBlock (pre-norm; post-norm / no-norm ablations) and TransformerLM.
  7. generate(): temperature, top-p, stop id; cache-free reference and a KV-cached path (KVCache).
  8. generate's fast path, the default on CUDA: a static cache, a compiled decode step, on-device sampling.
The reference path uses plain tensor ops (no torch.nn.functional; of torch.nn only Module, ModuleList, Parameter,
init and the no-norm ablation's Identity). fast=True swaps in fused versions where each piece is defined (torch's
attention and silu, one matmul for q, k, v and one for W1, W3, complex RoPE, fast_cpu.py's and fast_gpu.py's loops):
same parameters and state-dict keys, tested equal to the plain path. Tests: python -m pytest -q test_all.py -k model
"""
import decimal
import math
import numbers
import threading
import weakref

import torch
from torch import nn

import fast_cpu  # the engine: numba kernels for float32 CPU tensors (fast=True)
import fast_gpu  # on a GPU: SwiGLU's gate as Triton kernels (train.py's --triton-gate); generate's static cache


# ----------------------------------------------------------------------------
# 1. Parameters: Linear and Embedding

def check_count(name, n, least=1, below=None):
    """The boundary check of a size, count or id, as an argument arrives: a whole number >= least (and < below)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {n!r}.")
    if below is not None and n >= below:
        raise ValueError(f"{name} {n} is outside [{least}, {below}).")


def check_positive(name, x):
    """The boundary check of a scale (RMSNorm's eps, RoPE's base): a finite number > 0. An eps of 0 or less makes a
    zero row NaN (0/0, the root of a negative number), a base of 0 or less NaN tables; a string ("1e4") is no
    number."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}.")


def head_dim(d_model, num_heads):
    """Each head's width d_model / num_heads, refused unless whole (the heads split the residual stream)."""
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}.")
    return d_model // num_heads


def _check_dtype(dtype):  # a part's weights: an integer dtype has no init (torch: "not implemented for 'Long'")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be None or a floating-point torch.dtype, got {dtype!r}.")


def _trunc_normal(shape, std, device, dtype):
    # handout 3.4.1: N(0, std^2) truncated at +-3 std
    _check_dtype(dtype)
    w = torch.empty(shape, device=device, dtype=dtype)
    nn.init.trunc_normal_(w, mean=0.0, std=std, a=-3 * std, b=3 * std)
    return nn.Parameter(w)


class Linear(nn.Module):
    """y = x W^T with W of shape (out, in), no bias (like most modern LLMs); init std^2 = 2 / (in + out)."""

    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        check_count("in_features", in_features)
        check_count("out_features", out_features)
        std = math.sqrt(2.0 / (in_features + out_features))
        self.weight = _trunc_normal((out_features, in_features), std, device, dtype)

    def forward(self, x):  # (..., in) -> (..., out)
        return x @ self.weight.t()


class Embedding(nn.Module):
    """Row lookup in a (num_embeddings, embedding_dim) table, init N(0, 1) cut at +-3."""

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        check_count("num_embeddings", num_embeddings)
        check_count("embedding_dim", embedding_dim)
        self.weight = _trunc_normal((num_embeddings, embedding_dim), 1.0, device, dtype)

    def forward(self, token_ids):  # (...) int -> (..., embedding_dim)
        return self.weight[token_ids]


# ----------------------------------------------------------------------------
# 2. Small pieces: RMSNorm, silu, softmax

class RMSNorm(nn.Module):
    """RMSNorm(a)_i = a_i / RMS(a) * g_i,  RMS(a) = sqrt(mean_i(a_i^2) + eps).
    Computed in float32 or wider (squares overflow float16 and lose digits in bfloat16), cast back to the input's
    dtype."""

    def __init__(self, d_model, eps=1e-5, device=None, dtype=None, fast=False):
        super().__init__()
        check_count("d_model", d_model)  # 0: the mean over no element, NaN
        _check_dtype(dtype)
        check_positive("eps", eps)
        self.eps, self.fast = eps, fast
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x):  # (..., d_model)
        if self.fast and fast_cpu.usable(x, self.weight):  # float32 on a CPU: one pass each way
            return fast_cpu.rms_norm(x, self.weight, self.eps)
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # no copy in float32; float64 stays float64
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


def silu(x):
    """SiLU(x) = x * sigmoid(x)."""
    return x * torch.sigmoid(x)


def softmax(x, dim):
    """softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x); subtracting the max keeps exp finite. Computed in x's
    dtype, as the handout writes it: a bf16 or float16 x sums in 8 or 11 bits (the loss and sampling upcast first;
    float32 here would keep float32 copies of attention's T x T scores for the backward)."""
    if x.numel() == 0:  # no numbers to normalize (and no max to take): empty out, as torch.softmax gives
        return x.clone()
    z = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return z / z.sum(dim=dim, keepdim=True)


# ----------------------------------------------------------------------------
# 3. The feed-forward network

def fused_projections(x):
    """Does fast=True run q, k, v (and W1, W3) as one matmul over concatenated weights? Where launches cost (a
    GPU) and under torch.compile, which fuses the concatenation into the cast to bfloat16; not on a CPU, eager,
    where the concatenation and the copy its backward makes of the gradients cost what the larger matmul saves."""
    return x.device.type != "cpu" or torch.compiler.is_compiling()


class SwiGLU(nn.Module):
    """FFN(x) = W2 (silu(W1 x) * W3 x), W1, W3: (d_ff, d_model), W2: (d_model, d_ff).
    gated=False is the ungated ablation W2 silu(W1 x), with no W3 (d_ff = 4 d_model matches SwiGLU's parameters)."""

    def __init__(self, d_model, d_ff, device=None, dtype=None, fast=False, gated=True):
        super().__init__()
        check_count("d_ff", d_ff)  # named here: Linear's words would be out_features
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype) if gated else None
        self.fast, self.triton_gate = fast, False  # triton_gate: train.py's --triton-gate sets it

    def forward(self, x):  # (..., d_model)
        act = torch.nn.functional.silu if self.fast else silu  # torch's: one kernel forward and backward
        if self.w3 is None:  # the ungated ablation
            return self.w2(act(self.w1(x)))
        if self.fast and fused_projections(x):  # one matmul for W1 x and W3 x
            ab = x @ torch.cat([self.w1.weight, self.w3.weight]).t()
            if self.triton_gate and fast_gpu.usable(ab):  # on a GPU: one Triton kernel each way (fast_gpu.py)
                return self.w2(fast_gpu.silu_gate(ab))
            a, b = ab.chunk(2, dim=-1)
        else:
            a, b = self.w1(x), self.w3(x)
            if self.fast and fast_cpu.usable(a, b):  # float32 on a CPU: silu(a) * b in one pass each way
                return self.w2(fast_cpu.silu_gate(a, b))
        return self.w2(act(a) * b)


# ----------------------------------------------------------------------------
# 4. Rotary position embeddings

def _tabulate_after_load(rope, incompatible_keys):  # a function, not a lambda: a hook is pickled with its module
    rope.tabulate()


class RotaryPositionalEmbedding(nn.Module):
    """Rotate each adjacent pair (x[2k], x[2k+1]) by the angle  pos * theta^(-2k / d_k).
    [x'_2k  ]   [cos  -sin] [x_2k  ]
    [x'_2k+1] = [sin   cos] [x_2k+1]

    cos and sin are tabulated per position in float64 on the default device, then kept in float32 non-persistent
    buffers (derived from theta, so not in checkpoints; tabulated again after a load). One module serves all layers."""

    def __init__(self, theta, d_k, max_seq_len, device=None):
        super().__init__()
        check_count("d_k", d_k)
        check_count("max_seq_len", max_seq_len)
        if d_k % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions, so the head dimension must be even, got d_k={d_k}.")
        check_positive("theta", theta)
        self.theta, self.d_k = theta, d_k
        for name, table in zip(("cos", "sin"), self.tables(max_seq_len)):
            self.register_buffer(name, table.to(device, torch.float32), persistent=False)
        # not in a state dict: every load tabulates them (a model made on "meta" would keep them uninitialized)
        self.register_load_state_dict_post_hook(_tabulate_after_load)

    def _apply(self, fn, recurse=True):  # after any move or cast, tabulated again (else model.to(bf16) then .float()
        super()._apply(fn, recurse)  # keeps bf16's rounding, logits 0.01 off; .double() float32's; to_empty() off
        if not self.cos.is_meta:  # "meta", uninitialized memory)
            self.tabulate()
        return self

    @torch.no_grad()
    def tabulate(self):
        """Fill cos and sin (again), exact in their dtype: float64's in a float64 model, else float32's. In place where
        they are float32 or float64 (a captured CUDA graph keeps reading the same memory); made anew after a cast to
        half precision, and on the CPU where they are on meta (load_state_dict(assign=True) of a model made there)."""
        for name, table in zip(("cos", "sin"), self.tables(len(self.cos))):
            old = getattr(self, name)
            if not old.is_meta and old.dtype in (torch.float32, torch.float64):
                old.copy_(table.to(old.dtype))  # cast on the CPU, then copied: an MPS device has no float64
            else:
                setattr(self, name, table.float().to("cpu" if old.is_meta else old.device))

    def tables(self, n):  # cos and sin of positions [0, n), float64 (n, d_k/2)
        inv_freq = self.theta ** (-torch.arange(0, self.d_k, 2, dtype=torch.float64) / self.d_k)  # (d_k/2,)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # (n, d_k/2)
        return angles.cos(), angles.sin()

    def forward(self, x, token_positions, as_complex=False):
        # x: (..., T, d_k); token_positions: (..., T) broadcastable against x's leading dims, each in [0, max_seq_len)
        # (TransformerLM.forward checks a caller's). Attention passes x (..., T, H, d_k) and positions (..., T, 1):
        # the same angle for every head, by broadcasting
        cos, sin = self.cos[token_positions], self.sin[token_positions]  # (..., T, d_k/2)
        if as_complex:  # the same rotation as (x_2k + i x_2k+1) e^{i angle}: one kernel instead of a dozen
            z = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # (..., T, d_k/2) complex, no copy
            return torch.view_as_real(z * torch.complex(cos, sin).to(z.dtype)).flatten(-2)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]  # the two members of each pair
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)  # (..., T, d_k/2, 2) -> d_k


# ----------------------------------------------------------------------------
# 5. Attention

def _check_mask_dtype(mask):  # said here, not by masked_fill or ~ in their words (torch's SDPA adds a float mask)
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True: may attend), got {mask.dtype}.")


def scaled_dot_product_attention(Q, K, V, mask=None):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V.
    Q: (..., Tq, d_k), K: (..., Tk, d_k), V: (..., Tk, d_v) -> (..., Tq, d_v).
    mask: bool, broadcastable to (..., Tq, Tk); True means "may attend". A query row that may attend to nothing gets
    NaN (0/0), so callers must leave every row at least one key."""
    _check_mask_dtype(mask)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ V


class MultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention: out = W_O concat_h Attention(W_Q^h x, W_K^h x, W_V^h x).
    d_k = d_v = d_model / num_heads. RoPE (if given) rotates q and k, never v, and every head
    gets the same rotation (heads act as a batch dimension)."""

    def __init__(self, d_model, num_heads, rope=None, device=None, dtype=None, fast=False):
        super().__init__()
        check_count("d_model", d_model)
        check_count("num_heads", num_heads)
        self.num_heads, self.d_head = num_heads, head_dim(d_model, num_heads)
        if rope is not None and rope.d_k != self.d_head:
            raise ValueError(f"RoPE was built for d_k={rope.d_k} but the head dimension is {self.d_head}.")
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = rope  # one module shared by all layers; its buffers are not persistent, so no state-dict keys
        self.fast = fast

    def _project(self, x):
        """x (..., T, d_model) -> q, k, v, each (..., T, H, d_head). fast (where fused_projections): one matmul,
        the three weights concatenated here on every call, so the parameters and state-dict keys stay three Linears.
        Its output is split along its last dim, so the backward's concatenation of the three gradients is laid out
        as the matmul reads it: RoPE's backward writes into it directly, with no stacked copy to transpose."""
        H, dh = self.num_heads, self.d_head
        if not (self.fast and fused_projections(x)):
            return [p(x).unflatten(-1, (H, dh)) for p in (self.q_proj, self.k_proj, self.v_proj)]
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3 d_model, d_model)
        return [t.unflatten(-1, (H, dh)) for t in (x @ w.t()).split(H * dh, dim=-1)]

    def forward(self, x, token_positions=None, attn_mask=None, kv_cache=None):
        # x: (..., T, d_model); token_positions: (T,) or (..., T); attn_mask: bool (B, 1, T, T_total) or None = causal
        T = x.shape[-2]
        q, k, v = self._project(x)  # each (..., T, H, dh)
        if self.rope is not None:
            if token_positions is None:
                past = kv_cache.n if kv_cache is not None else 0
                if past + T > len(self.rope.cos):  # TransformerLM.forward checks a caller's; here, the module alone
                    raise ValueError(f"{past + T} positions, but RoPE holds max_seq_len={len(self.rope.cos)}.")
                token_positions = torch.arange(past, past + T, device=x.device)
            pos = token_positions.unsqueeze(-1)  # (..., T, 1): the same rotation for every head
            # complex RoPE: float32/64 only (no bfloat16 complex type), eager only (torch.compile emits no complex code)
            complex_ok = self.fast and q.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling()
            q, k = self.rope(q, pos, complex_ok), self.rope(k, pos, complex_ok)
        # Heads become a batch dim only now: rotated before, q and k keep x's (T, H) order in memory. On a GPU the
        # fast path's attention (cuDNN's) gives its output in that order too, so concatenating the heads below is a
        # view there; the plain path's softmax(...) @ V is in (H, T) order, and the concatenation copies it
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # (..., H, T, dh)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # section 7's KVCache: all so far, (B, H, T_total, d_head)
        if attn_mask is None and k.shape[-2] != T:
            raise ValueError("attn_mask is required when the KV cache holds earlier tokens.")
        if self.fast:  # the same refusal as the definition's: torch's SDPA would add a float mask to the scores
            _check_mask_dtype(attn_mask)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=attn_mask is None)
        else:  # causal unless told otherwise: True on and below the diagonal, so position i sees j <= i
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril() if attn_mask is None else attn_mask
            out = scaled_dot_product_attention(q, k, v, mask)
        out = out.transpose(-3, -2).flatten(-2)  # concat heads: (..., T, d_model)
        return self.output_proj(out)


# ----------------------------------------------------------------------------
# 6. Transformer block and language model

def _as_token_ids(ids):
    """The boundary check of token ids (forward and generate's prompts): integers only; a bool or uint8
    tensor would index the embedding as a mask. Only dtype is read (no host sync: the CPU does not wait for
    the GPU); int8/16 and the wider unsigned types become int64, since indexing takes int32 and int64 only."""
    if not isinstance(ids, torch.Tensor) or ids.dtype in (torch.bool, torch.uint8) \
            or ids.dtype.is_floating_point or ids.dtype.is_complex:
        got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"Token ids must be an integer tensor (int64 or int32), got {got}.")
    return ids if ids.dtype in (torch.int64, torch.int32) else ids.long()


def _check_positions_and_mask(B, H, T, S, positions, mask):
    """forward's checks of a caller's RoPE positions ((T,) or (B, T) ints) and mask (bool, 2-D to 4-D, broadcastable to
    (B, H, T, S); S: T, or with a cache its own), by dtype and shape: no host sync. fast=True's SDPA would add a float
    mask to the scores; a batch or head count of another size would fail deep in attention, in torch's words."""
    def what(t):
        return f"{t.dtype} of shape {tuple(t.shape)}" if torch.is_tensor(t) else type(t).__name__
    p, m = positions, mask
    if p is not None and not (torch.is_tensor(p) and p.dtype in (torch.int64, torch.int32) and p.shape[-1:] == (T,)
                              and (p.dim() == 1 or p.dim() == 2 and p.shape[0] in (1, B))):
        raise ValueError(f"token_positions must be integers of shape ({T},) or ({B}, {T}), got {what(p)}.")
    if m is not None and not (torch.is_tensor(m) and m.dtype == torch.bool and 2 <= m.dim() <= 4
                              and m.shape[-2] in (1, T) and m.shape[-1] in (1, S or m.shape[-1])
                              and all(n in (1, want) for n, want in zip(m.shape[:-2][::-1], (H, B)))):
        raise ValueError(f"attn_mask must be bool (True: may attend), of 2 to 4 dims broadcastable to ({B}, {H}, {T}, "
                         f"{S or 'keys'}), got {what(m)}.")


class TransformerBlock(nn.Module):
    """Pre-norm:  z = x + MHA(ln1(x));  y = z + FFN(ln2(z)).
    Ablations: post_norm gives z = ln1(x + MHA(x)), y = ln2(z + FFN(z)) (the original Transformer); no_norm drops
    ln1/ln2; silu_ffn uses the ungated W2 silu(W1 x)."""

    def __init__(self, d_model, num_heads, d_ff, rope=None, device=None, dtype=None, *,
                 no_norm=False, post_norm=False, silu_ffn=False, fast=False):
        super().__init__()
        # no_norm: nn.Identity stands in for RMSNorm (no parameters, no state-dict keys)
        self.ln1 = nn.Identity() if no_norm else RMSNorm(d_model, device=device, dtype=dtype, fast=fast)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, rope, device, dtype, fast=fast)
        self.ln2 = nn.Identity() if no_norm else RMSNorm(d_model, device=device, dtype=dtype, fast=fast)
        self.ffn = SwiGLU(d_model, d_ff, device, dtype, fast=fast, gated=not silu_ffn)
        self.post_norm = post_norm

    def forward(self, x, token_positions=None, attn_mask=None, kv_cache=None):  # (B, T, d_model)
        if self.post_norm:
            z = self.ln1(x + self.attn(x, token_positions, attn_mask, kv_cache))
            return self.ln2(z + self.ffn(z))
        z = x + self.attn(self.ln1(x), token_positions, attn_mask, kv_cache)
        return z + self.ffn(self.ln2(z))


class TransformerLM(nn.Module):
    """token ids (B, T) -> embeddings -> num_layers blocks -> ln_final -> lm_head -> logits (B, T, vocab).
    Ablations (keyword-only): no_norm, post_norm, silu_ffn (as in TransformerBlock; no_norm also drops ln_final), nope
    (no position information at all), tie_embeddings (lm_head.weight is token_embeddings.weight; both keys stay in
    the state dict, as in nanoGPT). fast=True selects fused kernels with identical parameters."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                 rope_theta=10000.0, device=None, dtype=None, *, no_norm=False, post_norm=False,
                 nope=False, silu_ffn=False, tie_embeddings=False, fast=False):
        super().__init__()
        sizes = dict(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                     num_layers=num_layers, num_heads=num_heads, d_ff=d_ff)
        for name, n in sizes.items():  # a 0 would build a model that fails far from here, or not at all
            check_count(name, n)
        check_positive("rope_theta", rope_theta)  # here too: nope builds no RoPE
        switches = dict(no_norm=no_norm, post_norm=post_norm, nope=nope, silu_ffn=silu_ffn,
                        tie_embeddings=tie_embeddings, fast=fast)
        if bad := [f"{k}={v!r}" for k, v in switches.items() if type(v) is not bool]:  # nope="no" is true
            raise ValueError(f"The ablations and fast are True or False, got {', '.join(bad)}.")
        d_head = head_dim(d_model, num_heads)  # RoPE refuses an odd one
        self.vocab_size, self.context_length = vocab_size, context_length
        self.token_embeddings = Embedding(vocab_size, d_model, device, dtype)
        self.rope = None if nope else RotaryPositionalEmbedding(rope_theta, d_head, context_length, device)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, self.rope, device, dtype, no_norm=no_norm,
                             post_norm=post_norm, silu_ffn=silu_ffn, fast=fast)
            for _ in range(num_layers))
        self.ln_final = nn.Identity() if no_norm else RMSNorm(d_model, device=device, dtype=dtype, fast=fast)
        self.lm_head = Linear(d_model, vocab_size, device, dtype)
        if tie_embeddings:
            # one matrix for both ends; std 1 (the embedding init) would make the first logits
            # ~sqrt(d_model) large, so the shared matrix takes the output layer's Linear init
            self.token_embeddings.weight = self.lm_head.weight

    def forward(self, token_ids, token_positions=None, attn_mask=None, kv_cache=None, *, head=True):
        # token_ids: (B, T) int64 or int32 -> logits (B, T, vocab_size); head=False: the normed hidden state
        # (B, T, d_model) lm_head would read, for a loss that applies the head itself (train.py's fused head)
        token_ids = _as_token_ids(token_ids)
        if token_ids.dim() != 2 or token_ids.numel() == 0:
            shape = tuple(token_ids.shape)
            raise ValueError(f"Token ids must have shape (batch, sequence) with at least one token, got {shape}.")
        T = token_ids.shape[-1]
        past = kv_cache[0].n if kv_cache is not None else 0
        if past + T > self.context_length:
            raise ValueError(f"Sequence of {past + T} tokens is longer than context_length={self.context_length}.")
        _check_positions_and_mask(token_ids.shape[0], self.layers[0].attn.num_heads, T,
                                  None if kv_cache is not None else T, token_positions, attn_mask)
        # Reading the ids (and a caller's RoPE positions and mask) back is a host sync (and a graph break:
        # torch.compile splits the model there); meta tensors (shape-only models, accounting.py's) have no values.
        if not torch.compiler.is_compiling() and token_ids.device.type != "meta":
            ends = [token_ids.min(), token_ids.max()]
            if token_positions is not None and self.rope is not None and token_positions.numel():
                ends += token_positions.to(token_ids.device).aminmax()
            if attn_mask is not None:  # a row with no key: NaN in the definition, zeros in fast=True's torch SDPA
                ends.append(attn_mask.to(token_ids.device).any(-1).all())
            lo, hi, *pos = torch.stack([e.long() for e in ends]).tolist()
            if attn_mask is not None and not pos.pop():
                raise ValueError("attn_mask has a query row that may attend to no key; leave each row one (itself).")
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"Token id {lo if lo < 0 else hi} is outside the vocabulary [0, {self.vocab_size}).")
            if pos and (pos[0] < 0 or pos[1] >= self.context_length):  # a negative one wrapped around RoPE's table
                raise ValueError(f"Token position {pos[0] if pos[0] < 0 else pos[1]} is outside [0, "
                                 f"context_length={self.context_length}).")
        return self._run(token_ids, token_positions, attn_mask, kv_cache, head)

    def _run(self, token_ids, token_positions, attn_mask, kv_cache, head=True):
        """The forward pass past forward's checks; generate's fast decode step calls it directly (the ids are
        the model's own samples, the cache's columns its own)."""
        x = self.token_embeddings(token_ids)  # (B, T, d_model)
        for i, layer in enumerate(self.layers):
            x = layer(x, token_positions, attn_mask, None if kv_cache is None else kv_cache[i])
        return self.lm_head(self.ln_final(x)) if head else self.ln_final(x)


# ----------------------------------------------------------------------------
# 7. Generation

class KVCache:
    """One layer's keys and values so far: (B, H, context_length, d_k) buffers allocated on
    first use and filled left to right; `n` counts the filled positions."""

    def __init__(self, context_length):
        self.context_length, self.n, self.k, self.v = context_length, 0, None, None

    def append(self, k, v):  # k, v: (B, H, T, d_k) -> all keys / values so far (B, H, n, d_k)
        B, H, T, d = k.shape
        if self.k is None:
            self.k, self.v = (t.new_empty(B, H, self.context_length, d) for t in (k, v))
        if (B, H, d) != (held := (self.k.shape[0], self.k.shape[1], self.k.shape[3])):  # (else broadcast)
            raise ValueError(f"The KV cache holds (batch, heads, d_k) = {held}, "
                             f"got {(B, H, d)}: use a new cache for another batch.")
        self.k[:, :, self.n:self.n + T] = k
        self.v[:, :, self.n:self.n + T] = v
        self.n += T
        return self.k[:, :, :self.n], self.v[:, :, :self.n]


def _probs(logits, temperature, top_p):
    """logits (B, V) -> the probabilities sampled from (B, V): top-p keeps the smallest set of most
    likely tokens whose probabilities add up to at least top_p."""
    # the gaps to the top logit, <= 0: a tiny temperature makes them -inf (probability 0), not inf - inf = NaN; one
    # below float32's smallest normal number would round to 0 as a float32 scalar (0 / 0 = NaN)
    z = logits.float()
    probs = softmax((z - z.amax(-1, keepdim=True)) / max(temperature, torch.finfo(z.dtype).tiny), dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        # keep a token if the tokens ranked above it hold less than top_p (so the top token always stays)
        keep = (sorted_p.cumsum(-1) - sorted_p) < max(top_p, torch.finfo(z.dtype).tiny)  # a tinier one: 0 in float32
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
    return probs


def _sample(logits, temperature, top_p, generator, on_device=False):
    """logits (B, V) -> next ids (B,). temperature 0 is greedy. on_device: without a host sync. torch.multinomial
    draws one sample as argmax(p / q), q ~ Exp(1), after reading p back to check it; written out, the draw takes the
    same numbers from the generator."""
    if temperature == 0:
        return logits.argmax(-1)
    p = _probs(logits, temperature, top_p)
    if on_device:
        return (p / torch.empty_like(p).exponential_(1, generator=generator)).argmax(-1)
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)


def _positions(valid):
    """RoPE positions (B, S) of left-padded rows (valid (B, S), False at padding): they count real tokens
    only, so each row's first real token is position 0."""
    return (valid.long().cumsum(-1) - 1).clamp(min=0)


def _attention_mask(valid, T):
    """Mask (B, 1, T, S) for the last T of S positions as queries (the first S - T are cached),
    with left padding. valid: (B, S) bool, False at padding. Query i may see key j <= i if j is a
    real token; a padding query also sees itself, since an empty row is NaN and NaN * 0 poisons real rows."""
    k_pos = torch.arange(valid.shape[1], device=valid.device)  # (S,)
    q_pos = k_pos[-T:, None]  # (T, 1)
    return (((k_pos <= q_pos) & valid[:, None, :]) | (k_pos == q_pos))[:, None]  # (B, 1, T, S)


def _prompt_rows(prompt):
    """generate's prompt -> (its rows, 1-D tensors; is it a batch?). Text, or what is not ids (None, [[1, 2], 3], an id
    past int64, a 0-d tensor), in one sentence, not in torch's words from deep down."""
    text = (str, bytes, bytearray)  # a prompt as text (a str, or its UTF-8 bytes) would be read as a list of characters
    if isinstance(prompt, text) or isinstance(prompt, (list, tuple)) and any(isinstance(p, text) for p in prompt):
        raise ValueError(f"generate takes token ids, not text ({type(prompt).__name__}): encode the prompt first with "
                         "tokenizer.encode(text), and turn the new ids back into text with tokenizer.decode(ids).")
    try:  # a batch: rows that are lists, tuples, or 1-D tensors / arrays (a (B, T) tensor, as forward takes, is rows)
        batched = len(prompt) > 0 and (isinstance(prompt[0], (list, tuple)) or getattr(prompt[0], "ndim", 0) > 0)
        rows = [torch.tensor(list(p)) for p in prompt] if batched else [torch.tensor(list(prompt))]
        if any(row.dim() != 1 for row in rows):  # rows of rows
            raise TypeError
        # uint8 rows (a byte-level model's np.frombuffer(b"...", np.uint8)) are ids, where forward's uint8 is a mask
        rows = [row.long() if row.dtype == torch.uint8 else row for row in rows]
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"generate's prompt must be a list of ints, a list of such lists, or a 1-D or 2-D integer "
                        f"tensor, got {prompt!r:.80}.") from None
    return rows, batched


def _check_generate(model, prompts, max_new_tokens, temperature, top_p, stop_id, generator, device):
    """generate's arguments, each refused in one sentence before any work -> temperature and top_p as floats (a
    Fraction or a Decimal divides no tensor), stop_id (a 0-d tensor's as an int)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("Each prompt needs at least one token.")
    check_count("max_new_tokens", max_new_tokens, least=0)
    numeric = all(isinstance(x, (numbers.Real, decimal.Decimal))  # not None, "0.8", 1j, [0.5, 1]
                  or torch.is_tensor(x) and x.numel() == 1 and not x.is_complex() for x in (temperature, top_p))
    t, p = (float(temperature), float(top_p)) if numeric else (None, None)
    if not (numeric and math.isfinite(t) and t >= 0 and 0 < p <= 1):  # NaN fails every test
        raise ValueError(f"Need a finite temperature >= 0 and 0 < top_p <= 1, got temperature={temperature!r}, "
                         f"top_p={top_p!r}.")
    if torch.is_tensor(stop_id) and stop_id.dim() == 0 and stop_id.dtype != torch.bool \
            and not (stop_id.dtype.is_floating_point or stop_id.dtype.is_complex):
        stop_id = stop_id.item()  # a 0-d integer tensor (ids[-1], logits.argmax()) is an id, compared as an int
    if stop_id is not None:  # a list (what tokenizer.encode returns) or an id past the vocabulary would stop no row
        check_count("stop_id", stop_id, least=0, below=model.vocab_size)
    if generator is not None and not isinstance(generator, torch.Generator):  # a seed: multinomial's TypeError
        raise TypeError(f"generator must be a torch.Generator, got {generator!r}: torch.Generator({device.type!r})"
                        ".manual_seed(seed) makes one.")
    if generator is not None and generator.device.type != device.type:  # torch's words, at the first draw
        raise ValueError(f"generator is on {generator.device}, the model on {device}: make it with "
                         f"torch.Generator({device.type!r}).")
    return t, p, stop_id


@torch.no_grad()  # no autograd graph: the KV cache would keep every step's activations alive
def generate(model, prompt, max_new_tokens, temperature=1.0, top_p=1.0, stop_id=None,
             use_cache=True, generator=None, fast=None, compile=True):
    """Complete `prompt` with up to max_new_tokens sampled tokens (temperature=0: greedy).
    prompt: list[int] -> list[int] of new tokens, or list[list[int]] (left-padded, padding masked out) -> list of
    lists. A row stops after producing stop_id, which is not returned.
    use_cache=False is the reference: each step re-runs the last context_length tokens.
    use_cache=True runs the prompt once (prefill), then one token per step against the cached keys/values; once the
    context is full the window slides and RoPE positions shift, so it re-runs the window like the reference.
    fast (default: on CUDA, with the cache) runs the cached part as section 8 does: the same tokens;
    compile=False runs its decode step eagerly."""
    prompts, batched = _prompt_rows(prompt)
    device, C, B = next(model.parameters()).device, model.context_length, len(prompts)
    temperature, top_p, stop_id = _check_generate(model, prompts, max_new_tokens, temperature, top_p, stop_id,
                                                  generator, device)
    L = max(len(p) for p in prompts)  # ids (B, L) left-padded with token 0; valid (B, L) False at padding
    ids, valid = (torch.zeros(B, L, dtype=dtype, device=device) for dtype in (torch.long, torch.bool))
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = _as_token_ids(p)  # floats or bools refused, not cast
        valid[b, L - len(p):] = True
    pad_end = L - min(len(p) for p in prompts)  # columns [0, pad_end) hold padding in some row
    # no model.eval(): the model has no dropout, so its train and eval modes compute the same
    out, done, cache, n = [[] for _ in range(B)], [False] * B, None, 0
    if (device.type == "cuda" if fast is None else fast) and use_cache and L < C and max_new_tokens:
        n = min(max_new_tokens, C - L + 1)  # the tokens while the context has room; then the loop's re-runs
        with _STATIC_LOCK:
            ids, valid, out, done = _generate_static(model, ids, valid, n, temperature, top_p, stop_id, generator,
                                                     compile)
    for _ in range(0 if all(done) else max_new_tokens - n):
        # cached: one new position attends to everything cached so far; else the reference forward
        # on the last C columns (the prefill, or, with the context full, a plain re-run of the window)
        cached = use_cache and cache is not None and cache[0].n < C
        if not cached:
            cache = [KVCache(C) for _ in model.layers] if use_cache and ids.shape[1] < C else None
        T, w_valid = (1 if cached else min(ids.shape[1], C)), valid[:, -C:]
        pos = _positions(w_valid)[:, -T:]
        # no mask once a re-run's window is past all padding (known on the host: no GPU sync)
        mask = None if not cached and ids.shape[1] - T >= pad_end else _attention_mask(w_valid, T)
        logits = model(ids[:, -T:], pos, mask, cache)[:, -1]
        nxt = _sample(logits, temperature, top_p, generator)  # (B,)
        # two host syncs per step, whatever B: this tolist() and forward's token-id check
        for b, t in enumerate(nxt.tolist()):
            done[b] = done[b] or t == stop_id
            if not done[b]:
                out[b].append(t)
        if all(done):
            break
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        valid = torch.cat([valid, torch.ones(B, 1, dtype=torch.bool, device=device)], dim=1)
    return out if batched else out[0]


# ----------------------------------------------------------------------------
# 8. generate's fast path (the default on CUDA): a static cache, a compiled decode step, sampling on the device
#
# Decoding one token is a few small matmuls per layer: on a GPU its time goes to launching kernels and to
# the host waiting for the GPU, not to arithmetic. So, as pytorch-labs/gpt-fast does: the cache is
# preallocated and written at a position tensor, the decode step is compiled whole (on CUDA replayed as a
# CUDA graph: one launch per token), and the next token is drawn on the device, the stop flags read back
# once every STOP_CHECK_EVERY tokens. The cache and the compiled step live in the engine, fast_gpu.py. The tokens
# are the plain path's (the tests check it).

STOP_CHECK_EVERY = 8  # tokens between the fast path's looks at the stop flags (each a host sync): bench.py gpu tries 1-32
_STATIC_CACHES = weakref.WeakKeyDictionary()  # model -> its StaticKVCaches, reused: a CUDA graph keeps their addresses
_STATIC_LOCK = threading.Lock()  # one generate at a time in the caches and the graph: a server's threads share them


def _generate_static(model, ids, valid, n, temperature, top_p, stop_id, generator, compile):
    """generate's first n <= C - L + 1 tokens, fast. ids, valid: (B, L) left-padded prompts, L < C
    -> ids and valid (B, L + n), and each row's new tokens (cut at its stop) and whether it stopped."""
    (B, L), C = ids.shape, model.context_length
    caches = _STATIC_CACHES.setdefault(model, [fast_gpu.StaticKVCache(C) for _ in model.layers])
    for c in caches:
        c.slots = torch.arange(L, device=ids.device)
        if c.k is not None and c.k.is_inference() != torch.is_inference_mode_enabled():  # torch.inference_mode's
            c.k = None  # tensors, which only that mode may write (a generate outside it would fail): made again
    prompt_mask = _attention_mask(valid, L)  # (B, 1, L, L): the prefill, at the prompt's length, eager
    mask = torch.cat([prompt_mask, prompt_mask.new_zeros(B, 1, L, C - L)], -1)
    logits = model(ids, _positions(valid), mask, caches)[:, -1]
    pad = L - valid.sum(-1, keepdim=True)  # (B, 1)
    full = torch.cat([valid, valid.new_ones(B, C - L)], 1)  # (B, C)
    slot = torch.full((1,), L - 1, device=ids.device)  # moved on in place before each step
    for c in caches:
        c.slots = slot
    step, graphs = (fast_gpu.compiled_step(ids.device.type), ids.is_cuda) if compile else (fast_gpu.decode_step, False)
    new, done = ids.new_zeros(B, n), torch.zeros(B, dtype=torch.bool, device=ids.device)
    for i in range(n):
        if i:
            slot += 1
            if graphs:  # the last step's logits, in the graph's memory, are spent
                torch.compiler.cudagraph_mark_step_begin()
            tok = new[:, i - 1:i].clone(memory_format=torch.contiguous_format)  # batch 1: not new's stride (a guard)
            try:  # fullgraph past dynamo's graph limit (batch sizes x dtypes x model shapes): this call runs eagerly
                logits = step(model, caches, tok, full, pad)
            except fast_gpu.graph_limit_hit():
                step, graphs, logits = fast_gpu.decode_step, False, fast_gpu.decode_step(model, caches, tok, full, pad)
        new[:, i] = _sample(logits, temperature, top_p, generator, on_device=True)
        if stop_id is not None:
            done |= new[:, i] == stop_id
            if (i + 1) % STOP_CHECK_EVERY == 0 and done.all():  # the one host sync in k tokens
                break
    rows = new.tolist()  # each row cut at its stop, as generate's loop does (after a break, all have stopped)
    done = [stop_id in row for row in rows]
    rows = [row[:row.index(stop_id)] if d else row for row, d in zip(rows, done)]
    return torch.cat([ids, new], 1), torch.cat([valid, valid.new_ones(B, n)], 1), rows, done
