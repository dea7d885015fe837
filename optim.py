"""Loss, optimizers, learning-rate schedule and gradient clipping, from scratch.

Sections, in reading order (CS336 assignment 1, section 4; lecture 2):
  1. cross_entropy (max-subtracted log-sum-exp), the same loss with a hand-written
     in-place backward (softmax - onehot), and perplexity.
  2. Optimizers, the lecture's chain: SGD (+ momentum; sgd_toy, the handout's first loop) -> AdaGrad -> RMSProp
     -> Adam/AdamW (Algorithm 1; compiled=True fuses it, fused=True makes it one pass over memory on a CPU), then
     Muon beyond the lecture. State lives in self.state, so torch.optim.Optimizer's state_dict() round-trips.
  3. cosine_lr: linear warm-up, cosine decay, then a floor.
  4. clip_grad_norm: rescale all gradients together when their global L2 norm is too big.
Tests: python -m pytest -q test_all.py -k model  (the optimizers' tests sit in the model section)
"""
import math
import numbers

import torch

import fast_cpu  # the engine: numba kernels for float32 CPU tensors (fused=True)


# ----------------------------------------------------------------------------
# 1. Loss

def check_class_ids(targets):  # said here, not by gather in torch's words; .long() would cut 1.7 to class 1
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be integer class ids (int64 or int32), got {targets.dtype}.")


def cross_entropy(logits, targets, fused=False):
    """Mean over all positions of  -log softmax(o)[x] = log sum_a exp(o_a) - o_x.
    logits: (..., V), targets: (...) int64 or int32 -> scalar. Subtracting the max keeps exp finite;
    bf16 logits are upcast because the sum over V would lose digits (float64 stays float64).
    fused=True: the same loss with a hand-written backward (fast_cpu.py's kernel for float32 on a CPU, else below)."""
    if not (torch.is_tensor(logits) and torch.is_tensor(targets)):  # a list has no .dtype, a numpy array no .float()
        raise TypeError(f"cross_entropy takes tensors, got logits of type {type(logits).__name__} and targets of type "
                        f"{type(targets).__name__}: make them with torch.tensor or torch.from_numpy.")
    check_class_ids(targets)
    if logits.dim() == 0 or targets.shape != logits.shape[:-1]:  # (T, B) targets of (B, T, V) logits: each misplaced
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not fit logits of shape {tuple(logits.shape)}.")
    V = logits.shape[-1]
    if not torch.compiler.is_compiling() and targets.device.type != "meta" and targets.numel():  # eager: a host sync
        lo, hi = torch.stack([targets.min(), targets.max()]).tolist()  # past V: torch's words, or a GPU's assert
        if lo < 0 or hi >= V:
            raise ValueError(f"target id {lo if lo < 0 else hi} is outside the {V} classes of the logits.")
    if logits.dtype != torch.float64:
        logits = logits.float()  # no copy when already float32
    logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long()  # (N, V), (N,): gather wants int64
    if fused:  # float32 on a CPU: the engine's row-by-row kernel
        return (fast_cpu.cross_entropy if fast_cpu.usable(logits) else _FusedCrossEntropy.apply)(logits, targets)
    m = logits.detach().amax(dim=-1, keepdim=True)  # (N, 1); lse does not depend on m: no gradient
    lse = m.squeeze(-1) + (logits - m).exp().sum(dim=-1).log()  # (N,) log sum_a exp(o_a)
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


class _FusedCrossEntropy(torch.autograd.Function):
    """d loss / d o = (softmax(o) - onehot(x)) / N, written in place into the forward's (N, V)
    buffer e = exp(o - max): autograd would allocate several (each costs page faults on a CPU)."""

    @staticmethod
    def forward(ctx, logits, targets):  # (N, V) float, (N,) int64 -> scalar
        m = logits.amax(dim=-1, keepdim=True)  # (N, 1)
        e = (logits - m).exp_()  # (N, V), entries in (0, 1]
        s = e.sum(dim=-1, keepdim=True)  # (N, 1)
        lse = (m + s.log()).squeeze(-1)  # (N,)
        ctx.save_for_backward(logits, m, s, targets)
        ctx.e, ctx.used = e, False  # an attribute, not saved_tensors: the backward overwrites it on purpose
        return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: a hand-written gradient has no derivative of its own
            raise ValueError("cross_entropy(fused=True) has no second derivative; use fused=False with create_graph.")
        (logits, m, s, targets), e = ctx.saved_tensors, ctx.e
        if ctx.used:  # a second backward (retain_graph, gradcheck): a new e, the first's is the gradient it returned
            e = (logits - m).exp_()
        ctx.used, n = True, e.shape[0]
        g = e.mul_(grad / n / s)  # softmax(o) * grad / N, in place
        g[torch.arange(n, device=g.device), targets] -= grad / n  # minus the one-hot
        return g, None


