"""The fast path's engine for the model's last step: the head's matmul and the cross-entropy fused, over chunks of
rows, so that neither the (N, V) logits nor their gradient is ever held. train.py's LMLoss calls it at one
visible place (the fast path; --no-fused-head or --no-fast keeps model.py's logits and LMLoss's other losses).
test_all.py checks it against optim.cross_entropy on model.py's logits (values and gradients).

The lessons it embodies:
  1. The logits are the largest tensor of a step: N = batch x context rows of V numbers. At the GPT-2-small shape
     (batch 32 x 1,024, V 50,304) that is 1.6G numbers, 3.3 GB in bfloat16, written by the head, read back by the
     loss, and again as their gradient, all to reduce each row to one number (the loss) and two small matrices
     (the gradients of the hidden state, N x d, and of the head, V x d).
  2. A row's loss and its gradient need only that row: log-sum-exp over its V logits, then softmax - onehot.
     So C rows at a time suffice: logits (C, V) -> the rows' losses and their gradient g (C, V) -> dh = g W for
     those rows, and dW += g^T h. Only C x V numbers are alive at once; the rest is N x d and V x d.
  3. The gradient is computed in the forward, chunk by chunk, while the chunk's logits are at hand: recomputing
     them in the backward (the textbook way to save memory) would cost a fourth matmul of the head, 2 N V d more
     FLOPs, 9% of a GPT-2-small step's. Backward then only scales the two saved gradients by the loss's own
     gradient. Evaluation (no gradient wanted) computes the loss alone.
  4. The matmuls run in the compute dtype (bfloat16 under autocast, as the plain path's Linear does), each chunk's
     log-sum-exp in float32 (a sum of V terms loses digits in 8 bits), and dW is summed over chunks in float32:
     the plain path rounds one bfloat16 matmul over all rows, this one rounds each chunk's and adds in float32.
  5. Nothing here reads a number back to the host (no .item(), no branch on a value), so under torch.compile the
     whole step stays one graph, and on a GPU the host never waits for it.
  6. The number of chunks, not their rows, is fixed (CHUNKS): the memory saved is then the same share of the
     logits at any batch, and dW's float32 sum (a read and a write of V x d per chunk) costs the same at any batch.
  7. Compiled, an in-place op becomes a new buffer and a copy, and inductor does not always write back in place:
     dW += g^T h chained one (V, d) buffer into the next, and the backward's scaling made one more. The two
     in-place steps are therefore custom ops that declare what they mutate, and run in place in the graph.
     On a CPU, inductor still holds two chunks at once (a chunk's logits, and their gradient written beside them),
     so a compiled step holds (2/CHUNKS) of the logits where the plain compiled path holds them once (it writes
     their gradient over them): it saves (1 - 2/CHUNKS) of their size, not all of it.
  8. Measure where it runs. On a CPU it wins, eager and compiled: less memory, and faster. On the H200, compiled,
     this torch chunk held more than the plain compiled path, which never writes float32 logits, and the step was
     no faster: a GPU takes lesson 9's kernel instead.
  9. On the H200 the loss around the head's matmul was a large share of a GPT-2-small step (docs/results.md):
     inductor's log-sum-exp read the bf16 logits at a third of the memory's speed, then its gradient read them
     again and wrote them. On a
     GPU with Triton a chunk's loss and gradient are therefore one kernel: each program reads its row twice (the
     log-sum-exp, then the gradient) and writes the gradient over the logits: the same bytes as inductor's two
     kernels, all at the memory's speed. Compiled, a step holds one (C, V) chunk of the compute dtype at a time
     (on a CPU inductor's code reuses one buffer; on a GPU each chunk's is freed before the next), where lesson
     7's torch chunk held a float32 chunk and its gradient beside it. On the H200 (docs/results.md), the head
     and loss alone were faster than the logits path and held a third of its memory; in a step whose kernels are
     launched one at a time it was no faster (its chunks' launches cost the host), and under CUDA graphs the step
     with it and the Triton gate was the fastest measured. So config.resolve_config turns it on by default for a
     step compiled on a GPU only where CUDA graphs replay it (--cuda-graph, on by default there).
"""
import torch

from fast_gpu import on_its_gpu, tl, triton, usable  # the GPU engine's Triton (None without it: torch ops then)
from optim import check_class_ids

CHUNKS = 4  # by measurement (bench.py head; docs/results.md): on a CPU, compiled, 4 is the fastest count that holds
# less than the logits (lesson 7); 8 and 16 hold less and take longer. On the H200 with lesson 9's kernel, fewer
# chunks were a little faster and more held less: 4 kept, a third of the logits path's peak, the count its step won


# ----------------------------------------------------------------------------
# The two in-place steps, as ops the compiler keeps in place (lesson 7)

