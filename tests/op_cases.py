"""One small call of every public op, with its torch reference: the table the op-wide contract tests
(``test_op_contract.py``: every argument in every layout, NaN in, checkpointing, double backward, torch.func) and
``test_public_functions.py`` (meta tensors, modes, threads) run over. A new op adds one ``OpCase`` here.

``make()`` returns fresh positional arguments of the public function ``npu_liger.<name>``; ``grads`` names the
positions whose gradient the op computes; ``reference`` is the same computation in plain torch (Hugging Face's own
function where one exists), called with the same arguments. A second case of the same op (another form of its
arguments, e.g. an absent optional tensor) has a key of its own and names its op in ``function``; tests reach the
function and the op through ``public_name(key)``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from checklist import DEVICE, randn


class OpCase(NamedTuple):
    make: Callable[[], tuple]
    grads: Tuple[int, ...]
    reference: Callable
    # the op's name in torch.ops.npu_liger when the public function's arguments need translating for it
    op_args: Optional[Callable[[tuple], tuple]] = None
    # the public function (and op) this case calls, when the key is not its name: a second case of one op
    function: Optional[str] = None


def index(shape, high):
    return torch.randint(0, high, shape, device=DEVICE)


def gelu_tanh_product(a, b):
    return F.gelu(a, approximate="tanh") * b


def silu_product(a, b):
    return F.silu(a) * b


def embedding_reference(weight, indices, padding_idx=None):
    return F.embedding(indices, weight, padding_idx)


def tvd_reference(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
    tv = (p - q).abs() * 0.5
    valid = (torch.ones(p.shape[0], dtype=torch.bool, device=p.device) if shift_labels is None
             else shift_labels != ignore_index)
    tv = torch.where(valid[:, None], tv, torch.zeros_like(tv))
    if reduction == "none":
        return tv
    if reduction == "sum":
        return tv.sum()
    divisor = valid.sum() * (p.shape[1] if reduction == "mean" else 1)
    return tv.sum() / divisor.clamp(min=1)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_reference(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb(unsqueeze_dim=1) (its formula, so that the table needs no transformers)."""
    cos, sin = cos.unsqueeze(-3) if cos.dim() == 3 else cos, sin.unsqueeze(-3) if sin.dim() == 3 else sin
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def mrope_reference(q, k, cos, sin, mrope_section):
    def merge(table):
        return torch.cat([m[i % 3] for i, m in enumerate(table.split(list(mrope_section) * 2, dim=-1))], dim=-1)

    return rope_reference(q, k, merge(cos), merge(sin))


def llama4_rope_reference(q, k, freqs_cis):
    freqs = freqs_cis[None, :, None, :] if freqs_cis.dim() == 2 else freqs_cis[:, :, None, :]

    def rotate(x):
        as_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(as_complex * freqs).flatten(3).type_as(x)

    return rotate(q), rotate(k)