def _number(x):  # an int or a float (numpy's too), not a bool, a str, None or a tensor
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def perplexity(mean_loss):
    """perplexity = exp(mean cross-entropy in nats), as a float: inf past a float's range (a loss above 709.78,
    which a diverging run can reach while the loss itself is still finite)."""
    if not (_number(mean_loss) or torch.is_tensor(mean_loss) and mean_loss.numel() == 1):  # not "2"
        what = f"a tensor of shape {tuple(mean_loss.shape)}" if torch.is_tensor(mean_loss) else repr(mean_loss)
        raise TypeError(f"perplexity takes a mean loss, a number or a one-element tensor, got {what}.")
    try:  # detach: the loss straight from the forward holds a graph, and float() of it warns of one
        return math.exp(float(mean_loss.detach() if torch.is_tensor(mean_loss) else mean_loss))
    except OverflowError:
        return math.inf


# ----------------------------------------------------------------------------
# 2. Optimizers

def _param_list(params):  # a group's params as a list (one tensor, a generator); a set stays, for torch's own refusal
    return [params] if torch.is_tensor(params) else params if isinstance(params, set) else list(params)


class _Optimizer(torch.optim.Optimizer):
    """What they share: each param group's hyperparameters are checked, and step() runs the closure, then hands
    each group's parameters that have a gradient to the optimizer's own _update."""
    squares = True  # g * g: wrong for a complex g (|g|^2 is the square), and no torch op takes a sparse g there

    def _check(self, group, saved=False):  # a group's hyperparameters (a saved one's: no default fills a gap)
        finite = ("a finite number >= 0", lambda x: _number(x) and 0 <= x < math.inf)  # inf: inf weights
        unit, flag = ("in [0, 1)", lambda x: _number(x) and 0 <= x < 1), ("True or False", lambda m: type(m) is bool)
        rules = {"lr": finite, "weight_decay": finite, "momentum": unit, "alpha": unit, "nesterov": flag, "muon": flag,
                 "eps": ("a finite number > 0", lambda x: _number(x) and 0 < x < math.inf),  # a NaN fails too
                 "betas": ("two, in [0, 1)", lambda b: isinstance(b, (tuple, list)) and len(b) == 2
                           and all(_number(x) and 0 <= x < 1 for x in b)),
                 "ns_steps": ("an int >= 1", lambda n: type(n) is int and n >= 1)}
        if saved and (missing := [k for k in self.defaults if k in rules and k not in group]):  # a KeyError at step
            raise ValueError(f"The saved state is another optimizer's: its group lacks {', '.join(missing)}.")
        bad = [f"{k}={v!r} (need {rules[k][0]})" for k, v in {**self.defaults, **group}.items() if k in rules
               and not rules[k][1](v)]
        if bad:
            raise ValueError(f"Hyperparameter out of range: {', '.join(bad)}.")

    def add_param_group(self, group):  # torch.optim's __init__ calls it too, for each group (its own lr, ...)
        if not isinstance(group, dict):  # add_param_group([p]): "'list' object is not a mapping" below; torch's words
            raise TypeError(f"param_group must be a dict, but got {type(group).__name__}: pass {{'params': [...]}}.")
        self._check(group)
        group = {**group, "params": _param_list(group["params"])}  # a set: torch's TypeError (its order changes)
        dtypes = sorted({str(p.dtype) for p in group["params"] if torch.is_tensor(p) and p.is_complex()})
        if dtypes and self.squares:
            raise ValueError(f"{type(self).__name__} squares each gradient where a complex one needs |g|^2: it "
                             f"takes real parameters, not {', '.join(dtypes)}.")
        super().add_param_group(group)

    def load_state_dict(self, state_dict):  # the saved groups meet the same rules (a saved NaN lr would train NaNs)
        for group in state_dict.get("param_groups", ()) if isinstance(state_dict, dict) else ():
            self._check(group, saved=True)
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else torch.enable_grad()(closure)()  # the closure calls backward()
        todo = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.param_groups]
        sparse = [tuple(p.shape) for _, params in todo for p in params if p.grad.is_sparse] if self.squares else []
        if sparse:  # a flag of the tensor's layout: no host sync; checked for every group before any is updated
            raise ValueError(f"{type(self).__name__} needs dense gradients, and parameters of shape {sparse[:3]} have "
                             "sparse ones: give them dense ones (an Embedding with sparse=False, say).")
        for group, params in todo:
            if params:  # AdamW's _foreach ops refuse empty lists
                self._update(group, params)
        return loss

    def _zeros(self, p, name):  # p's state tensor `name`, zeros before its first step
        if name not in self.state[p]:
            self.state[p][name] = torch.zeros_like(p)
        return self.state[p][name]


