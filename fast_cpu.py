"""The CPU engine of the training step's fast path: numba kernels that model.py (fast=True) and optim.py
(cross_entropy, clip_grad_norm and AdamW with fused=True) call at one visible place each, for float32 CPU tensors.
Each is tested against the lecture's plain definition in test_all.py (values and gradients).

The lessons it embodies:
  1. A CPU step's elementwise work is bound by memory, not arithmetic. Eager PyTorch makes one pass over
     memory per op: SwiGLU's silu(a) * b is two passes forward and three back, RMSNorm's six ops are six
     passes, AdamW's eight _foreach ops eight. Here each forward and each backward is one loop over its
     tensors: every number is read once and written once.
  2. Work row by row where a reduction meets elementwise work. A row of RMSNorm (d_model floats) or of the
     logits (vocab_size floats) fits in the core's cache, so the row's sum and the pass that uses it read
     memory once between them.
  3. numba vectorizes a loop only when everything in it is inlined, and math.exp is a call into the C
     library, one number at a time. So exp is written here (_exp32: Cody and Waite's range reduction and
     Cephes' polynomial, within a few float32 roundings of the true value) and inlined into each loop.
  4. The loops sum in any order (fastmath's "reassoc": the sums vectorize), so results differ from torch's in
     the last bits; NaN and infinity still propagate (no "nnan"/"ninf"), which the loop's check of the loss
     relies on.
  5. numba runs on as many threads as torch uses (OMP_NUM_THREADS, torch.set_num_threads, a taskset), so the two
     never ask for more cores than a run was given; starting numba's threads must not change torch's (_threads).
Under NUMBA_DISABLE_JIT=1 (numba's switch for stepping through its functions in pdb) the loops would be plain
Python, where an @intrinsic cannot run: there no tensor is usable, and the plain code computes every step.
"""
import numba
import numpy as np
import torch
from numba import types
from numba.extending import intrinsic

F32 = np.float32
FASTMATH = {"reassoc", "contract", "arcp"}  # vectorized sums and fused multiply-adds; NaN and inf kept
ELEMENTWISE = FASTMATH - {"reassoc"}  # no sums to vectorize, and a reordered silu(a) * b overflowed: (a b) / e^-a
JIT = not numba.config.DISABLE_JIT  # numba compiles (see the top)
BLOCKS = 16  # RMSNorm's weight gradient and the gradients' norm are summed in this many blocks: a fixed number, so
# the same bits on any number of threads (a resumed run is bitwise the uninterrupted one), and work for up to 16 threads


def usable(*tensors, in_place=False):
    """May these tensors take the kernels? float32, on the CPU, outside torch.compile (which fuses on its own), and
    numba compiles (JIT); in_place (AdamW, the clip: the loop writes into the tensors' own memory): contiguous too."""
    return JIT and not torch.compiler.is_compiling() and all(t.device.type == "cpu" and t.dtype == torch.float32
                                                             and (t.is_contiguous() or not in_place) for t in tensors)


_numba_started = False  # numba's threads are started, and torch's count was kept


def _threads():
    """numba on as many threads as torch uses. numba's OpenMP layer starts its threads (once, at its first parallel
    compile or call) by setting the OpenMP runtime it shares with torch to NUMBA_NUM_THREADS, all the cores: torch's
    count, which OMP_NUM_THREADS, torch.set_num_threads or a taskset gave, was lost, and `experiments.py --jobs 2`
    ran 4 busy threads on 2 cores. So they are started here, before any kernel, and torch's count is put back."""
    global _numba_started
    n = torch.get_num_threads()
    if not _numba_started:
        numba.get_num_threads()  # starts numba's threads (its OpenMP, TBB or own layer)
        torch.set_num_threads(n)
        _numba_started = True
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def _np(t):  # a float32 CPU tensor -> a numpy view of the same memory (contiguous first)
    return t.detach().contiguous().numpy()


def _no_second_derivative(flag="model.py's fast=False"):  # cross_entropy's: optim's fused=False
    if torch.is_grad_enabled():  # create_graph=True: a hand-written gradient has no derivative of its own
        raise ValueError(f"The fast CPU kernels have no second derivative; use {flag} with create_graph.")


