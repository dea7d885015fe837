"""
kernels.py: why kernels get fused, measured on GELU.

GELU with the tanh approximation (Hendrycks & Gimpel 2016), the activation of GPT-2:

    gelu(x) = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)

Every output needs one input and a handful of flops, so on a GPU the limit is not arithmetic
but moving bytes between memory (HBM) and the chip (a CPU core has far fewer flops per byte;
there the tanh itself can be the limit). The winning move is to read x once and write y once:
one fused kernel instead of one kernel, and one round trip through memory, per `*`, `+`, `tanh`.

The variants: PyTorch ops (one kernel per op), F.gelu, torch.compile of the ops, a hand-written
CUDA kernel (load_inline) and Triton if installed; each checked, timed against a copy, profiled.

Sections: 1. the variants, 2. the bytes each moves, 3. correctness against float64, 4. the benchmark,
5. the profile, 6. the command line.

    python kernels.py                      # everything, on CUDA if there is a GPU
    python kernels.py --device cpu --sizes 20 22 --json out/kernels.json
"""

import datetime
import functools
import inspect
import math
import os
import platform
import statistics
import sys
import timeit
from collections import Counter

import cli  # the standard library only, so it loads first: a Ctrl-C while torch loads is one line
if __name__ == "__main__":
    cli.quiet_while_starting("kernels.py")
import torch
import torch.nn.functional as F

import accounting
from cli import Parser, UsageError, end_quietly_on_closed_pipe, error_line, exit_code, quiet_stderr, user_path
from files import new_folders, unwritable, write_json
from machine import (cache_bytes, cuda_unavailable_reason, device_error, memory_bytes, one_thread_on_a_cpu,
                     quiet_cuda_home, usable_cores)

quiet_cuda_home()  # torch.compile's C++ build warns of CUDA_HOME on a machine with nvcc but no GPU: nothing to act on

try:  # optional: a Triton kernel is shown when Triton is installed (it ships with CUDA torch)
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# -----------------------------------------------------------------------------
# 1. The variants. Each takes x and returns a new tensor gelu(x) of the same dtype.

def gelu_torch_ops(x):
    # Variant 1. Eight ops (TORCH_OPS below), each one kernel that reads its inputs from
    # memory and writes its result back. Python evaluates `0.5 * x` first.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_builtin(x):
    # Variant 2. PyTorch's own fused kernel: one read, one write.
    return F.gelu(x, approximate="tanh")


def gelu_compiled(x):
    # Variant 3. torch.compile sees the eight ops as one graph and emits one fused kernel (Triton on
    # GPU, C++ on CPU), at the first call. dynamic=True: one compile per dtype, not one per size.
    return _compiled(gelu_torch_ops)(x)


@functools.cache
def _compiled(fn):  # made when first needed: torch.compile imports torch._dynamo, a second of start-up
    return torch.compile(fn, dynamic=True)


# Variant 4: a hand-written CUDA kernel. The tests compile exactly this string with nvcc (it
# needs no torch header, so no GPU either), and load_inline builds it too (exactly as written on torch 2.7+).
# Design, for an H100 (132 SMs):
#  - 16-byte loads and stores (float4, or 8 x bfloat16): a warp moves 512 contiguous bytes
#    per instruction, with 4x (8x) fewer memory instructions than one element per thread.
#  - grid-stride loop over one full wave of blocks, (#SMs) x (resident blocks per SM), so no
#    block waits for a second wave.
#  - compute in float32, round once on the store.
#  - 0.5 (1 + tanh(u)) == sigmoid(2u), so gelu(x) = x / (1 + exp(-2u)): one expf, one
#    division, and no cancellation in 1 + tanh(u) when u << 0.
#  - a scalar tail for the last n % VEC elements; VEC = 1 when a pointer is not 16-byte
#    aligned (a view such as x[1:]).
GELU_CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdint>