class SGD(_Optimizer):
    """theta <- theta - lr * g.  momentum mu > 0: Polyak's heavy ball,  v <- mu v + g;  theta <- theta - lr * v.
    A direction the gradients keep agreeing on gets up to 1 / (1 - mu) times the step, one they flip on cancels out
    (the lecture's average of g, (1 - mu) v, makes the same steps at lr / (1 - mu); this form is torch.optim.SGD's)."""

    squares = False  # p -= lr v: right for complex parameters and sparse gradients too, as in torch.optim.SGD

    def __init__(self, params, lr=1e-3, momentum=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def _update(self, group, params):
        for p in params:
            v = p.grad
            if group["momentum"] > 0:
                v = self._zeros(p, "momentum_buffer").mul_(group["momentum"]).add_(p.grad)
            p.add_(v, alpha=-group["lr"])


def sgd_toy(lr, steps=10, seed=0):
    """The handout's first training loop (section 4.2): mean(w^2) over a 10 x 10 w drawn as 5 * randn, SGD at
    lr / sqrt(t + 1) -> the loss before each step. Its learning_rate_tuning problem, answered (the gradient is
    w / 50, so a step multiplies w by 1 - lr / (50 sqrt(t + 1))): at lr 1e1 the loss falls steadily, 26.3 to 3.5 in
    ten steps; at 1e2 the first step flips w's sign (loss unchanged) and the fourth's factor is 0 (lr / sqrt(4) = 50),
    so w is zeroed but for rounding (a loss near 1e-16, then 1e-23); at 1e3 the
    factor is -19 at first and still -5.3 at the tenth step, so the loss diverges, to about 2e18.
    >>> [f"{loss:.3g}" for loss in sgd_toy(1e2)][:4]
    ['26.3', '26.3', '4.51', '0.108']
    """
    torch.manual_seed(seed)
    w = torch.nn.Parameter(5 * torch.randn(10, 10))
    opt, losses = SGD([w], lr=lr), []
    for t in range(steps):
        opt.param_groups[0]["lr"] = lr / math.sqrt(t + 1)  # the handout's decay, as a schedule sets it
        opt.zero_grad()
        loss = (w ** 2).mean()
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses


class AdaGrad(_Optimizer):
    """Per-coordinate step sizes from all past squared gradients (Duchi et al. 2011):
    G <- G + g^2;  theta <- theta - lr * g / sqrt(G + eps)  (eps inside the root, as in the lecture)."""

    def __init__(self, params, lr=0.01, eps=1e-5):
        super().__init__(params, dict(lr=lr, eps=eps))

    def _update(self, group, params):
        for p in params:
            G = self._zeros(p, "sum_sq").addcmul_(p.grad, p.grad)
            p.addcdiv_(p.grad, (G + group["eps"]).sqrt(), value=-group["lr"])


class RMSProp(_Optimizer):
    """AdaGrad with an exponential average of g^2 instead of the sum (Tieleman & Hinton 2012), so that the step
    follows the gradients' recent scale instead of shrinking for ever:
    G <- alpha G + (1 - alpha) g^2;  theta <- theta - lr * g / sqrt(G + eps)  (eps inside the root, as AdaGrad's;
    torch.optim.RMSprop adds it outside, so the two differ where G is near 0)"""

    def __init__(self, params, lr=1e-3, alpha=0.99, eps=1e-8):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    def _update(self, group, params):
        for p in params:
            G = self._zeros(p, "square_avg").mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
            p.addcdiv_(p.grad, (G + group["eps"]).sqrt(), value=-group["lr"])


def _on_device(like, *numbers):
    """Numbers as 0-dim tensors on like's device, for compiled code: a new lr or t is then new data for the same
    graph, not a recompile. One copy, which the host does not wait for; the precision eager ops use for numbers."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    return list(torch.tensor(numbers, dtype=dtype).to(like.device, non_blocking=True).unbind())


def _adamw_math(params, grads, ms, vs, step_sizes, decay, b1, b2, eps):
    """Algorithm 1's arithmetic for all of a group's tensors at once: step_sizes[i] = -a_t of params[i],
    decay = 1 - lr * weight_decay (numbers; 0-dim tensors when compiled). Each _foreach op does one line of the
    per-parameter loop for every tensor; for one tensor p, with gradient g and state m, v, the loop is
        m.lerp_(g, 1 - b1);  v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.addcdiv_(m, v.sqrt() + eps, value=-a_t);  p.mul_(1 - lr * weight_decay)"""
    torch._foreach_lerp_(ms, grads, 1 - b1)  # m + (1-b1)(g - m) = b1 m + (1-b1) g
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, 1 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_add_(denom, eps)
    torch._foreach_div_(denom, step_sizes)  # (sqrt(v) + eps) / -a_t: foreach addcdiv takes no tensors as a_t
    torch._foreach_addcdiv_(params, ms, denom)  # theta - a_t m / (sqrt(v) + eps); lr = 0: m / inf = 0, no step
    torch._foreach_mul_(params, [decay] * len(params))  # a list: torch 2.5 compiles a single tensor factor apart


class AdamW(_Optimizer):
    """Adam = RMSProp's average of g^2 + momentum's average of g, both bias-corrected (Kingma & Ba 2015); AdamW
    decouples the decay: the handout's Algorithm 1 (Loshchilov & Hutter), t counted from 1 per parameter:
    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    a_t = lr * sqrt(1 - b2^t) / (1 - b1^t)          (bias correction folded into the step size)
    theta <- theta - a_t * m / (sqrt(v) + eps)
    theta <- theta - lr * weight_decay * theta       (decoupled decay, after the update)
    compiled=True runs the same _adamw_math through torch.compile, which fuses each parameter's arithmetic
    into one pass over its tensors (eager, each _foreach op is a pass of its own). It needs what torch.compile
    needs (a C++ compiler on a CPU): config.py checks for one before --compile. fused=True (without compiled) runs
    float32 CPU tensors through fast_cpu.adamw instead, one pass compiled by numba: no C++ compiler, no wait."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, compiled=False,
                 fused=False, more_defaults=None):  # more_defaults: a subclass's own hyperparameters (Muon's)
        betas = tuple(betas) if isinstance(betas, list) else betas  # a scalar or a str: refused by its rule
        if type(compiled) is not bool or type(fused) is not bool:  # compiled="no" is true
            raise ValueError(f"compiled and fused must be True or False, got compiled={compiled!r}, fused={fused!r}.")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **(more_defaults or {})))
        self.compiled, self.fused = compiled, fused
        self._math = torch.compile(_adamw_math, dynamic=False) if compiled else _adamw_math  # shapes never change

    def _update(self, group, params):
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if not state:  # t counts from 1 per parameter; m and v start at zero
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
        step_sizes = [-lr * math.sqrt(1 - b2 ** s["step"]) / (1 - b1 ** s["step"]) for s in states]  # -a_t
        decay = 1 - lr * wd
        tensors = params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        if self.fused and not self.compiled and fast_cpu.usable(*(t for ts in tensors for t in ts), in_place=True):
            return fast_cpu.adamw(*tensors, step_sizes, decay, b1, b2, eps)  # one pass over memory per tensor
        if self.compiled:
            *step_sizes, decay = _on_device(params[0], *step_sizes, decay)
        self._math(*tensors, step_sizes, decay, b1, b2, eps)


def Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, **kwargs):  # AdamW without the decay, as defined above
    if kwargs.pop("weight_decay", 0) != 0:  # popped: passed on, it would meet AdamW's own (a TypeError)
        raise ValueError("Adam has no weight decay (it is AdamW with weight_decay=0): use AdamW(params, lr, "
                         "weight_decay=...), whose decay is decoupled from the gradient.")
    return AdamW(params, lr, betas, eps, weight_decay=0.0, **kwargs)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan (2024): a, b, c of newton_schulz's quintic
NS_STEPS = 5  # Jordan's: newton_schulz's steps in Muon, as accounting.muon_flops counts them


def newton_schulz(G, steps=NS_STEPS, dtype=torch.float32):
    """About U V^T of G = U S V^T, its nearest semi-orthogonal matrix: the singular vectors kept, each singular
    value moved near 1. Divided by its Frobenius norm, G's singular values s lie in (0, 1]; each step
    X <- a X + b (X X^T) X + c (X X^T)^2 X maps s to a s + b s^3 + c s^5. These coefficients trade accuracy for
    speed (a = 3.4445: a small s grows fast): 5 steps leave s in about [0.7, 1.2], not at 1 (an s near 0 stays
    below). X X^T: (m, m), m <= n.
    G may be a stack (k, m, n) of matrices of one shape: each is orthogonalized on its own, in batched matmuls.
    Each sum is the matmul's own: baddbmm(C, A, B, beta, alpha) = beta C + alpha A B in one call (on a GPU, one
    kernel instead of a matmul and a pass over its output)."""
    tall = G.shape[-2] > G.shape[-1]
    W = G.mT if tall else G  # (..., m, n), m <= n
    X = W.to(dtype).reshape(math.prod(W.shape[:-2]), *W.shape[-2:])  # (k, m, n): baddbmm takes a stack
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # each matrix's own norm; + 1e-7: a zero update stays zero
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        A = X @ X.mT  # (k, m, m)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    X = X.reshape(W.shape)
    return X.mT if tall else X