# ----------------------------------------------------------------------------
# exp, vectorizable

@intrinsic
def _bits_as_float32(typingctx, bits):
    """An int32's bits read as a float32 (no conversion): how 2^n is built, n in [-126, 127]."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.int32), codegen


@numba.njit(inline="always", fastmath=FASTMATH)
def _exp32(x):
    """e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2 (ln 2 in two parts, so r keeps its digits);
    e^r by a degree-7 polynomial. x is clamped to [-88, 89], where n runs from -127 to 128: those two 2^n are
    the bits of 0 and of inf, so e^x is 0 below -87.7 (a subnormal, which a CPU run flushes) and inf from 88.4
    on, as torch's exp gives past 88.7 (a clamp at 88 made silu(-3e38) -1.8, not -0). NaN stays NaN."""
    y = min(max(x, F32(-88.0)), F32(89.0))
    n = np.floor(y * F32(1.44269504) + F32(0.5))
    r = y - n * F32(0.693359375) + n * F32(2.12194440e-4)
    p = F32(1.9875691500e-4)
    p = p * r + F32(1.3981999507e-3)
    p = p * r + F32(8.3334519073e-3)
    p = p * r + F32(4.1665795894e-2)
    p = p * r + F32(1.6666665459e-1)
    p = p * r + F32(5.0000001201e-1)
    p = p * r * r + r + F32(1.0)
    e = p * _bits_as_float32(np.int32((np.int32(n) + 127) << 23))
    return x if x != x else e


# ----------------------------------------------------------------------------
# SwiGLU's gate: silu(a) * b

@numba.njit(parallel=True, fastmath=ELEMENTWISE, cache=True)
def _gate_forward(a, b, out):
    for i in numba.prange(a.size):
        out[i] = a[i] / (F32(1) + _exp32(-a[i])) * b[i]


@numba.njit(parallel=True, fastmath=ELEMENTWISE, cache=True)
def _gate_backward(g, a, b, da, db):
    """d/db = g silu(a);  d/da = g b s (1 + a (1 - s)), s = sigmoid(a): silu'(a) = s + a s (1 - s)."""
    for i in numba.prange(a.size):
        s = F32(1) / (F32(1) + _exp32(-a[i]))
        db[i] = g[i] * a[i] * s
        da[i] = g[i] * b[i] * s * (F32(1) + a[i] * (F32(1) - s))


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):  # a, b: the same shape
        a, b = a.contiguous(), b.contiguous()
        out = torch.from_numpy(np.empty(a.shape, np.float32))  # np.empty: deterministic mode would fill torch's
        _threads()
        _gate_forward(_np(a).reshape(-1), _np(b).reshape(-1), out.numpy().reshape(-1))
        ctx.save_for_backward(a, b)
        return out

    @staticmethod
    def backward(ctx, g):
        _no_second_derivative()
        a, b = ctx.saved_tensors
        da, db = (torch.from_numpy(np.empty(a.shape, np.float32)) for _ in range(2))
        _threads()
        _gate_backward(*(_np(t).reshape(-1) for t in (g, a, b, da, db)))
        return da, db


def silu_gate(a, b):
    """silu(a) * b (model.py's SwiGLU between its matmuls), one pass forward and one back."""
    if a.shape != b.shape:  # the loops read both at one index: broadcast as the plain product does (or refuse)
        a, b = torch.broadcast_tensors(a, b)
    return _Gate.apply(a, b)


# ----------------------------------------------------------------------------
# RMSNorm

