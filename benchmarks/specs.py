"""One table of op specs: inputs, shapes, the bytes each op must move, and how every variant is called.

Argument convention: a spec's ``make`` returns ``Inputs(args, leaves, grads_out)``. Every variant
(``npu_liger``, ``eager``, ``torch.compile`` of eager, ``liger``) is a function ``f(*args) -> tuple of outputs``;
forward+backward runs ``torch.autograd.grad(f(*args), leaves, grads_out)``. The rope family's q/k leaves are
(bsz, seq, heads, head_dim) tensors that the rope/mrope variants transpose to (bsz, heads, seq, head_dim), as
models do; llama4 takes them as they are.

Bytes (the roofline every op is judged against; each input read once, each output written once):

==================  ===================================================  ==========================================
op                  forward                                              forward + backward
==================  ===================================================  ==========================================
geglu, swiglu       a, b read, c written: 3 N                            + grad_c, a, b read, grad_a, grad_b: 8 N
rope family         q, k read and written: 2 (Nq + Nk)                   + dq, dk read and written: 4 (Nq + Nk)
embedding           gather: T x D read, T x D written                    + grad T x D read, dW V x D written once
tvd                 p, q read: 2 N                                       + grad_p written: 3 N (q: no grad)
rms_norm,           x read, y written: 2 N                               + dy, x read, dx written: 5 N
layer_norm
fused_add_rms_norm  x, residual read, y, s written: 4 N                  + dy, ds, s read, dx written: 8 N
                                                                         (x and residual share one gradient)
softmax,            x read, y written: 2 N (rows that fit one tile)      + dy, y read, dx written: 5 N
sparsemax


dyt, poly_norm,     x read, y written: 2 N                               + dy, x read, dx written: 5 N
group_norm
cross_entropy       logits read: N                                       logits read twice (a row does not fit on
                                                                         chip), grad written: 3 N (the training
                                                                         call is one launch; backward scales in
                                                                         place only if grad_out != 1)
fused_linear_ce     compute-bound (3 matmuls of BT x H x V): bytes are   x, W read, grad_x, grad_W written
                    x and W read, for the table's sake
kl_div              y_pred, y_true read: 2 N                             + y_true read, grad written: 4 N
jsd                 log_q, log_p read: 2 N                               the training call reads both once, writes
                                                                         the grad: 3 N (one launch)
fused_linear_jsd    compute-bound (4 matmuls of BT x H x V): bytes are   + grad_x, grad_W written
                    both inputs and weights read
grpo_loss           logits read: N                                       logits read twice, grad written: 3 N
fused_moe           compute-bound (2 grouped matmuls, T*K x H x 2I and   + grads of x and both weights written,
                    T*K x I x H): bytes are x and both weights read,     read again: 2x the forward's
                    out written, for the table's sake
==================  ===================================================  ==========================================

(cos/sin/freqs tables, indices, scalar losses and norm weights are left out, as in the issue's definitions.)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import reference

SWEEP_TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)
# 16 sequence lengths for the compile-count check: odd, prime, powers of two and not, small and large.
COMPILE_SEQ_LENS = (3, 17, 64, 100, 128, 255, 256, 333, 512, 777, 1000, 1024, 1500, 2048, 3001, 4096)
ROPE_THETA = 10000.0
# The incoming gradient of every scalar loss's row (run.py --loss-grad). 1 is ``loss.backward()``; anything else is
# a scaled loss (``loss / gradient_accumulation_steps``, fp16 loss scaling), where a loss that computes its
# gradient in the forward pays one more pass over it to scale it (ours, Liger's cross-entropy losses).
LOSS_GRAD = 1.0


@dataclass
class Inputs:
    args: Tuple  # positional arguments of every variant
    leaves: Tuple[torch.Tensor, ...]  # tensors that receive gradients
    grads_out: Tuple[torch.Tensor, ...]  # one per output


@dataclass
class Case:
    op: str
    kind: str  # "main", "sweep", "smoke", "tiny", "compile"
    params: Dict
    dtype: torch.dtype

    @property
    def spec(self) -> "OpSpec":
        return SPECS[self.op]

    @property
    def label(self) -> str:
        return self.spec.label(self.params) + " " + DTYPE_NAMES[self.dtype]

    @property
    def tokens(self) -> int:
        return self.spec.tokens(self.params)

    def bytes(self, backward: bool) -> int:
        fn = self.spec.bytes_fb if backward else self.spec.bytes_fwd
        return int(fn(self.params, _itemsize(self.dtype)))


@dataclass
class OpSpec:
    name: str
    dtype: torch.dtype
    main: List[Dict]
    sweep: Callable[[int], Dict]  # tokens -> params
    smoke: Dict  # tiny shapes for the CPU smoke run (Triton interpreter)
    tiny: Dict  # dispatch-overhead shapes
    compile_case: Callable[[int], Dict]  # sequence length -> params
    label: Callable[[Dict], str]
    tokens: Callable[[Dict], int]
    make: Callable[[Dict, torch.dtype, str, torch.Generator], Inputs]
    eager: Callable
    npu_args: Callable  # variant args -> the op's positional schema arguments
    bytes_fwd: Callable[[Dict, int], float]
    bytes_fb: Callable[[Dict, int], float]
    notes: str = ""
    module: Optional[str] = None  # the npu_ops module holding the launcher, when not named after the op
    n_outputs: Optional[int] = None  # the op's outputs the variants compare (grpo_loss: the loss, not its statistics)
    # more baselines beside eager, torch.compile and Liger: name -> f(*args) (e.g. transformers' grouped_mm experts)
    peers: Dict[str, Callable] = field(default_factory=dict)

    def cases(self, kind: str) -> List[Case]:
        if kind == "main":
            return [Case(self.name, "main", dict(p), self.dtype) for p in self.main]
        if kind == "sweep":
            main_tokens = {self.tokens(p) for p in self.main}
            return [Case(self.name, "sweep", self.sweep(t), self.dtype) for t in SWEEP_TOKENS if t not in main_tokens]
        if kind == "smoke":
            return [Case(self.name, "smoke", dict(self.smoke), self.dtype)]
        if kind == "tiny":
            return [Case(self.name, "tiny", dict(self.tiny), self.dtype)]
        raise ValueError(kind)

    # --- npu_liger entry points -------------------------------------------------------------------------
    def op(self):
        """``torch.ops.npu_liger.<name>.default``."""
        import npu_liger  # noqa: F401  (defines the ops)

        return getattr(torch.ops.npu_liger, self.name).default

    def functional(self):
        import npu_liger

        return getattr(npu_liger, self.name)

    def launcher(self):
        """The raw host launcher ``npu_liger.npu_ops.<name>.<name>_forward`` (what the op's kernel key calls)."""
        module = importlib.import_module(f"npu_liger.npu_ops.{self.module or self.name}")
        return getattr(module, f"{self.name}_forward")

    def npu_variant(self, entry: str = "functional") -> Callable:
        target = self.functional() if entry == "functional" else self.op()
        npu_args = self.npu_args

        def run(*args):
            out = target(*npu_args(*args))
            return (tuple(out) if isinstance(out, (tuple, list)) else (out,))[: self.n_outputs]

        return run

    def eager_variant(self) -> Callable:
        return _as_tuple_fn(self.eager)

    def compiled_variant(self, **compile_kwargs) -> Callable:
        """``torch.compile`` of the eager formula itself: each op has its own code object, so Dynamo's per-code
        cache (and recompile limit) is per op, and shape changes across the sweep go dynamic once."""
        return _as_tuple_fn(torch.compile(self.eager, **compile_kwargs))


def _as_tuple_fn(fn: Callable) -> Callable:
    def run(*args):
        out = fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return run


DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _randn(shape, dtype, device, gen, requires_grad=False, scale=1.0):
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    t = t.to(dtype)
    return t.requires_grad_(requires_grad)


def _loss_grad(dtype, device) -> torch.Tensor:
    """The incoming gradient of a scalar loss: ``LOSS_GRAD``."""
    return torch.full((), LOSS_GRAD, dtype=dtype, device=device)


# --- geglu / swiglu ------------------------------------------------------------------------------------------

def _make_gated(p, dtype, device, gen):
    shape = (p["tokens"], p["hidden"])
    a = _randn(shape, dtype, device, gen, True)
    b = _randn(shape, dtype, device, gen, True)
    return Inputs((a, b), (a, b), (_randn(shape, dtype, device, gen),))


def _gated_spec(name, eager):
    return OpSpec(
        name=name,
        dtype=torch.bfloat16,
        main=[dict(tokens=8192, hidden=14336)],
        sweep=lambda t: dict(tokens=t, hidden=14336),
        smoke=dict(tokens=6, hidden=37),
        tiny=dict(tokens=4, hidden=64),
        compile_case=lambda s: dict(tokens=2 * s, hidden=4096),
        label=lambda p: f"{p['tokens']}x{p['hidden']}",
        tokens=lambda p: p["tokens"],
        make=_make_gated,
        eager=eager,
        npu_args=lambda a, b: (a, b),
        bytes_fwd=lambda p, s: 3 * p["tokens"] * p["hidden"] * s,
        bytes_fb=lambda p, s: 8 * p["tokens"] * p["hidden"] * s,
    )


# --- rope family --------------------------------------------------------------------------------------------

def _rope_label(p):
    return f"bsz{p['bsz']} seq{p['seq']} {p['hq']}q/{p['hkv']}kv hd{p['hd']}"


def _qk(p, dtype, device, gen, grads: bool):
    """q, k leaves (bsz, seq, heads, hd) and matching grads_out in the layout the variants return."""
    bsz, seq, hd = p["bsz"], p["seq"], p["hd"]
    q = _randn((bsz, seq, p["hq"], hd), dtype, device, gen, True)
    k = _randn((bsz, seq, p["hkv"], hd), dtype, device, gen, True)
    gq = _randn((bsz, seq, p["hq"], hd), dtype, device, gen)
    gk = _randn((bsz, seq, p["hkv"], hd), dtype, device, gen)
    if grads:  # rope / mrope return (bsz, heads, seq, hd) views; grads come in the same layout
        gq, gk = gq.transpose(1, 2), gk.transpose(1, 2)
    return q, k, gq, gk


def _angles(positions: torch.Tensor, hd: int) -> torch.Tensor:
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, hd, 2, device=positions.device, dtype=torch.float32) / hd))
    return positions.to(torch.float32)[..., None] * inv_freq  # (..., hd/2)


