"""Tests for kernels.py: the GELU variants against independent float64 oracles, the byte
accounting against what the dispatcher actually runs, the CLI, and the CUDA source against nvcc."""

import ctypes
import json
import math
import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernels


def _kernels_numpy_gelu(x):
    # Oracle: the tanh formula straight from the handout, in numpy float64.
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def test_kernels_reference_matches_numpy_and_sigmoid_identity():
    x = torch.linspace(-12, 12, 10001, dtype=torch.float64)
    ref = kernels.gelu_reference(x).numpy()
    # atol: for x < -7, 1 + tanh(u) cancels in float64 too (error ~4e-16), far below float32's
    np.testing.assert_allclose(ref, _kernels_numpy_gelu(x.numpy()), rtol=1e-14, atol=1e-15)
    # The CUDA and Triton kernels use 0.5 (1 + tanh u) == sigmoid(2u): check the identity.
    u = np.sqrt(2.0 / np.pi) * (x.numpy() + 0.044715 * x.numpy() ** 3)
    np.testing.assert_allclose(x.numpy() / (1.0 + np.exp(-2.0 * u)), ref, rtol=1e-12, atol=1e-15)


class _KernelsCountPasses(TorchDispatchMode):
    """Counts the aten ops that run and how many full-size tensors each reads and writes."""

    def __init__(self, n):
        super().__init__()
        self.n, self.ops, self.reads, self.writes = n, [], 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func))
        self.reads += sum(isinstance(a, torch.Tensor) and a.numel() == self.n for a in args)
        self.writes += isinstance(out, torch.Tensor) and out.numel() == self.n
        return out


def test_kernels_accounting_matches_what_runs():
    n = 4096
    x = torch.randn(n)
    with _KernelsCountPasses(n) as mode:
        kernels.gelu_torch_ops(x)
    assert len(mode.ops) == len(kernels.TORCH_OPS)
    assert mode.reads + mode.writes == kernels.UNFUSED_PASSES
    with _KernelsCountPasses(n) as mode:
        kernels.gelu_builtin(x)
    assert len(mode.ops) == 1 and mode.reads + mode.writes == kernels.FUSED_PASSES
    # Bytes follow from passes: fp32 fused GELU moves 2 x 4 bytes per element.
    assert kernels.arithmetic_intensity(2, 4) == pytest.approx(kernels.FLOPS_PER_ELEMENT / 8)


def test_kernels_roofline_fraction_is_classic_roofline():
    # Oracle: attainable FLOP/s = min(peak, intensity x bandwidth) (Williams et al. 2009).
    peak, bw = 67e12, 3.35e12
    for ai in (0.125, 1.125, 20.0, 100.0):
        attainable = min(peak, ai * bw)
        assert kernels.roofline_fraction(ai, peak, bw) * peak == pytest.approx(attainable)
    assert kernels.roofline_fraction(1.125, peak, bw) < 0.1  # GELU: memory-bound


def test_kernels_profile_counts_ops_on_cpu():
    x = torch.randn(1 << 12)
    assert sum(kernels.profile_launches(kernels.gelu_torch_ops, x).values()) == len(kernels.TORCH_OPS)
    assert dict(kernels.profile_launches(kernels.gelu_builtin, x)) == {"aten::gelu": 1}


@pytest.mark.parametrize("fn", [kernels.gelu_torch_ops, kernels.gelu_builtin], ids=["ops", "builtin"])
def test_kernels_cpu_variants_float32_and_bfloat16(fn):
    # float32: |x| < ~15 here, so a few float32 ulps (2^-20 at 16) is ~1e-6; allow 1e-5.
    a, r = kernels.check_variant(fn, torch.float32, "cpu", n=(1 << 16) + 3)
    assert a < 1e-5 and r < 1e-3
    a, r = kernels.check_variant(fn, torch.bfloat16, "cpu", n=(1 << 16) + 3)
    if fn is kernels.gelu_builtin:
        # computed in float32, rounded once to bfloat16 (8 significant bits): rel <= 2^-8
        assert r <= 2.0**-8 * (1 + 1e-3)
    else:
        # every op rounds to bfloat16; 1 + tanh(u) cancels to 0 for u < ~-2.8, rel error 1
        assert a < 0.1


def test_kernels_nan_poison_is_never_hidden():
    x = torch.randn(100)
    y = kernels.gelu_builtin(x)
    y[-1] = float("nan")  # an element a kernel forgot to write, in poisoned memory
    a, r = kernels.max_errors(y, x)
    assert math.isnan(a) and math.isnan(r)

    def forgets_last(x):
        y = torch.full_like(x, float("nan"))
        y[:-1] = kernels.gelu_builtin(x[:-1])
        return y

    a, r = kernels.check_variant(forgets_last, torch.float32, "cpu", n=1000)
    assert math.isnan(a) and math.isnan(r)