@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _rms_forward(x, w, eps, y, rstd):
    n, d = x.shape
    for i in numba.prange(n):
        s = F32(0)
        for j in range(d):
            s += x[i, j] * x[i, j]
        ms = s / F32(d) + eps  # inf (an inf, or squares past float32): r = 0, not fastmath's NaN for 1 / sqrt(inf)
        r = F32(1) / np.sqrt(ms) if ms != np.inf else F32(0)
        rstd[i] = r
        for j in range(d):
            y[i, j] = x[i, j] * r * w[j]


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _rms_backward(g, x, w, rstd, dx, dw_parts):
    """y_j = x_j r w_j, r = (mean x^2 + eps)^-1/2:  dx_j = r g_j w_j - x_j r^3 / d * sum_k g_k w_k x_k;
    dw_j = sum over rows of g_j x_j r, each thread summing its block of rows into its own line of dw_parts."""
    n, d = x.shape
    parts = dw_parts.shape[0]
    for c in numba.prange(parts):
        for i in range(c * n // parts, (c + 1) * n // parts):
            r, dot = rstd[i], F32(0)
            for j in range(d):
                dot += g[i, j] * w[j] * x[i, j]
                dw_parts[c, j] += g[i, j] * x[i, j] * r
            k = dot * r * r * r / F32(d)
            for j in range(d):
                dx[i, j] = r * g[i, j] * w[j] - x[i, j] * k


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):  # x (..., d), weight (d,)
        x2 = x.contiguous().view(x.shape[:-1].numel(), x.shape[-1])  # -1 fails where d is 0
        y, rstd = np.empty(x2.shape, np.float32), np.empty(x2.shape[0], np.float32)
        _threads()
        _rms_forward(_np(x2), _np(weight), F32(eps), y, rstd)
        ctx.save_for_backward(x2, weight, torch.from_numpy(rstd))
        return torch.from_numpy(y).view(x.shape)

    @staticmethod
    def backward(ctx, g):
        _no_second_derivative()
        x2, weight, rstd = ctx.saved_tensors
        dx = np.empty(x2.shape, np.float32)
        _threads()
        dw_parts = np.zeros((BLOCKS, x2.shape[1]), np.float32)
        _rms_backward(_np(g).reshape(x2.shape), _np(x2), _np(weight), _np(rstd), dx, dw_parts)
        return torch.from_numpy(dx).view(g.shape), torch.from_numpy(dw_parts.sum(0)), None


def rms_norm(x, weight, eps):
    """model.py's RMSNorm: x / sqrt(mean(x^2) + eps) * weight over the last dimension, one pass each way."""
    if weight.shape != x.shape[-1:]:  # the loop reads weight[j] for each of x's last dimension: no reads past its end
        raise ValueError(f"RMSNorm's weight of shape {tuple(weight.shape)} does not fit x of shape {tuple(x.shape)}.")
    return _RMSNorm.apply(x, weight, eps)


# ----------------------------------------------------------------------------
# Cross-entropy

@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _ce_forward(o, m, targets, lse, loss):
    """Per row: lse = m + log sum_j e^(o_j - m) (m: the row's max, from torch, which keeps NaN), loss = lse - o_t.
    A target outside [0, V) gives a loss of -1 as a flag (a real loss is >= 0), and no read out of bounds."""
    n, v = o.shape
    for i in numba.prange(n):
        s = F32(0)
        for j in range(v):
            s += _exp32(o[i, j] - m[i])
        lse[i] = m[i] + np.log(s)
        t = targets[i]
        loss[i] = lse[i] - o[i, t] if 0 <= t < v else F32(-1)


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _ce_backward(o, lse, targets, scale, g):
    """g = (softmax(o) - onehot(t)) * scale, row by row, reading the logits once and writing g once."""
    n, v = o.shape
    for i in numba.prange(n):
        for j in range(v):
            g[i, j] = _exp32(o[i, j] - lse[i]) * scale
        g[i, targets[i]] -= scale


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # (N, V) float32, (N,) int64 -> the mean loss
        logits = logits.contiguous()
        m = logits.amax(dim=-1)  # (N,): one vectorized pass (a max does not vectorize in numba without "nnan")
        lse, loss = np.empty(len(logits), np.float32), np.empty(len(logits), np.float32)
        _threads()
        _ce_forward(_np(logits), _np(m), targets.contiguous().numpy(), lse, loss)
        if (loss == -1).any():  # numpy: not a torch op, so no sync shows where none is wanted (a CPU has none)
            bad = targets[torch.from_numpy(loss == -1)][0].item()
            raise ValueError(f"target id {bad} is outside the {logits.shape[1]} classes of the logits.")
        ctx.save_for_backward(logits, torch.from_numpy(lse), targets)
        return torch.from_numpy(loss).mean()

    @staticmethod
    def backward(ctx, grad):
        _no_second_derivative("cross_entropy(fused=False)")
        logits, lse, targets = ctx.saved_tensors
        g = np.empty(logits.shape, np.float32)
        _threads()
        _ce_backward(_np(logits), _np(lse), targets.numpy(), F32(_np(grad) / len(logits)), g)
        return torch.from_numpy(g), None