def _make_rope(p, dtype, device, gen):
    q, k, gq, gk = _qk(p, dtype, device, gen, True)
    ang = _angles(torch.arange(p["seq"], device=device), p["hd"])
    emb = torch.cat((ang, ang), dim=-1)[None]  # (1, seq, hd), as HF's rotary embedding returns per batch
    return Inputs((q, k, emb.cos().to(dtype), emb.sin().to(dtype)), (q, k), (gq, gk))


def _make_mrope(p, dtype, device, gen):
    q, k, gq, gk = _qk(p, dtype, device, gen, True)
    seq = p["seq"]
    base = torch.arange(seq, device=device)
    # temporal / height / width position ids differ, as for an image span: (3, bsz, seq)
    pos = torch.stack((base, base // 2, base % 7)).unsqueeze(1).expand(3, p["bsz"], seq)
    ang = _angles(pos, p["hd"])
    emb = torch.cat((ang, ang), dim=-1).contiguous()  # (3, bsz, seq, hd)
    return Inputs((q, k, emb.cos().to(dtype), emb.sin().to(dtype)), (q, k), (gq, gk))


def _make_llama4(p, dtype, device, gen):
    q, k, gq, gk = _qk(p, dtype, device, gen, False)
    ang = _angles(torch.arange(p["seq"], device=device), p["hd"])
    freqs = torch.polar(torch.ones_like(ang), ang)[None]  # complex64 (1, seq, hd/2)
    return Inputs((q, k, freqs), (q, k), (gq, gk))


def _rope_elems(p):
    return p["bsz"] * p["seq"] * (p["hq"] + p["hkv"]) * p["hd"]


def _rope_spec(name, make, eager, npu_args, smoke_hd=16):
    return OpSpec(
        name=name,
        dtype=torch.bfloat16,
        main=[dict(bsz=4, seq=4096, hq=32, hkv=8, hd=128)],
        sweep=lambda t: dict(bsz=4, seq=t // 4, hq=32, hkv=8, hd=128),
        smoke=dict(bsz=2, seq=5, hq=4, hkv=2, hd=smoke_hd),
        tiny=dict(bsz=1, seq=4, hq=2, hkv=1, hd=smoke_hd),
        compile_case=lambda s: dict(bsz=2, seq=s, hq=32, hkv=8, hd=128),
        label=_rope_label,
        tokens=lambda p: p["bsz"] * p["seq"],
        make=make,
        eager=eager,
        npu_args=npu_args,
        bytes_fwd=lambda p, s: 2 * _rope_elems(p) * s,
        bytes_fb=lambda p, s: 4 * _rope_elems(p) * s,
    )


def _t(x):
    return x.transpose(1, 2)


def mrope_section_for(hd: int) -> Tuple[int, int, int]:
    """Qwen2-VL's split of hd/2 into temporal/height/width: (16, 24, 24) for head_dim 128, (2, 3, 3) for 16."""
    half = hd // 2
    t = half // 4
    h = (half - t) // 2
    return (t, h, half - t - h)


# --- embedding ----------------------------------------------------------------------------------------------

def _make_embedding(p, dtype, device, gen):
    weight = _randn((p["V"], p["D"]), dtype, device, gen, True)
    indices = torch.randint(0, p["V"], (p["T"],), generator=gen, device=device, dtype=torch.int64)
    return Inputs((weight, indices), (weight,), (_randn((p["T"], p["D"]), dtype, device, gen),))


# --- tvd ----------------------------------------------------------------------------------------------------

def _make_tvd(p, dtype, device, gen):
    shape = (p["BT"], p["V"])
    prob_p = torch.softmax(_randn(shape, torch.float32, device, gen), dim=-1).to(dtype).requires_grad_(True)
    # q is the teacher (distillation, TVD's use): no gradient, as Liger-Kernel's TVD gives it none.
    prob_q = torch.softmax(_randn(shape, torch.float32, device, gen), dim=-1).to(dtype)
    return Inputs((prob_p, prob_q), (prob_p,), (_loss_grad(dtype, device),))


# --- norms --------------------------------------------------------------------------------------------------

def _norm_label(p):
    return "x".join(map(str, p["shape"])) + (" (q/k norm)" if len(p["shape"]) == 4 else "")


def _make_norm(p, dtype, device, gen, *, residual=False, bias=False):
    """x (and residual) leaves of ``p["shape"]``, the weight (and bias) over the last dim, one grad per output."""
    shape, hidden = p["shape"], p["shape"][-1]
    x = _randn(shape, dtype, device, gen, True)
    w = (1.0 + 0.1 * _randn((hidden,), torch.float32, device, gen)).to(dtype).requires_grad_(True)
    args, leaves, grads = [x], [x], [_randn(shape, dtype, device, gen)]
    if residual:
        r = _randn(shape, dtype, device, gen, True)
        args.insert(1, r)
        leaves.append(r)
        grads.append(_randn(shape, dtype, device, gen))
    args.append(w)
    leaves.append(w)
    if bias:
        b = _randn((hidden,), dtype, device, gen, True, scale=0.1)
        args.append(b)
        leaves.append(b)
    return Inputs(tuple(args), tuple(leaves), tuple(grads))


def _norm_spec(name, eager, npu_args, make, fwd_n, fb_n, module, with_qk=True):
    main = [dict(shape=(8192, 4096), tokens=8192), dict(shape=(16384, 8192), tokens=16384)]
    if with_qk:  # Qwen3's q_norm over head_dim: (bsz, seq, heads, head_dim)
        main.append(dict(shape=(4, 4096, 32, 128), tokens=4 * 4096))
    elems = lambda p: float(torch.Size(p["shape"]).numel())  # noqa: E731
    return OpSpec(
        name=name,
        dtype=torch.bfloat16,
        main=main,
        sweep=lambda t: dict(shape=(t, 4096), tokens=t),
        smoke=dict(shape=(6, 37), tokens=6),
        tiny=dict(shape=(4, 64), tokens=4),
        compile_case=lambda s: dict(shape=(2 * s, 4096), tokens=2 * s),
        label=_norm_label,
        tokens=lambda p: p["tokens"],
        make=make,
        eager=eager,
        npu_args=npu_args,
        bytes_fwd=lambda p, s: fwd_n * elems(p) * s,
        bytes_fb=lambda p, s: fb_n * elems(p) * s,
        notes="eps 1e-6, llama casting" if "rms" in name else "eps 1e-5, weight and bias",
        module=module,
    )


# --- softmax / sparsemax ------------------------------------------------------------------------------------

def _make_rows(p, dtype, device, gen):
    shape = p["shape"]
    x = _randn(shape, dtype, device, gen, True, scale=2.0)
    return Inputs((x,), (x,), (_randn(shape, dtype, device, gen),))


def _rows_spec(name, eager, notes):
    """An op over the last dim of (rows, cols): whole rows of 8192 (the contract's bench shape), many narrow rows
    (attention scores over 1024 keys), and rows wider than CUDA keeps whole (65536: looped)."""
    elems = lambda p: float(torch.Size(p["shape"]).numel())  # noqa: E731
    return OpSpec(
        name=name,
        dtype=torch.bfloat16,
        main=[dict(shape=(16384, 8192), tokens=16384), dict(shape=(65536, 1024), tokens=65536),
              dict(shape=(2048, 65536), tokens=2048)],
        sweep=lambda t: dict(shape=(t, 8192), tokens=t),
        smoke=dict(shape=(6, 37), tokens=6),
        tiny=dict(shape=(4, 64), tokens=4),
        compile_case=lambda s: dict(shape=(2 * s, 4096), tokens=2 * s),
        label=lambda p: "x".join(map(str, p["shape"])),
        tokens=lambda p: p["tokens"],
        make=_make_rows,
        eager=eager,
        npu_args=lambda x: (x,) if name == "softmax" else (x, -1),
        bytes_fwd=lambda p, s: 2 * elems(p) * s,
        bytes_fb=lambda p, s: 5 * elems(p) * s,
        notes=notes,
    )


def _make_dyt(p, dtype, device, gen):
    shape, hidden = p["shape"], p["shape"][-1]
    x = _randn(shape, dtype, device, gen, True)
    alpha = torch.full((1,), 0.5, dtype=dtype, device=device).requires_grad_(True)  # LigerDyT's init_alpha
    gamma = (1.0 + 0.1 * _randn((hidden,), torch.float32, device, gen)).to(dtype).requires_grad_(True)
    beta = _randn((hidden,), dtype, device, gen, True, scale=0.1)
    return Inputs((x, alpha, gamma, beta), (x, alpha, gamma, beta), (_randn(shape, dtype, device, gen),))


def _make_poly_norm(p, dtype, device, gen):
    """weight near PolyCom's (1/3, 1/3, 1/3); the bias 0-d as LigerPolyNorm holds it."""
    x = _randn(p["shape"], dtype, device, gen, True)
    weight = (1.0 / 3.0 + 0.05 * _randn((3,), torch.float32, device, gen)).to(dtype).requires_grad_(True)
    bias = torch.ones((), dtype=dtype, device=device).requires_grad_(True)
    return Inputs((x, weight, bias), (x, weight, bias), (_randn(p["shape"], dtype, device, gen),))


def _gn_shape(p):
    return (p["N"], p["C"], p["H"], p["W"])


def _make_group_norm(p, dtype, device, gen):
    x = _randn(_gn_shape(p), dtype, device, gen, True)
    w = (1.0 + 0.1 * _randn((p["C"],), torch.float32, device, gen)).to(dtype).requires_grad_(True)
    b = _randn((p["C"],), dtype, device, gen, True, scale=0.1)
    return Inputs((x, w, b, p["G"]), (x, w, b), (_randn(_gn_shape(p), dtype, device, gen),))


def _row_spec(name, eager, npu_args, make, notes):
    """An op over (tokens, hidden) rows: dyt, poly_norm (the bench shapes of the issue: 16384 x 8192)."""
    spec = _norm_spec(name, eager, npu_args, make, 2, 5, name, with_qk=False)
    spec.notes = notes
    return spec


# --- cross_entropy / fused_linear_cross_entropy ---------------------------------------------------------------

def _targets(p, device, gen):
    target = torch.randint(0, p["V"], (p["BT"],), generator=gen, device=device, dtype=torch.int64)
    target[::7] = -100  # ignored tokens, as prompt masking gives
    return target


def _make_ce(p, dtype, device, gen):
    logits = _randn((p["BT"], p["V"]), dtype, device, gen, True, scale=2.0)
    return Inputs((logits, _targets(p, device, gen)), (logits,), (_loss_grad(torch.float32, device),))


def _make_flce(p, dtype, device, gen):
    x = _randn((p["BT"], p["H"]), dtype, device, gen, True)
    weight = _randn((p["V"], p["H"]), dtype, device, gen, True, scale=p["H"] ** -0.5)
    return Inputs((x, weight, _targets(p, device, gen)), (x, weight),
                  (_loss_grad(torch.float32, device),))


# --- kl_div / jsd / fused_linear_jsd / grpo_loss ----------------------------------------------------------------

def _make_kl_div(p, dtype, device, gen):
    shape = (p["BT"], p["V"])
    y_pred = torch.log_softmax(_randn(shape, torch.float32, device, gen), -1).to(dtype).requires_grad_(True)
    y_true = torch.softmax(_randn(shape, torch.float32, device, gen), -1).to(dtype)
    return Inputs((y_pred, y_true), (y_pred,), (_loss_grad(dtype, device),))


def _make_jsd(p, dtype, device, gen):
    shape = (p["BT"], p["V"])
    log_q = torch.log_softmax(_randn(shape, torch.float32, device, gen), -1).to(dtype).requires_grad_(True)
    log_p = torch.log_softmax(_randn(shape, torch.float32, device, gen), -1).to(dtype)
    return Inputs((log_q, log_p), (log_q,), (_loss_grad(torch.float32, device),))


def _make_fused_linear_jsd(p, dtype, device, gen):
    x = _randn((p["BT"], p["H"]), dtype, device, gen, True)
    weight = _randn((p["V"], p["H"]), dtype, device, gen, True, scale=p["H"] ** -0.5)
    teacher_x = _randn((p["BT"], p["H"]), dtype, device, gen)
    teacher_weight = _randn((p["V"], p["H"]), dtype, device, gen, scale=p["H"] ** -0.5)
    return Inputs((x, weight, teacher_x, teacher_weight), (x, weight),
                  (_loss_grad(torch.float32, device),))


def _make_grpo(p, dtype, device, gen):
    n_seq, seq_len, vocab = p["B"], p["L"], p["V"]
    logits = _randn((n_seq, seq_len + 1, vocab), dtype, device, gen, True, scale=2.0)
    ids = torch.randint(0, vocab, (n_seq, seq_len), generator=gen, device=device, dtype=torch.int64)
    advantages = _randn((n_seq,), torch.float32, device, gen)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (n_seq,), generator=gen, device=device)
    mask = (torch.arange(seq_len, device=device)[None, :] < lengths[:, None]).to(torch.int64)
    with torch.no_grad():
        logp = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    old = logp + 0.1 * _randn(logp.shape, torch.float32, device, gen)
    ref = logp + 0.1 * _randn(logp.shape, torch.float32, device, gen)
    return Inputs((logits, ids, advantages, mask, old, ref), (logits,),
                  (_loss_grad(torch.float32, device),))


def _make_fused_linear_dpo(p, dtype, device, gen):
    n_seq, seq_len, hidden, vocab = p["N"], p["T"], p["H"], p["V"]
    x = _randn((n_seq, seq_len, hidden), dtype, device, gen, True)
    weight = _randn((vocab, hidden), dtype, device, gen, True, scale=hidden ** -0.5)
    target = torch.randint(0, vocab, (n_seq, seq_len), generator=gen, device=device, dtype=torch.int64)
    target[:, : max(seq_len // 8, 1)] = -100  # a prompt part that counts for nothing
    ref_x = _randn((n_seq, seq_len, hidden), dtype, device, gen)
    ref_weight = _randn((vocab, hidden), dtype, device, gen, scale=hidden ** -0.5)
    return Inputs((x, weight, target, ref_x, ref_weight), (x, weight),
                  (_loss_grad(torch.float32, device),))


def _distill_specs() -> Dict[str, "OpSpec"]:
    rows = lambda p: p["BT"]  # noqa: E731
    vocab_label = lambda p: f"{p['BT']}x{p['V']}"  # noqa: E731
    n = lambda p: p["BT"] * p["V"]  # noqa: E731
    return {
        "fused_linear_dpo": OpSpec(
            name="fused_linear_dpo", dtype=torch.bfloat16, main=[dict(N=8, T=1024, H=4096, V=128256)],
            sweep=lambda t: dict(N=8, T=max(t // 8, 1), H=4096, V=128256), smoke=dict(N=4, T=3, H=8, V=37),
            tiny=dict(N=2, T=2, H=8, V=64), compile_case=lambda s: dict(N=4, T=s, H=1024, V=32000),
            label=lambda p: f"2x({p['N'] // 2}x{p['T']}) H{p['H']} V{p['V']}", tokens=lambda p: p["N"] * p["T"],
            make=_make_fused_linear_dpo, eager=reference.fused_linear_dpo,
            npu_args=lambda x, w, y, rx, rw: (x, w, y, None, rx, rw, None, None, None, -100, 0.1, 0.0, False, 1.0,
                                              False),
            bytes_fwd=lambda p, s: 2 * (p["N"] * p["T"] + p["V"]) * p["H"] * s,
            bytes_fb=lambda p, s: 3 * (p["N"] * p["T"] + p["V"]) * p["H"] * s,
            notes="policy and reference model, chosen then rejected, beta 0.1, sigmoid loss; compute-bound: judge "
                  "by ms and peak memory", n_outputs=1),
        "kl_div": OpSpec(
            name="kl_div", dtype=torch.bfloat16, main=[dict(BT=8192, V=128256)],
            sweep=lambda t: dict(BT=t, V=128256), smoke=dict(BT=6, V=37), tiny=dict(BT=4, V=64),
            compile_case=lambda s: dict(BT=2 * s, V=32000), label=vocab_label, tokens=rows, make=_make_kl_div,
            eager=reference.kl_div_batchmean, npu_args=lambda x, t: (x, t, "batchmean", False, 1e-10),
            bytes_fwd=lambda p, s: 2 * n(p) * s, bytes_fb=lambda p, s: 4 * n(p) * s,
            notes="reduction batchmean, y_true probabilities, grad for y_pred"),
        "jsd": OpSpec(
            name="jsd", dtype=torch.bfloat16, main=[dict(BT=8192, V=128256)],
            sweep=lambda t: dict(BT=t, V=128256), smoke=dict(BT=6, V=37), tiny=dict(BT=4, V=64),
            compile_case=lambda s: dict(BT=2 * s, V=32000), label=vocab_label, tokens=rows, make=_make_jsd,
            eager=reference.jsd, npu_args=lambda x, y: (x, y, None, 0.5, -100),
            bytes_fwd=lambda p, s: 2 * n(p) * s, bytes_fb=lambda p, s: 3 * n(p) * s,
            notes="beta 0.5, no labels; the loss is fp32"),
        "fused_linear_jsd": OpSpec(
            name="fused_linear_jsd", dtype=torch.bfloat16, main=[dict(BT=8192, H=4096, V=128256)],
            sweep=lambda t: dict(BT=t, H=4096, V=128256), smoke=dict(BT=6, H=8, V=37), tiny=dict(BT=4, H=8, V=64),
            compile_case=lambda s: dict(BT=2 * s, H=1024, V=32000),
            label=lambda p: f"BT{p['BT']} H{p['H']} V{p['V']}", tokens=rows, make=_make_fused_linear_jsd,
            eager=reference.fused_linear_jsd, npu_args=lambda x, w, tx, tw: (x, w, tx, tw, None, 0.5, -100, 1.0),
            bytes_fwd=lambda p, s: 2 * (p["BT"] + p["V"]) * p["H"] * s,
            bytes_fb=lambda p, s: 3 * (p["BT"] + p["V"]) * p["H"] * s,
            notes="beta 0.5, T 1, teacher of the student's size; compute-bound: judge by ms and peak memory"),
        "grpo_loss": OpSpec(
            name="grpo_loss", dtype=torch.bfloat16, main=[dict(B=8, L=1024, V=128256)],
            sweep=lambda t: dict(B=8, L=max(t // 8, 1), V=128256), smoke=dict(B=2, L=3, V=37),
            tiny=dict(B=2, L=2, V=64), compile_case=lambda s: dict(B=4, L=s, V=32000),
            label=lambda p: f"B{p['B']} L{p['L']} V{p['V']}", tokens=lambda p: p["B"] * p["L"], make=_make_grpo,
            eager=reference.grpo_loss,
            npu_args=lambda lg, ids, adv, m, old, ref: (lg, ids, adv, m, old, ref, 1.0, 0.04, 0.2, 0.28, "dapo",
                                                        None, None),
            bytes_fwd=lambda p, s: p["B"] * (p["L"] + 1) * p["V"] * s,
            bytes_fb=lambda p, s: 3 * p["B"] * (p["L"] + 1) * p["V"] * s,
            notes="loss_type dapo, beta 0.04, old and ref log-probabilities, padded completions; logits (B, L+1, V)",
            n_outputs=1),
    }


def _make_moe(p, dtype, device, gen):
    """Experts of a MoE block: top-K of random router logits (K distinct experts per token), softmax weights."""
    T, H, E, K, inter = p["T"], p["H"], p["E"], p["K"], p["I"]
    x = _randn((T, H), dtype, device, gen, True)
    gate_up = _randn((E, 2 * inter, H), dtype, device, gen, True, scale=H ** -0.5)
    down = _randn((E, H, inter), dtype, device, gen, True, scale=inter ** -0.5)
    values, index = _randn((T, E), torch.float32, device, gen).topk(K, dim=-1)
    weights = values.softmax(-1).to(dtype).requires_grad_(True)
    grad_out = _randn((T, H), dtype, device, gen)
    return Inputs((x, gate_up, down, index, weights), (x, gate_up, down, weights), (grad_out,))


def _moe_bytes(p, s):
    return (3 * p["E"] * p["H"] * p["I"] + 2 * p["T"] * p["H"]) * s


SPECS: Dict[str, OpSpec] = {
    "geglu": _gated_spec("geglu", reference.geglu),
    "swiglu": _gated_spec("swiglu", reference.swiglu),
    "embedding": OpSpec(
        name="embedding",
        dtype=torch.bfloat16,
        main=[dict(V=128256, D=4096, T=16384)],
        sweep=lambda t: dict(V=128256, D=4096, T=t),
        smoke=dict(V=50, D=24, T=7),
        tiny=dict(V=16, D=32, T=4),
        compile_case=lambda s: dict(V=32000, D=4096, T=2 * s),
        label=lambda p: f"V{p['V']} D{p['D']} T{p['T']}",
        tokens=lambda p: p["T"],
        make=_make_embedding,
        eager=reference.embedding,
        npu_args=lambda weight, indices: (weight, indices, -1),
        bytes_fwd=lambda p, s: 2 * p["T"] * p["D"] * s,
        bytes_fb=lambda p, s: (3 * p["T"] * p["D"] + p["V"] * p["D"]) * s,
    ),
    "tvd": OpSpec(
        name="tvd",
        dtype=torch.float32,
        main=[dict(BT=8192, V=32000)],
        sweep=lambda t: dict(BT=t, V=32000),
        smoke=dict(BT=6, V=37),
        tiny=dict(BT=4, V=64),
        compile_case=lambda s: dict(BT=2 * s, V=32000),
        label=lambda p: f"{p['BT']}x{p['V']}",
        tokens=lambda p: p["BT"],
        make=_make_tvd,
        eager=reference.tvd_batchmean,
        npu_args=lambda p, q: (p, q, None, "batchmean", -100),
        bytes_fwd=lambda p, s: 2 * p["BT"] * p["V"] * s,
        bytes_fb=lambda p, s: 3 * p["BT"] * p["V"] * s,
        notes="reduction batchmean, no labels; q is the teacher (no gradient)",
    ),
    "cross_entropy": OpSpec(
        name="cross_entropy",
        dtype=torch.bfloat16,
        main=[dict(BT=8192, V=128256)],
        sweep=lambda t: dict(BT=t, V=128256),
        smoke=dict(BT=6, V=37),
        tiny=dict(BT=4, V=64),
        compile_case=lambda s: dict(BT=2 * s, V=32000),
        label=lambda p: f"{p['BT']}x{p['V']}",
        tokens=lambda p: p["BT"],
        make=_make_ce,
        eager=reference.cross_entropy,
        npu_args=lambda logits, target: (logits, target),
        bytes_fwd=lambda p, s: p["BT"] * p["V"] * s,
        bytes_fb=lambda p, s: 3 * p["BT"] * p["V"] * s,
        notes="reduction mean, every 7th target ignored; the loss is fp32",
    ),
    "fused_linear_cross_entropy": OpSpec(
        name="fused_linear_cross_entropy",
        dtype=torch.bfloat16,
        main=[dict(BT=8192, H=4096, V=128256)],
        sweep=lambda t: dict(BT=t, H=4096, V=128256),
        smoke=dict(BT=6, H=8, V=37),
        tiny=dict(BT=4, H=8, V=64),
        compile_case=lambda s: dict(BT=2 * s, H=1024, V=32000),
        label=lambda p: f"BT{p['BT']} H{p['H']} V{p['V']}",
        tokens=lambda p: p["BT"],
        make=_make_flce,
        eager=reference.fused_linear_cross_entropy,
        npu_args=lambda x, weight, target: (x, weight, target),
        bytes_fwd=lambda p, s: (p["BT"] + p["V"]) * p["H"] * s,
        bytes_fb=lambda p, s: 2 * (p["BT"] + p["V"]) * p["H"] * s,
        notes="compute-bound: judge by ms and the f+b peak memory column, not GB/s",
    ),
    "fused_moe": OpSpec(
        name="fused_moe",
        dtype=torch.bfloat16,
        main=[dict(T=8192, H=2048, E=64, K=8, I=768)],  # Qwen3-MoE-like (Qwen3-30B-A3B has 128 experts)
        sweep=lambda t: dict(T=t, H=2048, E=64, K=8, I=768),
        smoke=dict(T=6, H=16, E=4, K=2, I=8),
        tiny=dict(T=4, H=64, E=4, K=2, I=32),
        compile_case=lambda s: dict(T=2 * s, H=512, E=8, K=2, I=256),
        label=lambda p: f"T{p['T']} H{p['H']} E{p['E']} K{p['K']} I{p['I']}",
        tokens=lambda p: p["T"],
        make=_make_moe,
        eager=reference.moe_experts,
        npu_args=lambda x, gate_up, down, index, weights: (x, gate_up, down, index, weights),
        bytes_fwd=_moe_bytes,
        bytes_fb=lambda p, s: 2 * _moe_bytes(p, s),
        peers={"hf grouped_mm": reference.moe_experts_grouped_mm},
        notes="compute-bound: judge by ms; eager = transformers' experts loop, hf grouped_mm = its grouped_mm "
              "implementation; NPU_LIGER_MOE_GROUPED_MM=triton|torch picks npu_liger's grouped matmul",
    ),
    "rope": _rope_spec(
        "rope", _make_rope,
        lambda q, k, cos, sin: reference.rope(_t(q), _t(k), cos, sin),
        lambda q, k, cos, sin: (_t(q), _t(k), cos, sin),
    ),
    "qwen2vl_mrope": _rope_spec(
        "qwen2vl_mrope", _make_mrope,
        lambda q, k, cos, sin: reference.qwen2vl_mrope(_t(q), _t(k), cos, sin, mrope_section_for(q.shape[-1])),
        lambda q, k, cos, sin: (_t(q), _t(k), cos, sin, list(mrope_section_for(q.shape[-1]))),
    ),
    "llama4_rope": _rope_spec(
        "llama4_rope", _make_llama4,
        reference.llama4_rope,
        lambda q, k, freqs: (q, k, freqs),
    ),
    "rms_norm": _norm_spec("rms_norm", reference.rms_norm, lambda x, w: (x, w, 1e-6, 0.0, "llama"), _make_norm,
                           2, 5, "rms_norm"),
    "fused_add_rms_norm": _norm_spec(
        "fused_add_rms_norm", reference.fused_add_rms_norm, lambda x, r, w: (x, r, w, 1e-6, 0.0, "llama"),
        lambda p, dtype, device, gen: _make_norm(p, dtype, device, gen, residual=True), 4, 8, "rms_norm",
        with_qk=False),
    "layer_norm": _norm_spec("layer_norm", reference.layer_norm, lambda x, w, b: (x, w, b, 1e-5),
                             lambda p, dtype, device, gen: _make_norm(p, dtype, device, gen, bias=True), 2, 5,
                             "layer_norm", with_qk=False),
    **_distill_specs(),
    "softmax": _rows_spec("softmax", reference.softmax, "over the last dim; x drawn as 2 * randn"),
    "sparsemax": _rows_spec("sparsemax", reference.sparsemax,
                            "dim -1; eager: the sort-based formula in fp32; npu_liger: bisection, no sort (compute"
                            " grows with the 24 bisection passes)"),
    "dyt": _row_spec("dyt", reference.dyt, lambda x, a, g, b: (x, a, g, b), _make_dyt,
                     "alpha 0.5 (LigerDyT's init), gamma and beta over the last dim"),
    "poly_norm": _row_spec("poly_norm", reference.poly_norm, lambda x, w, b: (x, w, b, 1e-6), _make_poly_norm,
                           "eps 1e-6, weight (3,), 0-d bias"),
    "group_norm": OpSpec(
        name="group_norm",
        dtype=torch.bfloat16,
        main=[dict(N=32, C=512, H=64, W=64, G=32)],
        sweep=lambda t: dict(N=max(1, t // 1024), C=512, H=32, W=32, G=32),
        smoke=dict(N=2, C=6, H=3, W=5, G=3),
        tiny=dict(N=2, C=8, H=4, W=4, G=4),
        compile_case=lambda s: dict(N=2, C=128, H=s, W=16, G=32),
        label=lambda p: f"N{p['N']} C{p['C']} {p['H']}x{p['W']} G{p['G']}",
        tokens=lambda p: p["N"] * p["H"] * p["W"],
        make=_make_group_norm,
        eager=reference.group_norm,
        npu_args=lambda x, w, b, groups: (x, w, b, groups, 1e-5),
        bytes_fwd=lambda p, s: 2 * float(torch.Size(_gn_shape(p)).numel()) * s,
        bytes_fb=lambda p, s: 5 * float(torch.Size(_gn_shape(p)).numel()) * s,
        notes="eps 1e-5, weight and bias; tokens = N x H x W",
    ),
}

def op_names() -> List[str]:
    return list(SPECS)
