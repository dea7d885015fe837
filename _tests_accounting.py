"""Tests for accounting.py: every formula against an independent count on the real model."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import accounting
import model

_ACC_ROOT = Path(__file__).resolve().parent


def _acc_mismatches(checks):
    return [f"{what}: formula {f:,} != measured {m:,}" for what, f, m in checks if f != m]


def test_accounting_verify_checks_pass():
    # the same table `python accounting.py --verify` prints: meta-device parameter counts and
    # FlopCounterMode FLOPs per component (GPT-2 small..XL, TinyStories and its ablations),
    # forward+backward = 3x, the two-layer model's 2x / 4x, and saved-for-backward bytes
    checks = list(accounting.verification_checks(quick=True))
    assert len(checks) > 100
    assert _acc_mismatches(checks) == []


def test_accounting_long_context_and_fast_path():
    cfg = accounting.gpt2_config("XL", 16_384)
    parts, total = accounting.measured_forward_flops(accounting.meta_lm(cfg), cfg["context_length"])
    assert parts == accounting.formula_forward_flops(cfg)
    assert total == accounting.lm_forward_flops(**accounting._flops_args(cfg))
    small = accounting.gpt2_config("small")
    _, fast_total = accounting.measured_forward_flops(accounting.meta_lm(small, fast=True), 1024)
    assert fast_total == accounting.lm_forward_flops(**accounting._flops_args(small))


@pytest.mark.parametrize("ablations", [{}, {"silu_ffn": True}, {"no_norm": True}, {"tie_embeddings": True}])
def test_accounting_real_cpu_model_params_and_flops(ablations):
    # a real (not meta) model: parameters by numel, FLOPs counted on real tensors, batch 3
    cfg = dict(vocab_size=101, context_length=12, d_model=24, num_layers=2, num_heads=3, d_ff=40)
    lm = model.TransformerLM(**cfg, **ablations)
    n_params = sum(p.numel() for p in lm.parameters())
    assert n_params == sum(accounting.lm_param_counts(101, 24, 2, 40, **ablations).values())
    with FlopCounterMode(display=False) as counter:
        lm(torch.randint(0, 101, (3, 12)))
    flops = accounting.lm_forward_flops(101, 12, 24, 2, 40, silu_ffn=ablations.get("silu_ffn", False))
    assert counter.get_total_flops() == 3 * flops


def test_accounting_saved_bytes_grow_as_the_formula_says():
    # doubling B doubles every term except the B-free ones (RoPE tables, causal mask)
    B, T, d, h, d_ff, L, V = 2, 20, 40, 5, 64, 2, 70
    torch.manual_seed(0)
    lm = model.TransformerLM(V, T, d, L, h, d_ff)
    m1, _, _ = accounting.measured_saved_bytes(lm, torch.randint(0, V, (B, T)))
    m2, _, _ = accounting.measured_saved_bytes(lm, torch.randint(0, V, (2 * B, T)))
    f = accounting.saved_activation_bytes
    assert (m1, m2) == (f(B, T, d, h, d_ff, L), f(2 * B, T, d, h, d_ff, L))
    # the handout's simplified list is a lower bound of what autograd really keeps here
    handout = 4 * accounting.handout_activation_elements(B, T, d, h, V, L) - 4 * B * T * V
    assert handout < m1


def test_accounting_peak_flops_table_and_cpu_measurement():
    key = accounting.gpu_peak_key
    assert key("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert key("NVIDIA H100 PCIe") == "H100 PCIe"
    assert key("NVIDIA H200") == "H100 SXM"
    assert key("NVIDIA A100-SXM4-80GB") == "A100"
    assert key("NVIDIA H100 NVL") is None and key("Tesla T4") is None
    cpu = accounting.peak_flops("cpu", torch.float32)
    assert cpu > 0 and accounting.peak_flops("cpu", torch.float32) == cpu  # measured once, cached
    assert accounting.peak_flops("meta", torch.float32) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_accounting_cuda_memory_matches_saved_tensors():
    formula, retained, peak, slack = accounting.cuda_memory_check()
    assert abs(retained - formula) <= slack and peak >= retained
    assert accounting.peak_flops("cuda", torch.bfloat16) is None or accounting.peak_flops("cuda", torch.bfloat16) > 1e13


def test_accounting_dtype_facts_against_numpy_and_torch():
    assert accounting.stored_value(1e-8, torch.float16) == float(np.float16(1e-8)) == 0.0
    assert accounting.stored_value(1e-8, torch.bfloat16) > 0
    for dt in accounting.DTYPES:
        assert accounting.tensor_bytes((4 * 12288, 12288), dt) == torch.empty(4 * 12288, 12288, dtype=dt, device="meta").nbytes


def test_accounting_adamw_line_and_max_batch():
    xl = accounting.gpt2_config("XL")
    a, b = accounting.adamw_memory_line(xl)
    args = (xl["vocab_size"], xl["context_length"], xl["num_layers"], xl["d_model"], xl["num_heads"])
    for B in (1, 5, 17):
        assert a * B + b == sum(accounting.adamw_memory(B, *args).values())
    for mem in (80e9, 80 * 2**30):
        n = accounting.max_batch(a, b, mem)
        assert a * n + b <= mem < a * (n + 1) + b
    # the parameter term is the real GPT-2 XL-shaped model's count
    P = sum(p.numel() for p in accounting.meta_lm(xl).parameters())
    assert b == 16 * P


def test_accounting_cli_prints_every_section_and_rejects_bad_flags():
    run = lambda *a: subprocess.run([sys.executable, "accounting.py", *a], cwd=_ACC_ROOT,
                                    capture_output=True, text=True, timeout=120)
    full = run()
    assert full.returncode == 0, full.stderr
    for name in accounting.SECTIONS:
        assert f"=== {name} " in full.stdout
    one = run("--section", "adamw")
    assert one.returncode == 0 and "=== adamw" in one.stdout and "=== tensors" not in one.stdout
    bad = run("--section", "nope")
    assert bad.returncode == 2 and "--section" in bad.stderr and "Traceback" not in bad.stderr