NOT_HIDDEN = ("embed", "lm_head", "wte", "wpe")  # named so, a matrix takes AdamW in Muon: embeddings and output heads


def _muon_math(params, grads, bufs, lr, decay, mu, nesterov, steps, dtype):
    """Muon's update of each hidden matrix; lr and decay = 1 - lr * weight_decay are numbers, or 0-dim tensors
    when compiled (no host sync: nothing is read back). The matrices of one shape (a model's q, k, v and output
    projections) are orthogonalized as one stack: a few batched matmuls, not a dozen small ones a step each. A tall
    matrix joins the stack of its transpose's shape (W1 and W3 (d_ff, d) with W2 (d, d_ff)): newton_schulz turns
    each tall one wide anyway, and NS(U^T) = NS(U)^T. The per-matrix arithmetic around it is _foreach ops, as in
    _adamw_math: compiled, each is one kernel over all the matrices, where a loop of ops made two kernels a matrix."""
    torch._foreach_lerp_(bufs, grads, 1 - mu)  # B + (1 - mu)(g - B) = mu B + (1 - mu) g
    U = torch._foreach_lerp(grads, bufs, mu) if nesterov else bufs
    stacks, updates = {}, [None] * len(params)
    for i, p in enumerate(params):  # (m, n) with m <= n, and the dtype the update is scaled in
        stacks.setdefault((tuple(sorted(p.shape)), p.dtype), []).append(i)
    for (shape, p_dtype), idx in stacks.items():
        wide = torch.stack([U[i].mT if U[i].shape[0] > U[i].shape[1] else U[i] for i in idx])  # (k, m, n)
        O = newton_schulz(wide, steps, dtype).to(p_dtype) * (lr * 0.2 * max(shape) ** 0.5)
        for i, O_i in zip(idx, O.unbind()):
            updates[i] = O_i.mT if O_i.shape != params[i].shape else O_i
    torch._foreach_sub_(params, updates)
    torch._foreach_mul_(params, [decay] * len(params))  # a list, as in _adamw_math


