"""Tests for model.py and optim.py: every piece against an independent oracle
(torch built-ins, a complex-number RoPE, a plain-loop Transformer written here)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import model
import optim


def _model_small(**kw):
    cfg = dict(vocab_size=61, context_length=24, d_model=32, num_layers=2, num_heads=4, d_ff=48)
    cfg.update(kw)
    return model.TransformerLM(**cfg)


# ---------------------------------------------------------------- building blocks

def test_model_linear_and_embedding_match_torch_and_init():
    torch.manual_seed(0)
    lin = model.Linear(300, 200)
    x = torch.randn(2, 3, 300)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight))
    std = math.sqrt(2 / 500)
    assert lin.weight.shape == (200, 300)
    # a N(0, s^2) cut at +-3s has variance s^2 (1 - 2 * 3 phi(3) / (Phi(3) - Phi(-3)))
    phi3, mass = math.exp(-4.5) / math.sqrt(2 * math.pi), math.erf(3 / math.sqrt(2))
    assert lin.weight.std().item() == pytest.approx(std * math.sqrt(1 - 6 * phi3 / mass), rel=0.02)
    assert lin.weight.abs().max() <= 3 * std + 1e-6
    emb = model.Embedding(1000, 64)
    ids = torch.randint(0, 1000, (3, 5))
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))
    assert emb.weight.abs().max() <= 3.0 + 1e-6


def test_model_rmsnorm_matches_torch_and_keeps_dtype():
    torch.manual_seed(0)
    norm = model.RMSNorm(16)
    norm.weight.data = torch.randn(16)
    x = torch.randn(2, 5, 16) * 3
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    if hasattr(F, "rms_norm"):
        ref = F.rms_norm(x, (16,), norm.weight, eps=1e-5)
    torch.testing.assert_close(norm(x), ref)
    xb = (x * 1e3).bfloat16()  # squares overflow nothing in float32
    out = norm(xb)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), norm(xb.float()), atol=0.05, rtol=0.02)


def test_model_silu_softmax_match_torch():
    x = torch.randn(4, 7, 9) * 5
    torch.testing.assert_close(model.silu(x), F.silu(x))
    for dim in (0, -1, 1):
        torch.testing.assert_close(model.softmax(x, dim), torch.softmax(x, dim))
    big = torch.tensor([[1e4, 1e4 - 1.0, -1e4]])
    torch.testing.assert_close(model.softmax(big, -1), torch.softmax(big, -1))


def test_model_swiglu_and_silu_ffn_formulas():
    torch.manual_seed(0)
    ff = model.SwiGLU(16, 40)
    x = torch.randn(3, 4, 16)
    w1, w2, w3 = ff.w1.weight, ff.w2.weight, ff.w3.weight
    torch.testing.assert_close(ff(x), F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2))
    ff.fast = True
    torch.testing.assert_close(ff(x), F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2))
    s = model.SiLUFFN(16, 64)
    torch.testing.assert_close(s(x), F.linear(F.silu(F.linear(x, s.w1.weight)), s.w2.weight))


def _model_rope_complex(x, pos, theta):
    """RoPE as complex multiplication: pair (x[2k], x[2k+1]) is x[2k] + i x[2k+1], times e^{i pos w_k}."""
    d = x.shape[-1]
    w = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rot = torch.polar(torch.ones_like(w), pos.double()[..., None] * w)
    return torch.view_as_real(z * rot).reshape(x.shape).to(x.dtype)


def test_model_rope_matches_complex_formulation():
    torch.manual_seed(0)
    rope = model.RotaryPositionalEmbedding(10000.0, 16, 64)
    x = torch.randn(2, 3, 10, 16)  # extra leading dims
    pos = torch.arange(10)
    torch.testing.assert_close(rope(x, pos), _model_rope_complex(x, pos, 10000.0), atol=1e-5, rtol=1e-5)
    pos2 = torch.randint(0, 64, (2, 1, 10))  # explicit, non-contiguous positions per batch row
    torch.testing.assert_close(rope(x, pos2), _model_rope_complex(x, pos2.expand(2, 3, 10), 10000.0),
                               atol=1e-5, rtol=1e-5)
    assert len(rope.state_dict()) == 0  # non-persistent buffers
    with pytest.raises(ValueError, match="d_k=15"):
        model.RotaryPositionalEmbedding(10000.0, 15, 64)


@pytest.mark.parametrize("shape", [(3, 7, 8), (2, 3, 7, 8)])
def test_model_sdpa_matches_torch(shape):
    torch.manual_seed(0)
    Q, K, V = torch.randn(shape), torch.randn(shape), torch.randn(shape)
    mask = torch.rand(7, 7) > 0.4
    mask[:, 0] = True  # every query may attend to something
    torch.testing.assert_close(model.scaled_dot_product_attention(Q, K, V, mask),
                               F.scaled_dot_product_attention(Q, K, V, attn_mask=mask))
    torch.testing.assert_close(model.scaled_dot_product_attention(Q, K, V, model.causal_mask(7)),
                               F.scaled_dot_product_attention(Q, K, V, is_causal=True))
    torch.testing.assert_close(model.scaled_dot_product_attention(Q, K, V),
                               F.scaled_dot_product_attention(Q, K, V))


def _model_mha_oracle(attn, x, rope_theta=None):
    """Per-head loop with torch's causal SDPA and the complex RoPE."""
    B, T, d = x.shape
    H = attn.num_heads
    dh = d // H
    q, k, v = (F.linear(x, p.weight) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    heads = []
    for h in range(H):
        sl = slice(h * dh, (h + 1) * dh)
        qh, kh, vh = q[..., sl], k[..., sl], v[..., sl]
        if rope_theta is not None:
            qh, kh = _model_rope_complex(qh, torch.arange(T), rope_theta), _model_rope_complex(kh, torch.arange(T), rope_theta)
        heads.append(F.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
    return F.linear(torch.cat(heads, -1), attn.output_proj.weight)


@pytest.mark.parametrize("use_rope", [False, True])
def test_model_mha_matches_per_head_oracle(use_rope):
    torch.manual_seed(0)
    rope = model.RotaryPositionalEmbedding(500.0, 8, 32) if use_rope else None
    attn = model.MultiHeadSelfAttention(32, 4, rope)
    x = torch.randn(2, 11, 32)
    want = _model_mha_oracle(attn, x, 500.0 if use_rope else None)
    torch.testing.assert_close(attn(x), want, atol=1e-5, rtol=1e-4)
    attn.fast = True
    torch.testing.assert_close(attn(x), want, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- the whole model

def _model_oracle_lm(sd, ids, num_heads, theta):
    """The CS336 pre-norm Transformer written out with torch.nn.functional, from a state dict."""
    x = F.embedding(ids, sd["token_embeddings.weight"])
    n_layers = len({k.split(".")[1] for k in sd if k.startswith("layers.")})

    def norm(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    for i in range(n_layers):
        p = lambda name: sd[f"layers.{i}.{name}"]  # noqa: E731
        attn = model.MultiHeadSelfAttention(x.shape[-1], num_heads)
        for n in ("q_proj", "k_proj", "v_proj", "output_proj"):
            getattr(attn, n).weight.data = p(f"attn.{n}.weight")
        x = x + _model_mha_oracle(attn, norm(x, p("ln1.weight")), theta)
        h = norm(x, p("ln2.weight"))
        x = x + F.linear(F.silu(F.linear(h, p("ffn.w1.weight"))) * F.linear(h, p("ffn.w3.weight")), p("ffn.w2.weight"))
    return F.linear(norm(x, sd["ln_final.weight"]), sd["lm_head.weight"])


def test_model_lm_state_dict_keys_and_oracle_forward():
    torch.manual_seed(0)
    m = _model_small(rope_theta=1000.0)
    want = {"token_embeddings.weight", "ln_final.weight", "lm_head.weight"}
    for i in range(2):
        want |= {f"layers.{i}.{n}.weight" for n in ("ln1", "ln2", "attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                    "attn.output_proj", "ffn.w1", "ffn.w2", "ffn.w3")}
    assert set(m.state_dict()) == want
    ids = torch.randint(0, 61, (3, 24))
    with torch.no_grad():
        got = m(ids)
        ref = _model_oracle_lm({k: v.clone() for k, v in m.state_dict().items()}, ids, 4, 1000.0)
    assert got.shape == (3, 24, 61)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_model_fast_path_matches_reference_values_and_grads():
    torch.manual_seed(0)
    ref = _model_small()
    fast = _model_small(fast=True)
    fast.load_state_dict(ref.state_dict())
    assert list(fast.state_dict()) == list(ref.state_dict())
    ids = torch.randint(0, 61, (2, 24))
    out_r, out_f = ref(ids), fast(ids)
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-4)
    optim.cross_entropy(out_r[:, :-1], ids[:, 1:]).backward()
    optim.cross_entropy(out_f[:, :-1], ids[:, 1:]).backward()
    for (n, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-3, msg=n)


def test_model_ablation_keys_and_tied_weights():
    keys = lambda m: set(m.state_dict())  # noqa: E731
    base = keys(_model_small())
    assert keys(_model_small(no_norm=True)) == {k for k in base if "ln" not in k}
    assert keys(_model_small(silu_ffn=True, d_ff=128)) == {k for k in base if "w3" not in k}
    assert keys(_model_small(post_norm=True)) == base
    assert keys(_model_small(nope=True)) == base
    tied = _model_small(tie_embeddings=True)
    assert keys(tied) == base
    assert tied.lm_head.weight is tied.token_embeddings.weight
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in _model_small().parameters()) - 61 * 32


def test_model_nope_sees_no_order_but_rope_does():
    # without positions, one causal attention layer sees the earlier tokens as a set: permuting
    # them leaves the last position's logits unchanged; with RoPE it changes them
    torch.manual_seed(0)
    ids = torch.randint(0, 61, (1, 12))
    perm = torch.cat([torch.randperm(11), torch.tensor([11])])
    for nope in (True, False):
        m = _model_small(nope=nope, num_layers=1)
        with torch.no_grad():
            a, b = m(ids)[0, -1], m(ids[:, perm])[0, -1]
        assert torch.allclose(a, b, atol=1e-5) == nope


def test_model_post_norm_block_output_is_normalised():
    torch.manual_seed(0)
    block = model.TransformerBlock(32, 4, 48, post_norm=True)
    y = block(torch.randn(2, 9, 32) * 10)
    rms = y.pow(2).mean(-1).sqrt()  # ln2 (gain 1) is the last thing applied
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)


@pytest.mark.parametrize("ablation", [{}, {"no_norm": True}, {"post_norm": True}, {"nope": True},
                                      {"silu_ffn": True, "d_ff": 128}, {"tie_embeddings": True}, {"fast": True}])
def test_model_every_parameter_gets_a_gradient(ablation):
    torch.manual_seed(0)
    m = _model_small(**ablation)
    ids = torch.randint(0, 61, (2, 24))
    optim.cross_entropy(m(ids[:, :-1]), ids[:, 1:]).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_model_overfits_one_batch():
    torch.manual_seed(0)
    m = _model_small(fast=True)
    ids = torch.randint(0, 61, (4, 24))
    opt = optim.AdamW(m.parameters(), lr=2e-2, weight_decay=0.0)
    first = None
    for _ in range(60):
        loss = optim.cross_entropy(m(ids[:, :-1]), ids[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 3.5 and loss.item() < 0.05


def test_model_float32_and_bfloat16_both_train():
    torch.manual_seed(0)
    m32 = _model_small()
    m16 = _model_small(dtype=torch.bfloat16)
    m16.load_state_dict(m32.state_dict())
    ids = torch.randint(0, 61, (2, 24))
    for m in (m32, m16):
        opt = optim.AdamW(m.parameters(), lr=1e-3)
        loss = optim.cross_entropy(m(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        opt.step()
        assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in m.parameters())
    assert m16(ids).dtype == torch.bfloat16
    with torch.no_grad():
        m32.load_state_dict({k: v.float() for k, v in m16.state_dict().items()})
        torch.testing.assert_close(m16(ids).float(), m32(ids), atol=0.15, rtol=0.05)


def test_model_bad_inputs_raise_valueerror_naming_numbers():
    with pytest.raises(ValueError, match="d_model=30.*num_heads=4"):
        _model_small(d_model=30)
    with pytest.raises(ValueError, match="36/4 = 9"):
        _model_small(d_model=36)
    _model_small(d_model=36, nope=True)  # odd head dim is fine without RoPE
    m = _model_small()
    with pytest.raises(ValueError, match="25 tokens.*context_length=24"):
        m(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="61"):
        m(torch.full((1, 4), 61))
    with pytest.raises(ValueError, match="-1"):
        m(torch.full((1, 4), -1))


# ---------------------------------------------------------------- generation

def test_model_generate_cache_matches_reference_greedy():
    torch.manual_seed(0)
    m = _model_small(dtype=torch.float64, context_length=16)  # float64: no near-ties flip between paths
    m.train()
    prompts = [[1, 2, 3, 4, 5], [7], [9, 9, 8, 1, 2, 3, 4, 5, 6, 7]]
    # 16 new tokens run past the 16-token context: the window slides in both paths
    with_cache = model.generate(m, prompts, 16, temperature=0)
    without = model.generate(m, prompts, 16, temperature=0, use_cache=False)
    assert with_cache == without
    assert all(len(o) == 16 for o in with_cache)
    # batching with left padding gives each prompt the tokens it gets alone
    for p, o in zip(prompts, with_cache):
        assert model.generate(m, p, 16, temperature=0) == o
    assert m.training  # mode restored
    fast = _model_small(dtype=torch.float64, context_length=16, fast=True)  # torch's SDPA with a padding mask
    fast.load_state_dict(m.state_dict())
    assert model.generate(fast, prompts, 16, temperature=0) == without
    # oracle for the first greedy token: argmax of a plain forward pass
    with torch.no_grad():
        assert with_cache[0][0] == int(m(torch.tensor([prompts[0]]))[0, -1].argmax())


def test_model_generate_stop_topp_temperature():
    torch.manual_seed(0)
    m = _model_small(dtype=torch.float64)
    greedy = model.generate(m, [3, 1, 4], 12, temperature=0)
    stop = greedy[5]
    first = greedy.index(stop)
    assert model.generate(m, [3, 1, 4], 12, temperature=0, stop_id=stop) == greedy[:first]  # stop id excluded
    # a tiny top-p keeps only the most likely token: sampling becomes greedy
    g = torch.Generator().manual_seed(1)
    assert model.generate(m, [3, 1, 4], 12, temperature=1.0, top_p=1e-9, generator=g) == greedy
    # the same generator seed reproduces a sample, cached or not
    s1 = model.generate(m, [3, 1, 4], 12, temperature=1.3, top_p=0.9, generator=torch.Generator().manual_seed(5))
    s2 = model.generate(m, [3, 1, 4], 12, temperature=1.3, top_p=0.9, use_cache=False,
                        generator=torch.Generator().manual_seed(5))
    assert s1 == s2 and all(0 <= t < 61 for t in s1)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(m, [1], 3, top_p=0)


def test_model_sample_top_p_distribution():
    # top-p with p=0.7 over probs (0.5, 0.3, 0.15, 0.05) keeps the first two, renormalised to (5/8, 3/8)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(20000, 4)
    ids = model._sample(logits, 1.0, 0.7, torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=4).double() / 20000
    torch.testing.assert_close(freq, torch.tensor([5 / 8, 3 / 8, 0, 0], dtype=torch.float64), atol=0.015, rtol=0)


# ---------------------------------------------------------------- optim.py

def test_model_cross_entropy_matches_torch_and_is_stable():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    targets = torch.randint(0, 11, (3, 5))
    torch.testing.assert_close(optim.cross_entropy(logits, targets), F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1)))
    huge = logits * 1e4
    got = optim.cross_entropy(huge, targets)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, F.cross_entropy(huge.reshape(-1, 11), targets.reshape(-1)))
    # the hand-written backward against autograd's numerical derivative, and against torch's
    x = torch.randn(4, 6, 7, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (4, 6))
    assert torch.autograd.gradcheck(lambda z: optim.cross_entropy(z, y), (x,))
    g_ours, = torch.autograd.grad(optim.cross_entropy(x, y), x)
    g_torch, = torch.autograd.grad(F.cross_entropy(x.reshape(-1, 7), y.reshape(-1)), x)
    torch.testing.assert_close(g_ours, g_torch)
    xb = x.detach().bfloat16().requires_grad_()
    optim.cross_entropy(xb, y).backward()
    assert xb.grad.dtype == torch.bfloat16
    loss = 2.5
    assert optim.perplexity(torch.tensor(loss)) == pytest.approx(math.exp(loss))


def _model_adamw_oracle(params, grads_fn, steps, lr, betas, eps, wd):
    """The handout's Algorithm 1, one parameter at a time, in float64."""
    ps = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        gs = grads_fn(ps)
        for i, (p, g) in enumerate(zip(ps, gs)):
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            a = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
            p -= a * m[i] / (v[i].sqrt() + eps)
            p -= lr * wd * p
    return ps


def test_model_adamw_matches_algorithm1_and_torch_over_1000_steps():
    torch.manual_seed(0)
    A, target = torch.randn(8, 6, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)

    def grads(ps):  # least squares, gradient written by hand
        W, b = ps
        r = A @ W + b - target
        return [2 * A.t() @ r / len(A), 2 * r.mean(0)]

    init = [torch.randn(6, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)]
    # lr small enough that 1000 steps stay short of the minimum: near it Adam's normalised
    # steps amplify rounding differences chaotically, and no two implementations would agree
    hp = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = [torch.nn.Parameter(p.clone()) for p in init]
    theirs = [torch.nn.Parameter(p.clone()) for p in init]
    o1, o2 = optim.AdamW(ours, **hp), torch.optim.AdamW(theirs, **hp)
    for _ in range(1000):
        for ps, o in ((ours, o1), (theirs, o2)):
            for p, g in zip(ps, grads([p.detach() for p in ps])):
                p.grad = g
            o.step()
    want = _model_adamw_oracle(init, grads, 1000, hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"])
    for p, w, t in zip(ours, want, theirs):
        torch.testing.assert_close(p.detach(), w, atol=1e-7, rtol=1e-7)
        # torch decays before the update instead of after: equal up to O(lr^2 wd) per step
        torch.testing.assert_close(p.detach(), t.detach(), atol=1e-3, rtol=1e-3)


def test_model_optimizer_state_dict_round_trips():
    torch.manual_seed(0)
    for cls in (optim.AdamW, optim.AdaGrad, optim.SGD):
        net = torch.nn.Linear(5, 3)
        opt = cls(net.parameters(), lr=1e-2)
        x = torch.randn(16, 5)

        def step(n, o):
            o.zero_grad()
            n(x).pow(2).mean().backward()
            o.step()

        for _ in range(3):
            step(net, opt)
        net2 = copy.deepcopy(net)
        opt2 = cls(net2.parameters(), lr=1e-2)
        opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
        for _ in range(3):
            step(net, opt)
            step(net2, opt2)
        for a, b in zip(net.parameters(), net2.parameters()):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_model_sgd_and_adagrad_match_their_formulas():
    torch.manual_seed(0)
    w0 = torch.randn(4, 3)
    gs = [torch.randn(4, 3) for _ in range(5)]
    p_sgd, p_tsgd, p_ada = (torch.nn.Parameter(w0.clone()) for _ in range(3))
    o_sgd, o_tsgd, o_ada = optim.SGD([p_sgd], lr=0.1), torch.optim.SGD([p_tsgd], lr=0.1), optim.AdaGrad([p_ada], lr=0.1)
    want, G = w0.clone(), torch.zeros(4, 3)
    for g in gs:
        for p, o in ((p_sgd, o_sgd), (p_tsgd, o_tsgd), (p_ada, o_ada)):
            p.grad = g.clone()
            o.step()
        G += g * g
        want -= 0.1 * g / torch.sqrt(G + 1e-5)
    torch.testing.assert_close(p_sgd, p_tsgd)
    torch.testing.assert_close(p_ada.detach(), want)


def test_model_invalid_hyperparameters_raise():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kw in (dict(lr=-1), dict(betas=(1.0, 0.9)), dict(betas=(0.9, -0.1)), dict(eps=0), dict(weight_decay=-0.1)):
        with pytest.raises(ValueError):
            optim.AdamW(p, **kw)
    with pytest.raises(ValueError):
        optim.SGD(p, lr=-0.1)
    with pytest.raises(ValueError):
        optim.AdaGrad(p, lr=0.1, eps=-1)


def test_model_cosine_lr_shape():
    mx, mn, tw, tc = 1.0, 0.1, 10, 110
    lrs = [optim.cosine_lr(t, mx, mn, tw, tc) for t in range(130)]
    assert lrs[0] == 0 and lrs[5] == pytest.approx(0.5 * mx)
    assert lrs[tw] == pytest.approx(mx) and lrs[tc] == pytest.approx(mn) and lrs[129] == mn
    assert lrs[(tw + tc) // 2] == pytest.approx((mx + mn) / 2)  # cosine is at its midpoint halfway
    assert all(a >= b for a, b in zip(lrs[tw:], lrs[tw + 1:]))
    t = 37  # cos identity: lr(t) + lr(mirror of t) = max + min
    assert optim.cosine_lr(t, mx, mn, tw, tc) + optim.cosine_lr(tw + tc - t, mx, mn, tw, tc) == pytest.approx(mx + mn)


def test_model_clip_grad_norm_matches_torch():
    torch.manual_seed(0)
    for scale in (10.0, 0.01):
        ps1 = [torch.nn.Parameter(torch.randn(5, 4)) for _ in range(3)]
        ps2 = [torch.nn.Parameter(p.detach().clone()) for p in ps1]
        for a, b in zip(ps1, ps2):
            a.grad = torch.randn_like(a) * scale
            b.grad = a.grad.clone()
        ps1.append(torch.nn.Parameter(torch.zeros(2)))  # no grad: ignored
        total = optim.clip_grad_norm(ps1, 1.0)
        want = torch.nn.utils.clip_grad_norm_(ps2, 1.0)  # scales by max / (norm + 1e-6) too
        assert total == pytest.approx(want.item(), rel=1e-6)
        for a, b in zip(ps1, ps2):
            torch.testing.assert_close(a.grad, b.grad)


def test_model_meta_device_and_bf16_autocast():
    m = _model_small(device="meta")  # accounting.py builds shapes only
    assert all(p.device.type == "meta" for p in m.parameters())
    torch.manual_seed(0)
    ref, fast = _model_small(), _model_small(fast=True)
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 61, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(ids), fast(ids)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), a.float(), atol=0.1, rtol=0.05)
    with torch.no_grad():
        torch.testing.assert_close(a.float(), ref(ids), atol=0.15, rtol=0.05)