def rms_norm_reference(x, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return h.to(x.dtype) if weight is None else (offset + weight) * h.to(x.dtype)


def fused_add_rms_norm_reference(x, residual, weight, eps=1e-6, offset=0.0, casting_mode="llama"):
    s = x + residual
    return rms_norm_reference(s, weight, eps, offset, casting_mode), s


def layer_norm_reference(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def dyt_reference(x, alpha, gamma, beta=None):
    y = gamma * torch.tanh(alpha * x)
    return y if beta is None else y + beta


def poly_norm_reference(x, weight, bias, eps=1e-6):
    """PolyCom's PolyNorm (Liger's test reference)."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return weight[0] * norm(x ** 3) + weight[1] * norm(x ** 2) + weight[2] * norm(x) + bias


def group_norm_reference(x, weight, bias, num_groups, eps=1e-5):
    return F.group_norm(x, num_groups, weight, bias, eps)


def cross_entropy_reference(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def flce_reference(x, weight, target, bias=None, ce_weight=None, ignore_index=-100, reduction="mean",
                   label_smoothing=0.0):
    logits = F.linear(x, weight, bias)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # HF's upcast; float64 stays float64
    return F.cross_entropy(logits, target, ce_weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def class_weight(n):
    return torch.rand(n, device=DEVICE) + 0.5


def softmax_reference(x):
    return torch.softmax(x, -1)


def sparsemax_reference(x, dim=-1):
    """The paper's algorithm (Martins & Astudillo 2016, Algorithm 1): sort, find the support size k from the
    cumulative sums, tau = (sum of the k largest - 1) / k. Selections by ``torch.where`` (not multiplication by the
    support mask), so -inf entries get 0 and a non-finite value outside the support does not reach the rest; a row
    with a NaN or +inf, or of -inf only, is NaN (the op's contract). ``max(x - tau, 0)`` is a selection on
    x - tau > 0 rather than ``clamp``, whose gradient passes at x == tau: the support is where the output is
    positive (an entry exactly at tau, common on bf16's coarse grid, gets no gradient)."""
    z = x.movedim(dim, -1)
    ordered = z.sort(-1, descending=True).values
    rank = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    support = 1 + rank * ordered > ordered.cumsum(-1)
    tau = (torch.where(support, ordered, 0).sum(-1, keepdim=True) - 1) / support.sum(-1, keepdim=True)
    defined = (z < float("inf")).all(-1, keepdim=True) & (z > float("-inf")).any(-1, keepdim=True)
    shifted = z - tau
    y = torch.where(defined, torch.where(shifted > 0, shifted, 0), float("nan"))
    return y.movedim(-1, dim)


def fused_moe_reference(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    """transformers' ``MixtralExperts.forward`` (its loop over the experts hit, in plain torch; an index equal to E
    is skipped)."""
    experts = gate_up_proj.shape[0]
    out = torch.zeros_like(x)
    mask = F.one_hot(top_k_index.long(), num_classes=experts + 1).permute(2, 1, 0)
    for e in range(experts):
        top_k_pos, token_idx = torch.where(mask[e])
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(x[token_idx], gate_up_proj[e]).chunk(2, dim=-1)
        rows = F.linear(F.silu(gate) * up, down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
        out = out.index_add(0, token_idx, rows.to(out.dtype))
    return out


CASES = {
    "geglu": OpCase(lambda: (randn((3, 37)), randn((3, 37))), (0, 1), gelu_tanh_product),
    "swiglu": OpCase(lambda: (randn((3, 37)), randn((3, 37))), (0, 1), silu_product),
    "embedding": OpCase(lambda: (randn((11, 6)), index((2, 5), 11), None), (0,), embedding_reference,
                        op_args=lambda args: (args[0], args[1], -1 if args[2] is None else args[2])),
    "tvd": OpCase(lambda: (randn((4, 9)).softmax(-1), randn((4, 9)).softmax(-1), None, "sum"), (0, 1),
                  tvd_reference),
    "rope": OpCase(lambda: (randn((2, 4, 5, 8)), randn((2, 2, 5, 8)), randn((5, 8)), randn((5, 8))), (0, 1),
                   rope_reference),
    "qwen2vl_mrope": OpCase(lambda: (randn((2, 4, 5, 8)), randn((2, 2, 5, 8)), randn((3, 2, 5, 8)),
                                     randn((3, 2, 5, 8)), [2, 1, 1]), (0, 1), mrope_reference),
    "llama4_rope": OpCase(lambda: (randn((2, 5, 4, 8)), randn((2, 5, 2, 8)),
                                   torch.polar(torch.ones(5, 4, device=DEVICE), randn((5, 4)))), (0, 1),
                          llama4_rope_reference),
    "rms_norm": OpCase(lambda: (randn((3, 16)), randn((16,))), (0, 1), rms_norm_reference),
    "rms_norm_no_weight": OpCase(lambda: (randn((3, 16)), None), (0,), rms_norm_reference, function="rms_norm"),
    "fused_add_rms_norm": OpCase(lambda: (randn((3, 16)), randn((3, 16)), randn((16,))), (0, 1, 2),
                                 fused_add_rms_norm_reference),
    "layer_norm": OpCase(lambda: (randn((3, 16)), randn((16,)), randn((16,))), (0, 1, 2), layer_norm_reference),
    "softmax": OpCase(lambda: (randn((3, 4, 19)) * 2.0,), (0,), softmax_reference),
    # (2, 11, 17) over dim 1: the split layout; its "transposed" layout stores dim 1 innermost (the rows layout)
    "sparsemax": OpCase(lambda: (randn((2, 11, 17)) * 2.0, 1), (0,), sparsemax_reference),
    "dyt": OpCase(lambda: (randn((3, 16)), randn((1,)), randn((16,)), randn((16,))), (0, 1, 2, 3), dyt_reference),
    "poly_norm": OpCase(lambda: (randn((3, 16)), randn((3,)), randn((1,))), (0, 1, 2), poly_norm_reference),
    "group_norm": OpCase(lambda: (randn((2, 6, 5)), randn((6,)), randn((6,)), 3), (0, 1, 2), group_norm_reference),
    # class weights and label smoothing: every tensor argument of the row kernel is drawn in every layout
    "cross_entropy": OpCase(lambda: (randn((4, 10)), index((4,), 10), class_weight(10), -100, "mean", 0.1), (0,),
                            cross_entropy_reference),
    "fused_linear_cross_entropy": OpCase(lambda: (randn((4, 8)), randn((10, 8)), index((4,), 10), randn((10,)),
                                                  class_weight(10), -100, "mean", 0.1), (0, 1, 3),
                                         flce_reference),
    # 3 experts, intermediate 8; index 3 (= E) is a slot served elsewhere
    "fused_moe": OpCase(lambda: (randn((5, 16)), randn((3, 16, 16), scale=0.3), randn((3, 16, 8), scale=0.3),
                                 index((5, 2), 4), randn((5, 2)).softmax(-1)), (0, 1, 2, 4), fused_moe_reference),
}
OPS = sorted(CASES)


def public_name(name: str) -> str:
    """The public function (``npu_liger.<it>``) and op (``torch.ops.npu_liger.<it>``) the case ``name`` calls."""
    return CASES[name].function or name


def op_args(name: str, args: tuple) -> tuple:
    """The op's positional arguments for the public function's ``args``."""
    translate = CASES[name].op_args
    return translate(args) if translate is not None else args


def run_op(name: str, args: tuple):
    return getattr(torch.ops.npu_liger, public_name(name))(*op_args(name, args))