class Muon(AdamW):
    """Muon (Jordan et al. 2024): SGD-momentum whose update of each 2-D hidden matrix W (m, n) is replaced by the
    nearest semi-orthogonal matrix, so that every direction of it moves by the same amount:
    B <- mu B + (1 - mu) g                  (one buffer per matrix; AdamW keeps two)
    U = mu B + (1 - mu) g                   (Nesterov: the average one step ahead; nesterov=False: U = B)
    W <- W - lr * 0.2 sqrt(max(m, n)) * newton_schulz(U)
    W <- W - lr * weight_decay * W
    A semi-orthogonal (m, n) matrix has RMS 1 / sqrt(max(m, n)): the scale makes each update's RMS 0.2 lr, about an
    AdamW update's, as Moonlight does (Liu et al. 2025), so that one lr and weight decay serve both groups and carry
    over from AdamW (the reference's max(1, m/n)^0.5 evens out shapes of one fan-in only, at an lr of its own).
    The rest (embedding, head, RMSNorm gains) take AdamW, as in nanochat: given model.named_parameters(), each 2-D
    one whose name holds none of NOT_HIDDEN takes Muon; or pass groups with muon=True/False. Newton-Schulz runs in
    bf16 on a GPU (tensor cores; near orthogonal is enough), else in float32 (float64 weights: float64), or ns_dtype."""

    def __init__(self, params, lr=1e-3, momentum=0.95, nesterov=True, ns_steps=NS_STEPS, betas=(0.9, 0.95), eps=1e-8,
                 weight_decay=0.01, compiled=False, fused=False, muon=None, ns_dtype=None):
        if ns_dtype is not None and not (isinstance(ns_dtype, torch.dtype) and ns_dtype.is_floating_point):
            raise ValueError(f"ns_dtype must be None or a floating-point torch.dtype, got {ns_dtype!r}.")  # not "bf16"
        params = list(params)
        if muon is None and params and all(type(x) is tuple and len(x) == 2 and isinstance(x[0], str)
                                           for x in params):  # model.named_parameters()
            split = {True: [], False: []}  # hidden matrices (Muon), the rest (AdamW)
            for n, p in params:
                split[p.ndim == 2 and not any(s in n.lower() for s in NOT_HIDDEN)].append(p)
            params = [dict(params=ps, muon=hidden) for hidden, ps in split.items() if ps]
        super().__init__(params, lr, betas, eps, weight_decay, compiled, fused,
                         dict(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, muon=muon))
        self.ns_dtype = ns_dtype
        self._muon = torch.compile(_muon_math, dynamic=False) if compiled else _muon_math

    def add_param_group(self, group):
        if not isinstance(group, dict):  # said once, in _Optimizer's
            return super().add_param_group(group)
        params = _param_list(group["params"])
        tensors = [p[1] if type(p) is tuple and len(p) == 2 else p for p in params]  # a named group's (name, p) too
        flat = [tuple(p.shape) for p in tensors if torch.is_tensor(p) and p.ndim != 2]  # (tensor, tensor): muon=None
        muon = group.get("muon", self.defaults["muon"])
        if muon is None:  # model.parameters(), as torch.optim takes them
            raise ValueError("Muon needs to know which matrices are hidden: pass model.named_parameters(), or groups "
                             "with muon=True (2-D hidden matrices) and muon=False (the rest, stepped by AdamW).")
        if muon is True and flat:
            raise ValueError(f"Muon orthogonalizes 2-D matrices, and its muon=True group holds shapes {flat[:3]}.")
        super().add_param_group({**group, "params": params})

    def _update(self, group, params):
        if not group["muon"]:
            return super()._update(group, params)
        dtype = self.ns_dtype or (torch.bfloat16 if params[0].is_cuda else torch.promote_types(params[0].dtype,
                                                                                                torch.float32))
        lr, decay = group["lr"], 1 - group["lr"] * group["weight_decay"]
        if self.compiled:
            lr, decay = _on_device(params[0], lr, decay)
        self._muon(params, [p.grad for p in params], [self._zeros(p, "momentum_buffer") for p in params], lr, decay,
                   group["momentum"], group["nesterov"], group["ns_steps"], dtype)