def cross_entropy(logits, targets):
    """optim.cross_entropy(fused=True)'s loss on (N, V) float32 CPU logits: two passes forward (the row max,
    then the log-sum-exp), none of (N, V) written; one pass back."""
    if targets.shape != logits.shape[:1] or targets.dtype not in (torch.int64, torch.int32):  # the loop's reads
        raise ValueError(f"targets must be {len(logits)} int64 or int32 ids, got {targets.dtype} of shape "
                         f"{tuple(targets.shape)}.")
    return _CrossEntropy.apply(logits, targets)


# ----------------------------------------------------------------------------
# Gradient clipping

@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _sum_of_squares(g):  # in float64: 22M float32 squares summed in float32 would lose digits
    n, parts = g.size, np.zeros(BLOCKS)  # (a prange reduction sums one part per thread: bits that vary with them)
    for c in numba.prange(BLOCKS):
        block, s = g[c * n // BLOCKS:(c + 1) * n // BLOCKS], 0.0  # (a slice: indices from 0 up, which vectorize)
        for i in range(block.size):
            s += np.float64(block[i]) * block[i]
        parts[c] = s
    return parts


@numba.njit(parallel=True, fastmath=FASTMATH, cache=True)
def _scale(g, c):
    for i in numba.prange(g.size):
        g[i] *= c


def clip_grad_norm(grads, max_l2_norm, eps):
    """optim.clip_grad_norm for float32 CPU gradients: one pass to sum the squares, and one to scale them when the
    norm is at least max_l2_norm -> the norm, a 0-dim float32 tensor (a CPU has no device to wait for)."""
    _threads()
    flat = [g.view(-1).numpy() for g in grads]
    total = np.sqrt(sum(_sum_of_squares(g).sum() for g in flat))  # numpy's sums: numba's parallel=True would thread
    if total >= max_l2_norm:  # NaN is not: a diverged run's gradients stay as they are, as the plain code's
        for g in flat:
            _scale(g, F32(max_l2_norm / (total + eps)))
    return torch.tensor(total, dtype=torch.float32)


# ----------------------------------------------------------------------------
# AdamW

@numba.njit(parallel=True, error_model="numpy", cache=True)
def _adamw_one_pass(p, g, m, v, neg_a, decay, b1, c1, b2, c2, eps):
    """Algorithm 1 on one flat float32 tensor, reading and writing each element once: eager, the eight _foreach
    ops are eight passes over memory, and memory is what bounds a CPU's optimizer. The numbers come as float32
    (c1 = 1 - b1, c2 = 1 - b2), so nothing widens to float64; error_model="numpy" lets the loop vectorize."""
    for i in numba.prange(p.size):
        mi, vi = b1 * m[i] + c1 * g[i], b2 * v[i] + c2 * g[i] * g[i]
        m[i], v[i] = mi, vi
        p[i] = (p[i] + neg_a * mi / (np.sqrt(vi) + eps)) * decay


def adamw(params, grads, ms, vs, step_sizes, decay, b1, b2, eps):
    """optim._adamw_math for float32 CPU tensors, one _adamw_one_pass per tensor, on as many threads as torch uses."""
    _threads()
    numbers = [F32(x) for x in (decay, b1, 1 - b1, b2, 1 - b2, eps)]
    for p, g, m, v, a in zip(params, grads, ms, vs, step_sizes):
        _adamw_one_pass(*(t.detach().view(-1).numpy() for t in (p, g, m, v)), F32(a), *numbers)