def test_kernels_cli_cpu_writes_json(tmp_path, capsys):
    out = tmp_path / "k.json"
    kernels.main(["--device", "cpu", "--sizes", "12", "--reps", "2", "--dtypes", "float32",
                  "--json", str(out)])
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "CUDA kernel: skipped" in printed
    names = res["variants"]
    assert names[:2] == ["torch ops", "F.gelu"]
    assert len(res["benchmark"]) == len(names)
    for row in res["benchmark"]:
        assert row["gb_s"] == pytest.approx(2 * 4 * 4096 / row["ms"] / 1e6)
    assert all(r["max_abs_err"] < 1e-5 for r in res["correctness"])
    assert sum(res["profile"]["torch ops"].values()) == len(kernels.TORCH_OPS)
    assert not [p for p in tmp_path.iterdir() if p.name != "k.json"]  # no temp file left


def test_kernels_compile_failure_is_one_line_not_a_crash(monkeypatch):
    def no_compiler():
        def fn(x):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\n  (long trace)")
        return fn
    monkeypatch.setattr(kernels, "make_gelu_compiled", no_compiler)
    lines = []
    variants = kernels.get_variants("cpu", log=lines.append)
    assert list(variants) == ["torch ops", "F.gelu"]
    assert any(l.startswith("torch.compile: skipped") and "No working C++ compiler" in l for l in lines)
    assert all("\n" not in l for l in lines)


def test_kernels_target_line_reads_the_largest_fp32_size():
    def row(variant, p, ms, copy_ms):
        n = 1 << p
        gbs, copy_gbs = 8 * n / ms / 1e6, 8 * n / copy_ms / 1e6
        return {"variant": variant, "dtype": "float32", "log2_n": p, "ms": ms, "gb_s": gbs,
                "copy_gb_s": copy_gbs, "pct_copy": 100 * gbs / copy_gbs}
    rows = [row("F.gelu", 20, 0.1, 0.05), row("CUDA kernel", 20, 0.2, 0.05),
            row("F.gelu", 28, 0.80, 0.70), row("CUDA kernel", 28, 0.75, 0.70)]
    line = kernels.target_line(rows)
    # 0.70 / 0.75 = 93.3% of copy; 0.80 / 0.75 = 1.07x F.gelu, at 2^28 not 2^20
    assert line.startswith("CUDA kernel at 2^28 fp32: 93.3% of copy bandwidth") and line.endswith("1.07x F.gelu")
    assert kernels.target_line([r for r in rows if r["variant"] == "F.gelu"]) is None


@pytest.mark.parametrize("argv, needle", [
    (["--sizes", "40"], "--sizes"),
    (["--reps", "0"], "--reps"),
    (["--json", "/nonexistent-dir/x.json"], "--json"),
    (["--json", "/"], "is a directory"),
    (["--dtypes", "float16"], "--dtypes"),
])
def test_kernels_cli_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        kernels.main(["--device", "cpu"] + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_kernels_cli_cuda_without_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        kernels.main(["--device", "cuda"])
    assert e.value.code == 2 and "--device cuda" in capsys.readouterr().err


def _kernels_nvcc():
    return shutil.which("nvcc")


@pytest.mark.skipif(_kernels_nvcc() is None, reason="nvcc not installed; the CUDA source is compiled where it is")
def test_kernels_cuda_source_compiles_with_nvcc(tmp_path):
    # No GPU needed: compile the exact string load_inline builds, for the H100 (sm_90),
    # with every warning an error, so a typo cannot wait for a GPU session to show up.
    src = tmp_path / "gelu.cu"
    src.write_text(kernels.GELU_CUDA_SRC)
    cmd = [_kernels_nvcc(), "-c", str(src), "-o", str(tmp_path / "gelu.o"), "-std=c++17", "-O3",
           "-arch=sm_90", "-Werror=all-warnings"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "gelu.o")], capture_output=True, text=True).stdout
    assert "gelu_cuda_launch" in symbols  # the entry point the C++ wrapper declares