__device__ __forceinline__ float gelu_tanh_f32(float x) {  // x sigmoid(2u) = 0.5 x (1 + tanh(u))
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// VEC elements of T that load and store as one 16-byte instruction (like float4 / uint4).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename T, int VEC>
__global__ void gelu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
    using P = Pack<T, VEC>;
    constexpr int UNROLL = 2;  // two 16-byte loads in flight per thread before any math
    const int64_t n_vec = n / VEC;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    // thread tid handles packs tid, tid + stride, ...
    for (int64_t base = tid; base < n_vec; base += UNROLL * stride) {
        P p[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * stride < n_vec) p[u] = reinterpret_cast<const P*>(x)[base + u * stride];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < VEC; ++k) p[u].v[k] = from_f32<T>(gelu_tanh_f32(to_f32(p[u].v[k])));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * stride < n_vec) reinterpret_cast<P*>(y)[base + u * stride] = p[u];
    }
    for (int64_t i = n_vec * VEC + tid; i < n; i += stride)  // tail: fewer than VEC left
        y[i] = from_f32<T>(gelu_tanh_f32(to_f32(x[i])));
}

// ---- host side: launch configuration and the entry point ----
template <typename T, int VEC>
static cudaError_t launch(const void* x, void* y, int64_t n, cudaStream_t stream) {
    const int threads = 256;  // 8 warps per block
    int device = 0, sms = 0, blocks_per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, gelu_kernel<T, VEC>, threads, 0);
    int64_t needed = (n / VEC + threads - 1) / threads;  // small inputs need fewer blocks
    int64_t blocks = (int64_t)sms * (blocks_per_sm > 0 ? blocks_per_sm : 1);
    if (needed < blocks) blocks = needed > 0 ? needed : 1;
    gelu_kernel<T, VEC><<<(unsigned)blocks, threads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
    return cudaGetLastError();
}

// Host entry point, called by the C++ wrapper. Returns nullptr, or CUDA's error message.
const char* gelu_cuda_launch(const void* x, void* y, int64_t n, bool bf16, int device, int64_t stream_handle) {
    if (n == 0) return nullptr;
    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != device) cudaSetDevice(device);  // launch on the tensor's GPU
    cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
    const bool aligned = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) % 16) == 0;
    cudaError_t err;
    if (bf16) err = aligned ? launch<__nv_bfloat16, 8>(x, y, n, stream) : launch<__nv_bfloat16, 1>(x, y, n, stream);
    else      err = aligned ? launch<float, 4>(x, y, n, stream) : launch<float, 1>(x, y, n, stream);
    if (previous != device) cudaSetDevice(previous);
    return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
"""

# The C++ wrapper that load_inline turns into a Python function: checks the tensors, then launches.
GELU_CPP_SRC = r"""
#include <torch/extension.h>

const char* gelu_cuda_launch(const void* x, void* y, int64_t n, bool bf16, int device, int64_t stream_handle);