# ----------------------------------------------------------------------------
# 3. Learning-rate schedule

def cosine_lr(it, max_lr, min_lr, warmup_iters, cosine_cycle_iters):
    """Warm-up  (t < Tw):        lr = t / Tw * max_lr
    Cosine    (Tw <= t <= Tc):  lr = min_lr + (1 + cos(pi (t - Tw) / (Tc - Tw))) / 2 * (max_lr - min_lr)
    After     (t > Tc):         lr = min_lr
    """
    # a rate < 0 would ascend; min_lr > max_lr (the two swapped) would climb from max_lr to min_lr
    lrs_ok = all(_number(x) and 0 <= x < math.inf for x in (max_lr, min_lr)) and min_lr <= max_lr
    steps_ok = all(_number(x) for x in (it, warmup_iters, cosine_cycle_iters))  # "1" or None: no comparison
    if not (lrs_ok and steps_ok and it >= 0 and 0 <= warmup_iters <= cosine_cycle_iters):  # a NaN fails too
        raise ValueError(f"Need finite 0 <= min_lr <= max_lr, 0 <= it and 0 <= warmup_iters <= cosine_cycle_iters, "
                         f"got {max_lr!r}, {min_lr!r}, {it!r}, {warmup_iters!r}, {cosine_cycle_iters!r}.")
    if it < warmup_iters:
        return it / warmup_iters * max_lr
    if it >= cosine_cycle_iters:  # equal to the cosine's end value at t = Tc, and avoids 0/0 when Tc = Tw
        return min_lr
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# ----------------------------------------------------------------------------
# 4. Gradient clipping

@torch.no_grad()
def clip_grad_norm(parameters, max_l2_norm, eps=1e-6, fused=False):
    """If ||g||_2 over all gradients is at least M, scale every .grad in place by M / (||g||_2 + eps).
    Returns the norm before clipping, a 0-dim float32 tensor (float64 if a gradient is; zero without gradients).
    The choice to clip is made on the device (torch.where): reading the norm back makes the host wait for the GPU.
    fused=True: float32 CPU gradients take the engine's two passes (fast_cpu.py), which sum in float64. Float32
    gradients whose sum of squares passes float32's largest number (a norm past about 1.8e19) have an inf norm
    here, which zeroes every gradient, as torch's clip_grad_norm_ does (train.py stops such a run as diverged);
    the engine's float64 sum clips them instead."""
    # M or eps < 0 can flip every gradient (ascent); a NaN M never clips, a NaN eps zeroes them
    if not (_number(max_l2_norm) and max_l2_norm >= 0 and _number(eps) and 0 <= eps < math.inf):
        raise ValueError(f"max_l2_norm and eps must be numbers >= 0, got {max_l2_norm!r} and {eps!r}.")
    params = _param_list(parameters)
    if not all(map(torch.is_tensor, params)):  # model.named_parameters(): "'tuple' object has no attribute 'grad'"
        what = type(next(p for p in params if not torch.is_tensor(p))).__name__
        raise TypeError(f"clip_grad_norm takes tensors (model.parameters()), got a {what} among them.")
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    if fused and fast_cpu.usable(*grads, in_place=True):
        return fast_cpu.clip_grad_norm(grads, max_l2_norm, eps)
    # float64 if any gradient is: its norm can pass float32's max (inf would zero every gradient); float16's norm
    # would pass 65504 as soon as a gradient is large, so each tensor's norm is computed in this dtype, not its own
    dtype = torch.float64 if torch.float64 in {g.dtype for g in grads} else torch.float32
    norms = torch._foreach_norm(grads, 2, dtype=dtype)  # one L2 norm per tensor
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = torch.where(total >= max_l2_norm, max_l2_norm / (total + eps), 1.0)  # below M: g times 1, as it is
    torch._foreach_mul_(grads, scale)
    return total