@torch.library.custom_op("cs336_fused_head::accumulate_", mutates_args=("out",))
def _accumulate_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """out += a @ b: the product in a's dtype (bfloat16 under autocast), summed into out in out's (float32)."""
    if out.dtype == a.dtype:
        out.addmm_(a, b)  # the sum inside the matmul: no (V, d) temporary
        return
    # a CPU's add_ first copies a bfloat16 operand to float32 (CUDA casts inside its kernel): there, an eighth of
    # the rows at a time, or the product and its copy would be two more (V, d) buffers
    rows = -(-len(out) // 8) if out.device.type == "cpu" else len(out)
    for part, a_part in zip(out.split(rows), a.split(rows)):
        part.add_(a_part @ b)


@torch.library.custom_op("cs336_fused_head::scale_", mutates_args=("out",))
def _scale_(out: torch.Tensor, factor: torch.Tensor) -> None:
    out.mul_(factor)


if triton is not None:
    @triton.jit
    def _loss_and_grad_kernel(z_ptr, targets_ptr, losses_ptr, row_stride, scale, V: tl.constexpr, BLOCK: tl.constexpr):
        """One row of z per program: its loss, log-sum-exp minus the target's logit (float32), then its gradient,
        (softmax - onehot) * scale, written over the row in z's dtype."""
        row = z_ptr + tl.program_id(0).to(tl.int64) * row_stride
        m = float("-inf")  # the running max, and the sum of exp(z - m)
        s = 0.0
        for start in range(0, V, BLOCK):  # pass 1: an online log-sum-exp, one exp per number
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
            m = m_new
        lse = m + tl.log(s)
        target = tl.load(targets_ptr + tl.program_id(0))
        inside = (target >= 0) & (target < V)  # an id past the vocabulary: a NaN loss, not another row's number
        target_logit = tl.load(row + target, mask=inside, other=float("nan")).to(tl.float32)
        tl.store(losses_ptr + tl.program_id(0), lse - target_logit)
        for start in range(0, V, BLOCK):  # pass 2: the gradient, over the logits
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(row + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = tl.exp(z - lse) - (cols == target).to(tl.float32)
            tl.store(row + cols, (g * scale).to(z_ptr.dtype.element_ty), mask=cols < V)


LOSS_BLOCK = 2048  # a row's columns per step of its two passes (the log-sum-exp, then the gradient): a power of two


@torch.library.custom_op("cs336_fused_head::loss_and_grad_", mutates_args=("z",))
def _loss_and_grad_(z: torch.Tensor, targets: torch.Tensor, n: int) -> torch.Tensor:
    """z (C, V) a chunk's logits, contiguous rows -> each row's loss (C,) float32; z becomes the rows' gradient of
    the mean loss over n rows, (softmax - onehot) / n, in place (lesson 9: Triton's kernel)."""
    losses = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    with on_its_gpu(z):
        _loss_and_grad_kernel[(z.shape[0],)](z, targets.contiguous(), losses, z.stride(0), 1.0 / n, V=z.shape[1],
                                             BLOCK=LOSS_BLOCK)
    return losses


@_loss_and_grad_.register_fake
def _(z, targets, n):
    return z.new_empty(z.shape[0], dtype=torch.float32)


def compute_dtype(h):
    """The matmuls' dtype: autocast's where it is on (bfloat16 on a GPU), else h's own (float64's always: autocast
    leaves float64 matmuls alone, as model.py's Linear then runs them)."""
    device = h.device.type
    on = torch.is_autocast_enabled(device) and h.dtype != torch.float64
    return torch.get_autocast_dtype(device) if on else h.dtype


def _chunk(hc, wc, targets, n, want_grad):
    """One chunk: hc (C, d), wc (V, d) in the compute dtype, targets (C,) -> (the chunk's summed loss in float32,
    its gradient with respect to its logits, (softmax - onehot) / n, in the compute dtype, or None). On a GPU with
    Triton, one kernel (lesson 9); otherwise, eager, one (C, V) float32 buffer: the logits become exp(z - max), then
    the softmax, then its gradient, in place."""
    if want_grad and usable(hc):  # one kernel, over the compute dtype's logits (lesson 9)
        z = hc @ wc.t()  # (C, V), contiguous rows
        return _loss_and_grad_(z, targets, n).sum(), z
    z = (hc @ wc.t()).to(torch.promote_types(hc.dtype, torch.float32))  # (C, V): this chunk's logits, float32
    target_logit = z.gather(-1, targets[:, None])  # (C, 1)
    m = z.amax(dim=-1, keepdim=True)  # (C, 1): subtracted, so exp stays finite
    s = z.sub_(m).exp_().sum(dim=-1, keepdim=True)  # z is now exp(z - m)
    loss = (m + s.log() - target_logit).sum()  # log-sum-exp minus the target's logit, summed over the rows
    if not want_grad:
        return loss, None
    g = z.div_(s)  # the softmax
    if torch.compiler.is_compiling():  # the one-hot as a comparison: inductor fuses it into the kernel writing g
        g = g - (torch.arange(g.shape[-1], device=g.device) == targets[:, None]).to(g.dtype)
    else:  # eager: 1 subtracted in place at the targets (a (C, V) mask would be one more buffer and pass)
        g.scatter_add_(-1, targets[:, None], torch.full_like(s, -1.0))
    return loss, g.div_(n).to(hc.dtype)


def _head_and_loss(h, weight, targets, chunks, want_h, want_w):
    """h (N, d), weight (V, d), targets (N,) -> (mean loss, dloss/dh (N, d) or None, dloss/dweight (V, d) or
    None), C rows at a time. The gradients are d(mean loss): backward scales them by the loss's gradient."""
    n, dtype = h.shape[0], compute_dtype(h)
    rows = max(1, -(-n // chunks))  # rows per chunk: n in `chunks` nearly equal parts, at least one row each
    hc, wc = h.to(dtype), weight.to(dtype)  # one cast each (no copy without autocast)
    dh = torch.empty_like(h) if want_h else None
    dw_dtype = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64 for a float64 head
    dw = torch.zeros(weight.shape, dtype=dw_dtype, device=weight.device) if want_w else None
    total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=h.device)
    for i in range(0, n, rows):
        loss, g = _chunk(hc[i:i + rows], wc, targets[i:i + rows], n, want_h or want_w)
        total = total + loss
        if want_h:
            dh[i:i + rows] = g @ wc  # (C, d), cast to h's dtype as it is written
        if want_w:
            _accumulate_(dw, g.t(), hc[i:i + rows])  # (V, d) += (V, C) @ (C, d)
        del g  # freed before the next chunk's logits are made: two chunks alive at once would double the memory
    return total / n, dh, dw


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss, with its two gradients made in the forward (lesson 3) and scaled in the backward."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunks, want_h, want_w):
        loss, dh, dw = _head_and_loss(h, weight, targets, chunks, want_h, want_w)
        ctx.save_for_backward(*(t for t in (dh, dw) if t is not None))
        ctx.wants, ctx.weight_dtype, ctx.used = (want_h, want_w), weight.dtype, False
        return loss

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: the gradients are numbers made in the forward, not a graph
            raise ValueError("fused_head.linear_cross_entropy has no second derivative; use model.py's logits and "
                             "optim.cross_entropy (--no-fused-head) with create_graph.")
        if ctx.used:  # the saved gradients were scaled in place by the first backward (retain_graph=True)
            raise ValueError("fused_head.linear_cross_entropy's gradients were spent by a first backward; for a second "
                             "through the same graph use model.py's logits and optim.cross_entropy (--no-fused-head).")
        ctx.used = True
        saved = iter(ctx.saved_tensors)
        dh, dw = (next(saved) if want else None for want in ctx.wants)
        for gradient in (dh, dw):
            if gradient is not None:
                _scale_(gradient, grad)  # in place: the saved buffer is this call's own
        return dh, None if dw is None else dw.to(ctx.weight_dtype), None, None, None, None


def linear_cross_entropy(h, weight, targets, chunks=CHUNKS):
    """optim.cross_entropy(h @ weight.T, targets), the mean over all rows, and its gradients for h and weight,
    without the (N, V) logits: h (..., d) the hidden state the head reads (model.py's forward(head=False)),
    weight (V, d) the head's (the shared matrix with tied embeddings: its gradient lands there), targets (...)
    int -> a 0-dim tensor. Under autocast the matmuls run in its dtype and the loss in float32. The ids must lie in
    [0, V), and are not read back to check (a host sync, lesson 5; train.py checks its data's once): one past V is
    a NaN loss in Triton's kernel, torch's error (a GPU's device assert) in a torch chunk."""
    if h.shape[:-1] != targets.shape or weight.dim() != 2 or weight.shape[1] != h.shape[-1] \
            or not (h.is_floating_point() and weight.is_floating_point()):  # an integer h cast the head to integers
        raise ValueError(f"hidden state {tuple(h.shape)}, head weight {tuple(weight.shape)} and targets "
                         f"{tuple(targets.shape)} do not fit: need (..., d) and (V, d) of floating point ({h.dtype} "
                         f"and {weight.dtype} here), and (...).")
    check_class_ids(targets)
    h2, t = h.reshape(-1, h.shape[-1]), targets.reshape(-1).long()  # gather wants int64 ids (torch before 2.8)
    grad = torch.is_grad_enabled()
    want_h, want_w = grad and h.requires_grad, grad and weight.requires_grad
    if not (want_h or want_w):  # evaluation: the loss alone, chunk by chunk
        return _head_and_loss(h2, weight, t, chunks, False, False)[0]
    return _LinearCrossEntropy.apply(h2, weight, t, chunks, want_h, want_w)