torch::Tensor gelu_out(torch::Tensor x, torch::Tensor out, int64_t stream_handle) {
    TORCH_CHECK(x.is_cuda(), "gelu_cuda: x must be a CUDA tensor, got one on ", x.device());
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16,
                "gelu_cuda: x must be float32 or bfloat16, got ", x.scalar_type());
    TORCH_CHECK(x.is_contiguous(), "gelu_cuda: x must be contiguous; pass x.contiguous()");
    TORCH_CHECK(out.device() == x.device() && out.scalar_type() == x.scalar_type() &&
                out.sizes() == x.sizes() && out.is_contiguous(),
                "gelu_cuda: out must be a contiguous tensor of x's shape, dtype and device");
    const char* err = gelu_cuda_launch(x.data_ptr(), out.data_ptr(), x.numel(),
                                       x.scalar_type() == torch::kBFloat16, x.get_device(), stream_handle);
    TORCH_CHECK(err == nullptr, "gelu_cuda: kernel launch failed: ", err);
    return out;
}
"""


@functools.cache
def build_cuda_extension():
    """Compile GELU_CUDA_SRC + GELU_CPP_SRC once (torch caches the build on disk; the first one is slow)."""
    from torch.utils.cpp_extension import load_inline
    # torch 2.7+ compiles our text exactly as written; older ones prepend their headers, which it also takes
    extra = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}
    return load_inline(name="kernels_gelu_cuda", cpp_sources=GELU_CPP_SRC, cuda_sources=GELU_CUDA_SRC,
                       functions=["gelu_out"], extra_cuda_cflags=["-O3"], **extra)


def gelu_cuda(x, out=None):
    # Variant 4. One launch; `out` may be given (the correctness check passes a NaN-filled one).
    out = torch.empty_like(x) if out is None else out
    return build_cuda_extension().gelu_out(x, out, torch.cuda.current_stream(x.device).cuda_stream)


if triton is not None:
    @triton.jit
    def _gelu_triton_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        # Triton programs work on a block of BLOCK elements at once; masks replace the tail.
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = x / (1.0 + tl.exp(-2.0 * u))  # = 0.5 x (1 + tanh(u)), as in the CUDA kernel
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu_triton(x):
    # Variant 5 (optional). Same math as the CUDA kernel, written per block, not per thread.
    if not x.is_contiguous():
        raise ValueError("gelu_triton needs a contiguous tensor")
    y = torch.empty_like(x)
    _gelu_triton_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def get_variants(device, log=print):
    """The variants that can run on `device`, in order; logs one line for each one skipped."""
    variants = {"torch ops": gelu_torch_ops, "F.gelu": gelu_builtin}
    on_cpu = None if device == "cuda" else "running on CPU; it needs a CUDA GPU"
    candidates = {"torch.compile": (gelu_compiled, None),
                  "CUDA kernel": (gelu_cuda, on_cpu or cuda_unavailable_reason()),
                  "Triton": (gelu_triton, on_cpu or (None if triton else "not installed; pip install triton"))}
    for name, (fn, reason) in candidates.items():
        try:  # one trial call builds what needs building (a C++ compiler, Triton or nvcc)
            if not reason:
                fn(torch.randn(1024, device=device))
                variants[name] = fn
        except Exception as e:  # compilers raise many types; all mean "not on this machine"
            reason = error_line(e)
        if reason:
            log(f"{name}: skipped ({reason})")
    return variants


# -----------------------------------------------------------------------------
# 2. Accounting: how many bytes each variant moves, and why that decides its speed.

# Variant 1's kernels in order: (op, flops per element, tensors read, tensors written). tanh counts
# as one flop here. accounting.ROOFLINE_COSTS["GELU"] takes the lecture's ~20 FLOPs per element
# (tanh as several); either count leaves GELU far below the ridge point, see below.
TORCH_OPS = [("0.5 * x", 1, 1, 1), ("x ** 3", 2, 1, 1), ("0.044715 * x3", 1, 1, 1), ("x + a", 1, 2, 1),
             ("sqrt(2/pi) * b", 1, 1, 1), ("tanh(c)", 1, 1, 1), ("1 + t", 1, 1, 1), ("h * g", 1, 2, 1)]
FLOPS_PER_ELEMENT = sum(op[1] for op in TORCH_OPS)          # 9, whichever way it is fused
UNFUSED_PASSES = sum(op[2] + op[3] for op in TORCH_OPS)      # 18 tensor reads + writes
FUSED_PASSES = 2                                             # read x, write y


def arithmetic_intensity(passes, bytes_per_element):
    return FLOPS_PER_ELEMENT / (passes * bytes_per_element)


def print_accounting():
    fp32 = accounting.PEAK_FLOPS["H100 SXM"]["fp32"]  # CUDA cores: what an elementwise kernel uses
    bw, fp32_bytes, bf16_bytes = accounting.H100_BYTES_PER_SEC, accounting.FP32_BYTES, accounting.BF16_BYTES
    ridge = accounting.accelerator_intensity(fp32, bw)
    bf16_ridge = accounting.accelerator_intensity(accounting.H100_BF16, bw)  # dense tensor cores: a matmul's
    print("\n== Accounting: bytes moved per element, arithmetic intensity (H100 SXM roofline)")
    print(f"torch ops: {len(TORCH_OPS)} kernels, {UNFUSED_PASSES} tensor passes per element "
          f"(" + ", ".join(op[0] for op in TORCH_OPS) + ")")
    print(f"fused (F.gelu, compile, CUDA, Triton): 1 kernel, {FUSED_PASSES} passes (read x, write y)")
    print(f"{'variant':<12} {'dtype':<9} {'bytes/elem':>10} {'FLOP/byte':>10} {'% of fp32 peak':>15}")
    for name, passes in (("torch ops", UNFUSED_PASSES), ("fused", FUSED_PASSES)):
        for dtype, size in (("float32", fp32_bytes), ("bfloat16", bf16_bytes)):
            ai, moved = arithmetic_intensity(passes, size), passes * size
            best = accounting.roofline_mfu(ai, ridge)
            print(f"{name:<12} {dtype:<9} {moved:>10} {ai:>10.3f} {best:>15.1%}")
    lo, hi = arithmetic_intensity(UNFUSED_PASSES, fp32_bytes), arithmetic_intensity(FUSED_PASSES, bf16_bytes)
    print(f"H100 accelerator intensity: {ridge:.0f} FLOP/byte for fp32 CUDA cores, {bf16_ridge:.0f} for bf16 "
          f"tensor cores. GELU sits at {lo:.3g}-{hi:.3g}: memory-bound, so its time is bytes / bandwidth,")
    fused_bytes = FUSED_PASSES * fp32_bytes * 2**28
    fused_gb, tb_per_sec, best_ms = fused_bytes / 1e9, bw / 1e12, fused_bytes / bw * 1e3
    fusion_gain = UNFUSED_PASSES // FUSED_PASSES  # the bytes unfused moves, over fused's
    print(f"e.g. 2^28 fp32 fused: {fused_gb:.2f} GB / {tb_per_sec:.2f} TB/s = {best_ms:.2f} ms at best; unfused moves "
          f"{fusion_gain}x the bytes, so fusion can win up to {fusion_gain}x.")


# -----------------------------------------------------------------------------
# 3. Correctness: compare with float64 on fresh random inputs, outputs poisoned.

KERNEL_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --dtypes: the two the CUDA kernel handles
REL_FLOOR = 1e-3  # relative error is reported where |gelu(x)| >= this; near 0 it means nothing


def random_input(n, dtype, device, generator):
    # N(0, 3^2): covers the curved part of GELU and both tails
    return (3 * torch.randn(n, generator=generator, device="cpu")).to(device=device, dtype=dtype)


def max_errors(y, x):
    """(max abs error, max relative error where |ref| >= REL_FLOOR) of y against float64."""
    if torch.isnan(y).any():  # an unwritten, poisoned element
        return math.nan, math.nan
    ref = gelu_torch_ops(x.double())  # float64's 2^-53 rounding is far below float32's 2^-24: the "true" value
    err = (y.double() - ref).abs()
    big = ref.abs() >= REL_FLOOR
    return err.max().item(), (err[big] / ref[big].abs()).max().item() if big.any() else 0.0


def check_variant(fn, dtype, device, n=(1 << 20) + 3):
    """Max abs / rel error of fn over an odd size (exercises the tail) and an unaligned view."""
    g = torch.Generator().manual_seed(0)
    errors = []
    for offset in (0, 1):  # offset 1: x[1:] is not 16-byte aligned
        x = random_input(n + offset, dtype, device, g)[offset:]
        # Fill the memory handed out next with NaN, so an element a variant forgets to write is
        # NaN, not a stale right value (CUDA's caching allocator hands these blocks straight back).
        [torch.full_like(x, math.nan) for _ in range(16)]
        y = gelu_cuda(x, out=torch.full_like(x, math.nan)) if fn is gelu_cuda else fn(x)  # ours: a poisoned out too
        if y.dtype != x.dtype or y.shape != x.shape:
            raise AssertionError(f"returned {y.dtype} {tuple(y.shape)} for {x.dtype} {tuple(x.shape)}")
        errors.append(max_errors(y, x))
    return tuple(torch.tensor(errors, dtype=torch.float64).amax(0).tolist())  # amax keeps a NaN; max() drops it


def run_correctness(variants, dtypes, device):
    print("\n== Correctness: max error against float64, fresh N(0, 9) inputs, NaN-poisoned outputs")
    print("(n = 2^20 + 3 and an unaligned view; rel err = |y - ref| / |ref|, which means nothing where ref nears 0)")
    print(f"{'variant':<14} {'dtype':<9} {'max abs err':>12}  max rel err where |gelu(x)| >= {REL_FLOOR:g}")
    rows = []
    for dname in dtypes:
        for name, fn in variants.items():
            a, r = check_variant(fn, KERNEL_DTYPES[dname], device)
            print(f"{name:<14} {dname:<9} {a:>12.3e}  {r:.3e}")
            rows.append({"variant": name, "dtype": dname, "max_abs_err": a, "max_rel_err": r})
    if worst := [r["max_rel_err"] for r in rows if (r["variant"], r["dtype"]) == ("torch ops", "bfloat16")]:
        print("torch ops in bfloat16 rounds each op's result: 1 + tanh(u), near 0 for x < -2, keeps tanh's rounding "
              f"error (2^-9 near -1), large against a small output: hence its max rel err {worst[0]:.0%}; the fused "
              "variants compute in float32 and round once.")
    return rows


# -----------------------------------------------------------------------------
# 4. Benchmark: median time, GB/s, % of copy bandwidth, speed-up over variant 1.

def time_ms(fn, x, reps, flush):
    """Median ms of fn(x) after 3 warm-up calls (CUDA events on a GPU, perf_counter on a CPU), each run after
    flush(), which evicts x from the caches: a size that fits in them would time the cache, not the memory."""
    for _ in range(3):
        fn(x)
    if x.is_cuda:
        events = [[torch.cuda.Event(enable_timing=True) for _ in "se"] for _ in range(reps)]
        for s, e in events:
            flush()
            s.record()
            fn(x)
            e.record()
        torch.cuda.synchronize()  # once, after all runs: the GPU never waits for Python
        times = [s.elapsed_time(e) for s, e in events]
    else:  # timeit's clock is time.perf_counter
        times = [1e3 * timeit.timeit(lambda: fn(x), setup=flush, number=1) for _ in range(reps)]
    return statistics.median(times)


def above_copy_note(pct):
    """A variant faster than the copy moves the same bytes faster than memory can: a figure that cannot be true
    unless the copy itself was slowed (another program's turn on the core), which the line then says."""
    return "" if pct <= 105 else "  <- faster than the copy: timing noise (another program ran); rerun on an idle machine"


def run_benchmark(variants, dtypes, log2_sizes, device, reps):
    """Time a plain copy and every variant at each size; returns one dict per (variant, dtype, n)."""
    # read more than the caches before each run: x starts in DRAM (and on a GPU, the GPU has work queued)
    flush = torch.ones(max(256 << 20 if device == "cuda" else 0, 4 * cache_bytes(device)) // 4, device=device).sum
    k = torch.get_num_threads()
    timer = "CUDA events" if device == "cuda" else f"time.perf_counter, {cli.counted(k, 'thread')}"
    print(f"\n== Benchmark: median of {cli.counted(reps, 'run')} ({timer}), GB/s counts the fused traffic "
          "2 x n x bytes (read x, write y); the copy is the bandwidth a kernel can reach")
    print(f"{'dtype':<9} {'n':>5} {'variant':<14} {'time ms':>10} {'GB/s':>9} {'% copy':>7} {'vs ops':>7}")
    rows = []
    g = torch.Generator().manual_seed(1)
    for dname in dtypes:
        for p in log2_sizes:
            x = random_input(1 << p, KERNEL_DTYPES[dname], device, g)
            timed = {"copy_": torch.empty_like(x).copy_} | variants
            ms = {name: time_ms(fn, x, reps, flush) for name, fn in timed.items()}
            copy_gbs = 2 * x.nbytes / ms["copy_"] / 1e6
            for name, t in ms.items():
                gbs = 2 * x.nbytes / t / 1e6
                row = {"variant": name, "dtype": dname, "log2_n": p, "n": 1 << p, "ms": t, "gb_s": gbs,
                       "copy_ms": ms["copy_"], "copy_gb_s": copy_gbs, "pct_copy": 100 * gbs / copy_gbs,
                       "speedup_vs_torch_ops": ms["torch ops"] / t}
                print(f"{dname:<9} 2^{p:<3} {name:<14} {t:>10.4f} {gbs:>9.1f} "
                      f"{row['pct_copy']:>6.1f}% {row['speedup_vs_torch_ops']:>6.2f}x{above_copy_note(row['pct_copy'])}")
                rows += [row] if name in variants else []  # the copy is in every row already
            del x, timed  # free x before the next size allocates
    return rows


def target_line(rows):
    """One summary line: the CUDA kernel at the largest fp32 size vs copy and F.gelu."""
    # by variant, its fp32 row of the largest size: a larger size comes later and overwrites a smaller
    at = {r["variant"]: r for r in sorted(rows, key=lambda r: r["log2_n"]) if r["dtype"] == "float32"}
    if "CUDA kernel" not in at:
        return None
    cuda, builtin = at["CUDA kernel"], at["F.gelu"]
    p, speedup = cuda["log2_n"], builtin["ms"] / cuda["ms"]
    return (f"CUDA kernel at 2^{p} fp32: {cuda['pct_copy']:.1f}% of copy bandwidth "
            f"({cuda['gb_s']:.0f} of {cuda['copy_gb_s']:.0f} GB/s), {speedup:.2f}x F.gelu")


# -----------------------------------------------------------------------------
# 5. Profile: the kernels (GPU) or top-level operators (CPU) behind one call.

def profile_launches(fn, x):
    """Counter of what one call of fn(x) runs: CUDA kernels on GPU, top-level ops on CPU."""
    from torch.profiler import profile
    fn(x)  # warm: compilation and lazy initialisation are not part of a call
    with quiet_stderr(), profile(acc_events=True) as prof:  # the CPU and any GPU; leaving it waits for the GPU
        fn(x)
    if x.is_cuda:
        return Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return Counter(e.name for e in prof.events() if e.cpu_parent is None and "Cache Lookup" not in e.name)


def run_profile(variants, device):
    what = "CUDA kernels" if device == "cuda" else "top-level CPU operators"
    print(f"\n== Profile: {what} launched by one call (torch.profiler, float32, n = 2^20)")
    x = random_input(1 << 20, torch.float32, device, torch.Generator().manual_seed(2))
    out = {}
    for name, fn in variants.items():
        launches = profile_launches(fn, x)
        out[name], n_launched = dict(launches), sum(launches.values())
        print(f"{name:<14} {n_launched:>3} launched")
        for k, c in launches.most_common():
            print(f"{'':<16}{c} x {k[:110]}")
    return out


# -----------------------------------------------------------------------------
# 6. Command line.

READ_BY = {"--sizes": ("benchmark",), "--reps": ("benchmark",), "--dtypes": ("correctness", "benchmark")}
PEAK_TENSORS = 5  # float32 tensors of n elements alive while timing: x, the copy's output, torch ops' temporaries


def parse_args(argv):
    ap = Parser(prog="kernels.py", description="GELU five ways, checked and measured against the copy bandwidth.")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="auto = cuda if a GPU is visible, else cpu")
    ap.add_argument("--sizes", type=int, nargs="+", metavar="LOG2N", choices=range(10, 31),
                    help="log2 of the element counts, 10..30 (default 20 22 24 26 28 on CUDA, 20 22 24 on CPU)")
    ap.add_argument("--dtypes", nargs="+", choices=list(KERNEL_DTYPES),
                    help="element types measured (default: all)")
    ap.add_argument("--reps", type=int, help="timed runs per measurement (default 100 on CUDA, 10 on CPU)")
    ap.add_argument("--threads", type=int, help="CPU threads for the timed runs, at most the usable cores "
                    "(default: 1: on a busy machine a parallel op times its wait for a core, not the memory)")
    ap.add_argument("--json", metavar="PATH", type=user_path, help="also write all results to this JSON file")
    ap.add_argument("--skip", nargs="+", default=[], choices=["correctness", "benchmark", "profile"],
                    help="sections to leave out")
    args = ap.parse_args(argv)
    for flag, readers in READ_BY.items():  # a flag no section left to run reads was dropped without a word
        if getattr(args, flag.removeprefix("--")) is not None and set(readers) <= set(args.skip):
            raise UsageError(f"{flag} is read by {' and '.join(readers)} only, which --skip leaves out; "
                             "drop one of them")
    for flag, value in (("--reps", args.reps), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.device == "cuda" and (why := device_error("cuda")):
        raise UsageError(f"--device cuda: {why}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.sizes = args.sizes or ([20, 22, 24, 26, 28] if args.device == "cuda" else [20, 22, 24])
    args.dtypes = args.dtypes or list(KERNEL_DTYPES)
    args.sizes, args.dtypes = (list(dict.fromkeys(x)) for x in (args.sizes, args.dtypes))  # each once, as given
    args.reps = args.reps or (100 if args.device == "cuda" else 10)
    need, (have, what) = PEAK_TENSORS * 4 << max(args.sizes), memory_bytes(args.device, 1)
    if need > have:
        raise UsageError(f"--sizes {max(args.sizes)}: 2^{max(args.sizes)} elements need about {need / 2**30:.1f} "
                         f"GiB, more than {what} ({have / 2**30:.1f} GiB); pass smaller --sizes")
    if args.json == "":  # abspath would make it the current directory
        raise UsageError("--json is empty; give the path of a file to write, such as kernels.json")
    if args.json is not None and (why := unwritable(args.json)):  # refused before minutes of measuring, not after
        raise UsageError(f"--json {args.json}{why}; pick another path")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(min(args.threads, usable_cores()))  # thousands of threads: OpenMP fails or segfaults
    started = datetime.datetime.now().isoformat(timespec="seconds")
    threads = torch.get_num_threads()  # the timed runs take one unless --threads is given (machine.one_thread_on_a_cpu)
    device = f"CPU ({platform.machine()}, timed on {threads if args.threads else 1} of {threads} threads)"
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else device
    print(f"kernels.py on {device}, torch {torch.__version__}, {started}")
    variants = get_variants(args.device)
    print("variants: " + ", ".join(variants))
    print_accounting()
    result = {"device": device, "torch": torch.__version__, "date": started,
              "argv": sys.argv[1:] if argv is None else list(argv), "variants": list(variants)}
    if "correctness" not in args.skip:
        result["correctness"] = run_correctness(variants, args.dtypes, args.device)
    if "benchmark" not in args.skip:
        with one_thread_on_a_cpu(args.device, args.threads):
            rows = result["benchmark"] = run_benchmark(variants, args.dtypes, args.sizes, args.device, args.reps)
        if line := target_line(rows):
            print("\n" + line)
            result["target"] = line
    if "profile" not in args.skip:
        result["profile"] = run_profile(variants, args.device)
    if args.json is not None:
        with new_folders(os.path.dirname(os.path.abspath(args.json))):  # a missing folder is made
            write_json(result, args.json)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    end_quietly_on_closed_pipe()
    cli.catch_ctrl_c()  # a stop from here on: KeyboardInterrupt, then one line (exit_code)
    cli.exit_quietly(exit_code("kernels.py", main, "nothing was left half-written."))