# Host emulation of the CUDA kernel: no GPU here, so run the kernel's own device code on the
# CPU, one (block, thread) at a time. Threads of this kernel never talk to each other, so
# running them in sequence is exact. This checks the indexing (grid-stride loop, unroll,
# tail, VEC = 1 path) and the math for every tail length; only the #include lines and the
# launch code are left out, and CUDA's builtins get minimal CPU stand-ins.
_KERNELS_EMU_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
struct KernelsDim3 { unsigned x = 0, y = 0, z = 0; };
static KernelsDim3 blockIdx, threadIdx, blockDim, gridDim;
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 v) {
    uint32_t u = uint32_t(v.bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {  // round to nearest even (no NaN inputs here)
    uint32_t u; std::memcpy(&u, &f, 4); u += 0x7FFFu + ((u >> 16) & 1u); return {uint16_t(u >> 16)};
}
"""

_KERNELS_EMU_MAIN = r"""
template <typename T, int VEC>
static void run_grid(const void* x, void* y, int64_t n, unsigned grid, unsigned block) {
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            gelu_kernel<T, VEC>(static_cast<const T*>(x), static_cast<T*>(y), n);
        }
}
extern "C" void emulate(int bf16, int vec, const void* x_in, void* y_inout, int64_t n, unsigned grid, unsigned block) {
    const size_t bytes = n * (bf16 ? 2 : 4), padded = (bytes / 64 + 1) * 64;
    void* x = std::aligned_alloc(64, padded); void* y = std::aligned_alloc(64, padded);
    std::memcpy(x, x_in, bytes); std::memcpy(y, y_inout, bytes);  // y arrives poisoned
    if (bf16) { if (vec > 1) run_grid<__nv_bfloat16, 8>(x, y, n, grid, block); else run_grid<__nv_bfloat16, 1>(x, y, n, grid, block); }
    else      { if (vec > 1) run_grid<float, 4>(x, y, n, grid, block);         else run_grid<float, 1>(x, y, n, grid, block); }
    std::memcpy(y_inout, y, bytes); std::free(x); std::free(y);
}
"""


@pytest.fixture(scope="module")
def kernels_emulated(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulation of the CUDA kernel")
    device_part = kernels.GELU_CUDA_SRC.split("// ---- host side")[0]
    device_part = "\n".join(l for l in device_part.splitlines() if not l.startswith("#include"))
    d = tmp_path_factory.mktemp("kernels_emu")
    (d / "emu.cpp").write_text(_KERNELS_EMU_PRELUDE + device_part + _KERNELS_EMU_MAIN)
    r = subprocess.run([cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-o", str(d / "emu.so"), str(d / "emu.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = ctypes.CDLL(str(d / "emu.so"))
    lib.emulate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_int64, ctypes.c_uint, ctypes.c_uint]

    def run(x, vec, grid, block):
        y = torch.full_like(x, float("nan"))
        lib.emulate(int(x.dtype == torch.bfloat16), vec, x.data_ptr(), y.data_ptr(), x.numel(), grid, block)
        return y
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernels_cuda_kernel_host_emulation(kernels_emulated, dtype):
    g = torch.Generator().manual_seed(3)
    for n in list(range(1, 41)) + [1000, 4099]:
        x = kernels.random_input(n, dtype, "cpu", g)
        for vec in (16 // x.element_size(), 1):  # 16-byte packs, and the unaligned fallback
            for grid, block in ((1, 1), (3, 32), (2, 256)):  # fewer threads than packs, and more
                y = kernels_emulated(x, vec, grid, block)
                a, r = kernels.max_errors(y, x)  # NaN if any element was left unwritten
                # float32: ~4 roundings in u, amplified by at most 2|u| < 8 where |gelu| >= 1e-3,
                # plus expf and the division: a few 1e-6 at most. bfloat16: one rounding, 2^-8.
                bound = 4e-6 if dtype == torch.float32 else 2.0**-8 * (1 + 1e-3)
                assert r <= bound, (n, vec, grid, block, a, r)


@pytest.mark.skipif(not os.environ.get("KERNELS_SLOW_TESTS"),
                    reason="set KERNELS_SLOW_TESTS=1: compiling the C++ wrapper against torch/extension.h takes ~40 s")
def test_kernels_cpp_wrapper_compiles(tmp_path):
    from torch.utils.cpp_extension import include_paths
    src = tmp_path / "wrapper.cpp"
    src.write_text(kernels.GELU_CPP_SRC)
    inc = [f"-I{p}" for p in include_paths() + [sysconfig.get_paths()["include"]]]
    r = subprocess.run(["c++", "-fsyntax-only", "-std=c++17", str(src)] + inc, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not torch.cuda.is_available() or kernels.cuda_unavailable_reason() is not None,
                    reason="needs a CUDA GPU with nvcc and ninja")
def test_kernels_cuda_kernel_matches_reference():
    for n in list(range(0, 40)) + [(1 << 20) + 3]:  # every tail length, empty input included
        for dtype in (torch.float32, torch.bfloat16):
            x = kernels.random_input(n + 1, dtype, "cuda", torch.Generator().manual_seed(n))
            for view in (x[:n], x[1:]):  # 16-byte aligned, and not
                y = kernels.gelu_cuda(view, out=torch.full_like(view, float("nan")))
                if n == 0:
                    continue  # nothing to compare; the call must simply not fail
                a, r = kernels.max_errors(y, view)
                # float32: computed and rounded in float32; bfloat16: one rounding, rel <= 2^-8
                assert r <= (4e-6 if dtype == torch.float32 else 2.0**-8 * (1 + 1e-3)), (n, dtype, a, r)
