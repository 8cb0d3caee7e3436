"""The case table: every op of docs/DESIGN.md section 4 x representative problem sizes (the benchmark shapes and small
odd ones). Inputs are named as in the op contracts and handed to ``npu_liger.npu_ops.<op>.<op>_forward`` /
``<op>_backward`` by parameter name, so the table does not depend on argument order.

Float tensors are ``torch.empty`` (never read: no kernel runs), so even the large shapes cost address space,
not memory; integer tensors (indices, labels) are zeros because launchers check their range on the host.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Problem:
    name: str
    build: Callable[[torch.dtype], Dict[str, Any]]
    bench: bool = False  # the benchmark shape: used for the headroom probe


@dataclass
class Call:
    label: str  # "fwd", "bwd", ...: the middle part of the kernel names in the tables
    launcher: str  # attribute of npu_liger.npu_ops.<op>
    # For a path that needs more than one launcher call: builds the callable from the op's module.
    adapter: Optional[Callable[[Any], Callable]] = None

    def resolve(self, module) -> Callable:
        launcher = getattr(module, self.launcher)
        return self.adapter(module) if self.adapter is not None else launcher


@dataclass
class Op:
    name: str
    problems: List[Problem]
    calls: List[Call] = field(default_factory=list)

    def __post_init__(self):
        if not self.calls:
            self.calls = [Call("fwd", f"{self.name}_forward"), Call("bwd", f"{self.name}_backward")]


def _e(*shape, dtype):
    return torch.empty(shape, dtype=dtype)


def _bshd(bsz, seq, heads, hd, dtype):
    """(bsz, heads, seq, head_dim) as a transposed view of (bsz, seq, heads, head_dim): HF's q/k layout."""
    return torch.empty((bsz, seq, heads, hd), dtype=dtype).transpose(1, 2)


def _glu(rows, cols):
    def build(dtype):
        return {name: _e(rows, cols, dtype=dtype) for name in ("a", "b", "grad_c")}
    return build


def _embedding(vocab, dim, index_shape, index_dtype, padding_idx):
    def build(dtype):
        return {"weight": _e(vocab, dim, dtype=dtype), "indices": torch.zeros(index_shape, dtype=index_dtype),
                "padding_idx": padding_idx, "num_embeddings": vocab,
                "grad_out": _e(*index_shape, dim, dtype=dtype)}
    return build


def _tvd(rows, cols, reduction, label_dtype, q_dtype=None):
    """q_dtype: a teacher's dtype other than p's (fp32 against a half-precision student, say)."""
    def build(dtype):
        loss_dtype = torch.promote_types(dtype, q_dtype or dtype)
        grad = _e(rows, cols, dtype=loss_dtype) if reduction == "none" else torch.ones((), dtype=loss_dtype)
        labels = None if label_dtype is None else torch.zeros(rows, dtype=label_dtype)
        return {"p": _e(rows, cols, dtype=dtype), "q": _e(rows, cols, dtype=q_dtype or dtype), "shift_labels": labels,
                "reduction": reduction, "ignore_index": -100, "grad_out": grad}
    return build


def _tvd_codes_round_trip(tvd):
    """The eager training path: forward storing sign codes, then the backward from those codes (both gradients,
    and grad_p alone: a teacher's q needs none)."""
    def tvd_codes_round_trip(p, q, shift_labels, reduction, ignore_index, grad_out):
        _, saved = tvd.tvd_forward(p, q, shift_labels, reduction, ignore_index, save_codes=True)
        for need_q in (True, False):
            tvd.tvd_backward_from_codes(grad_out, saved, p.shape[0], p.shape[1], p.dtype, q.dtype, reduction,
                                        need_q=need_q)
    return tvd_codes_round_trip


def _cross_entropy(rows, cols, target_dtype):
    def build(dtype):
        return {"logits": _e(rows, cols, dtype=dtype), "target": torch.zeros(rows, dtype=target_dtype)}
    return build


def _cross_entropy_with_grad(ce):
    """The training path: loss and gradient in one launch, every switch on (softcap, smoothing, z-loss), then
    the eager backward's in-place scaling (one scale, and one per row)."""
    from npu_liger.npu_ops._loss import scale_in_place

    def cross_entropy_with_grad(logits, target):
        grad = ce.cross_entropy_forward(logits, target, None, -100, "mean", 0.1, 30.0, 1e-4, compute_grad=True)[1]
        scale_in_place(grad, torch.ones((), dtype=torch.float32))
        scale_in_place(grad, torch.ones(grad.shape[0], dtype=torch.float32))
    return cross_entropy_with_grad


def _kl_div(rows, cols, reduction, log_target, true_dtype=None):
    def build(dtype):
        loss_dtype = torch.promote_types(dtype, true_dtype or dtype)
        grad = _e(rows, cols, dtype=loss_dtype) if reduction == "none" else torch.ones((), dtype=loss_dtype)
        return {"y_pred": _e(rows, cols, dtype=dtype), "y_true": _e(rows, cols, dtype=true_dtype or dtype),
                "reduction": reduction, "log_target": log_target, "eps": 1e-10, "grad_out": grad,
                "grad_pred": True, "grad_true": True}
    return build


def _jsd(rows, cols, beta, label_dtype, target_dtype=None):
    def build(dtype):
        labels = None if label_dtype is None else torch.zeros(rows, dtype=label_dtype)
        return {"input": _e(rows, cols, dtype=dtype), "target": _e(rows, cols, dtype=target_dtype or dtype),
                "shift_labels": labels, "beta": beta, "ignore_index": -100}
    return build


def _jsd_with_grad(jsd):
    def jsd_with_grad(input, target, shift_labels, beta, ignore_index):
        jsd.jsd_forward(input, target, shift_labels, beta, ignore_index, compute_grad=True)
    return jsd_with_grad


def _fused_linear_jsd_chunk(rows, cols, beta, label_dtype):
    """One chunk of fused_linear_jsd (the matmuls are torch's): the JSD kernel from logits, in place."""
    def build(dtype):
        labels = None if label_dtype is None else torch.zeros(rows, dtype=label_dtype)
        return {"student_logits": _e(rows, cols, dtype=dtype), "teacher_logits": _e(rows, cols, dtype=dtype),
                "shift_labels": labels, "jsd_beta": beta, "ignore_index": -100, "temperature": 2.0}
    return build


def _fused_linear_jsd_kernel(fljsd):
    from npu_liger.npu_ops import _divergence

    def fused_linear_jsd_chunk(student_logits, teacher_logits, shift_labels, jsd_beta, ignore_index, temperature,
                               compute_grad=True):
        n_rows = student_logits.shape[0]
        scale = _divergence.valid_row_scale(shift_labels, ignore_index, n_rows, student_logits.device)
        losses = torch.empty((n_rows,), dtype=torch.float32)
        _divergence.launch_jsd_rows(student_logits, teacher_logits, shift_labels, scale, losses,
                                    student_logits if compute_grad else None, jsd_beta, ignore_index, temperature)
    return fused_linear_jsd_chunk


def _grpo(n_seq, seq_len, vocab, extra_position, mask, old, ref):
    def build(dtype):
        return {"logits": _e(n_seq, seq_len + extra_position, vocab, dtype=dtype),
                "completion_ids": torch.zeros((n_seq, seq_len), dtype=torch.int64),
                "advantages": torch.zeros(n_seq, dtype=torch.float32),
                "completion_mask": torch.ones((n_seq, seq_len), dtype=torch.int64) if mask else None,
                "old_logp": torch.zeros((n_seq, seq_len), dtype=torch.float32) if old else None,
                "ref_logp": torch.zeros((n_seq, seq_len), dtype=torch.float32) if ref else None,
                "beta": 0.04 if ref else 0.0, "loss_type": "grpo"}
    return build


def _grpo_with_grad(grpo):
    def grpo_with_grad(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, beta, loss_type):
        grpo.grpo_loss_forward(logits, completion_ids, advantages, completion_mask, old_logp, ref_logp, 0.9, beta,
                               0.2, 0.28, loss_type, None, None, compute_grad=True)
    return grpo_with_grad


def _cross_entropy_every_option(ce):
    """Every switch of the row kernel at once: class weights with label smoothing (the weighted sums), the
    statistics (the running argmax), token scaling, softcap and z-loss; loss only and with the gradient."""
    def cross_entropy_every_option(logits, target):
        weight = torch.empty(logits.shape[1], dtype=torch.float32)
        for compute_grad in (False, True):
            ce.cross_entropy_forward(logits, target, weight, -100, "mean", 0.1, 30.0, 1e-4, True,
                                     compute_grad=compute_grad, stats=True)
    return cross_entropy_every_option


def _rope(bsz, seq, q_heads, kv_heads, hd, cos_shape):
    def build(dtype):
        return {"q": _bshd(bsz, seq, q_heads, hd, dtype), "k": _bshd(bsz, seq, kv_heads, hd, dtype),
                "grad_q": _bshd(bsz, seq, q_heads, hd, dtype), "grad_k": _bshd(bsz, seq, kv_heads, hd, dtype),
                "cos": _e(*cos_shape, dtype=dtype), "sin": _e(*cos_shape, dtype=dtype)}
    return build


def _mrope(bsz, seq, q_heads, kv_heads, hd, section):
    def build(dtype):
        values = _rope(bsz, seq, q_heads, kv_heads, hd, (3, bsz, seq, hd))(dtype)
        values["mrope_section"] = list(section)
        return values
    return build


def _llama4(bsz, seq, q_heads, kv_heads, hd, freqs_shape):
    def build(dtype):
        return {"q": _e(bsz, seq, q_heads, hd, dtype=dtype), "k": _e(bsz, seq, kv_heads, hd, dtype=dtype),
                "grad_q": _e(bsz, seq, q_heads, hd, dtype=dtype), "grad_k": _e(bsz, seq, kv_heads, hd, dtype=dtype),
                "freqs_cis": torch.empty(freqs_shape, dtype=torch.complex64)}
    return build


def _norm(rows, cols, weight=True, bias=True, casting_mode="llama", offset=0.0):
    """A (rows, cols) norm problem: inputs of rms_norm, fused_add_rms_norm and layer_norm (each launcher binds the
    ones it names; the fused backward gets s = the forward's sum, grad_sum its gradient)."""
    def build(dtype):
        values = {name: _e(rows, cols, dtype=dtype) for name in ("x", "residual", "s", "grad_out", "grad_normed",
                                                                  "grad_sum")}
        values.update(weight=_e(cols, dtype=dtype) if weight else None, bias=_e(cols, dtype=dtype) if bias else None,
                      eps=1e-6, offset=offset, casting_mode=casting_mode)
        return values
    return build


def _rows(rows, cols):
    """softmax (over the last dim): x and the backward's grad_out and y, all (rows, cols)."""
    def build(dtype):
        return {name: _e(rows, cols, dtype=dtype) for name in ("x", "grad_out", "y")}
    return build


def _sparsemax(shape, dim):
    def build(dtype):
        values = {name: _e(*shape, dtype=dtype) for name in ("x", "grad_out", "y")}
        values["dim"] = dim
        return values
    return build


def _dyt(rows, cols, beta=True, param_dtype=None):
    """x (rows, cols), alpha (1,), gamma and beta (cols,) (in ``param_dtype`` when given: fp32 with half x)."""
    def build(dtype):
        p = param_dtype or dtype
        return {"x": _e(rows, cols, dtype=dtype), "grad_out": _e(rows, cols, dtype=dtype), "alpha": _e(1, dtype=p),
                "gamma": _e(cols, dtype=p), "beta": _e(cols, dtype=p) if beta else None}
    return build


def _poly_norm(rows, cols):
    def build(dtype):
        return {"x": _e(rows, cols, dtype=dtype), "grad_out": _e(rows, cols, dtype=dtype), "weight": _e(3, dtype=dtype),
                "bias": _e(dtype=dtype), "eps": 1e-6}
    return build


def _group_norm(shape, num_groups, affine=True):
    """x of ``shape`` (N, C, *) in ``num_groups`` groups, weight and bias (C,) unless not ``affine``."""
    def build(dtype):
        channels = shape[1]
        return {"x": _e(*shape, dtype=dtype), "grad_out": _e(*shape, dtype=dtype), "num_groups": num_groups,
                "weight": _e(channels, dtype=dtype) if affine else None,
                "bias": _e(channels, dtype=dtype) if affine else None, "eps": 1e-5}
    return build


def _moe(tokens, hidden, experts, top_k, inter, index_dtype):
    """fused_moe's inputs (HF experts layout); the index zeros (every slot on expert 0: the launch shapes depend
    on T, K and E only)."""
    def build(dtype):
        return {"x": _e(tokens, hidden, dtype=dtype), "gate_up_proj": _e(experts, 2 * inter, hidden, dtype=dtype),
                "down_proj": _e(experts, hidden, inter, dtype=dtype),
                "top_k_index": torch.zeros((tokens, top_k), dtype=index_dtype),
                "top_k_weights": _e(tokens, top_k, dtype=dtype), "grad_out": _e(tokens, hidden, dtype=dtype),
                "gate_up_out": _e(tokens * top_k, 2 * inter, dtype=dtype)}
    return build


def _moe_zero_empty(moe):
    """The zero fill of the weight gradients of experts without rows (after torch's grouped matmul, a CUDA path;
    compiled here for every chip like every kernel): the case's index puts every slot on expert 0."""
    from npu_liger.npu_ops._grouped_mm import tiles_for, zero_experts_without_rows

    def zero_empty(gate_up_proj, top_k_index):
        routing = moe.Routing(top_k_index, gate_up_proj.shape[0], tiles_for("npu"))
        zero_experts_without_rows(gate_up_proj, routing)
    return zero_empty


_RMS_CALLS = [Call("fwd", "rms_norm_forward"), Call("bwd", "rms_norm_backward"),
              Call("fused-fwd", "fused_add_rms_norm_forward"), Call("fused-bwd", "fused_add_rms_norm_backward")]

OPS: List[Op] = [
    # 1x1: n_elements == 1 is specialised to a constant; 2 x (2^30 + 8): n_elements is i64 (offsets past 2^31)
    Op("geglu", [Problem("8192x14336", _glu(8192, 14336), bench=True), Problem("7x131", _glu(7, 131)),
                 Problem("1x1", _glu(1, 1)), Problem("2x1073741832 (n > 2^31: i64)", _glu(2, 2**30 + 8))]),
    Op("swiglu", [Problem("8192x14336", _glu(8192, 14336), bench=True), Problem("7x131", _glu(7, 131)),
                  Problem("1x1", _glu(1, 1)), Problem("2x1073741832 (n > 2^31: i64)", _glu(2, 2**30 + 8))]),
    Op("embedding",
       [Problem("V128256 D4096 16384tok i64", _embedding(128256, 4096, (4, 4096), torch.int64, -1), bench=True),
        Problem("V1001 D129 3x5tok i32 pad0", _embedding(1001, 129, (3, 5), torch.int32, 0))]),
    Op("tvd", [Problem("8192x32000 batchmean labels", _tvd(8192, 32000, "batchmean", torch.int64), bench=True),
               Problem("3x1001 none", _tvd(3, 1001, "none", None)),
               Problem("5x77 sum i32-labels", _tvd(5, 77, "sum", torch.int32)),
               Problem("6x1001 batchmean labels q-fp32", _tvd(6, 1001, "batchmean", torch.int64, torch.float32))],
       [Call("fwd", "tvd_forward"), Call("bwd", "tvd_backward"),
        Call("codes", "tvd_backward_from_codes", adapter=_tvd_codes_round_trip)]),
    Op("cross_entropy",
       [Problem("8192x128256 i64", _cross_entropy(8192, 128256, torch.int64), bench=True),
        Problem("2x262144 i64 (V 256k)", _cross_entropy(2, 262144, torch.int64)),
        Problem("3x1001 i32", _cross_entropy(3, 1001, torch.int32))],
       [Call("fwd", "cross_entropy_forward"),
        Call("fwd+grad", "cross_entropy_forward", adapter=_cross_entropy_with_grad),
        Call("all-options", "cross_entropy_forward", adapter=_cross_entropy_every_option)]),
    Op("rope", [Problem("b4 s4096 h32/8 d128", _rope(4, 4096, 32, 8, 128, (1, 4096, 128)), bench=True),
                Problem("b2 s7 h3/1 d72 per-batch cos", _rope(2, 7, 3, 1, 72, (2, 7, 72))),
                Problem("b1 s5 h4/2 d80 rot32", _rope(1, 5, 4, 2, 80, (5, 32)))]),
    Op("qwen2vl_mrope",
       [Problem("b4 s4096 h32/8 d128 [16,24,24]", _mrope(4, 4096, 32, 8, 128, (16, 24, 24)), bench=True),
        Problem("b2 s7 h3/1 d24 [4,4,4]", _mrope(2, 7, 3, 1, 24, (4, 4, 4)))]),
    Op("llama4_rope",
       [Problem("b4 s4096 h32/8 d128", _llama4(4, 4096, 32, 8, 128, (4096, 64)), bench=True),
        Problem("b2 s7 h3/1 d72 per-batch freqs", _llama4(2, 7, 3, 1, 72, (2, 7, 36)))]),
    # whole rows (4096; 8192 forward, with and without the offset), looped rows (8192 backward, 16384), many narrow
    # rows per tile (head_dim 128); each with and without a weight
    Op("rms_norm", [Problem("8192x4096", _norm(8192, 4096), bench=True), Problem("16384x8192", _norm(16384, 8192)),
                    Problem("8192x8192 gemma", _norm(8192, 8192, casting_mode="gemma", offset=1.0)),
                    Problem("q/k norm 524288x128 gemma", _norm(4 * 4096 * 32, 128, casting_mode="gemma", offset=1.0)),
                    Problem("7x131 none", _norm(7, 131, casting_mode="none")), Problem("3x20000", _norm(3, 20000)),
                    # no weight (HAS_WEIGHT off): Llama-4's qk norm (whole narrow rows), whole and looped rows
                    Problem("q/k norm 524288x128 no weight", _norm(4 * 4096 * 32, 128, weight=False)),
                    Problem("8192x4096 no weight", _norm(8192, 4096, weight=False)),
                    Problem("5x20001 no weight none", _norm(5, 20001, weight=False, casting_mode="none"))],
       _RMS_CALLS),
    # whole rows (the 16384x8192 forward reads each row once), several narrow rows per tile (7x131), looped rows
    # (the 8192-wide backward, 3x20000 both ways)
    Op("softmax", [Problem("16384x8192", _rows(16384, 8192), bench=True), Problem("7x131", _rows(7, 131)),
                   Problem("3x20000", _rows(3, 20000))]),
    # rows layout: the bench shape loops (rows wider than 4096), 7x131 packs rows, 3x20000 loops, dim 1 of (4, 131, 7)
    # and dim 0 of (20000, 3) (trailing dims under 16: moved last); split layout (columns x 16+ trailing positions):
    # dim 1 of (8, 1024, 64) whole, dim 0 of (20000, 16) looped
    Op("sparsemax", [Problem("16384x8192", _sparsemax((16384, 8192), -1), bench=True),
                     Problem("7x131", _sparsemax((7, 131), -1)), Problem("3x20000", _sparsemax((3, 20000), -1)),
                     Problem("4x131x7 dim1", _sparsemax((4, 131, 7), 1)),
                     Problem("20000x3 dim0", _sparsemax((20000, 3), 0)),
                     Problem("8x1024x64 dim1", _sparsemax((8, 1024, 64), 1)),
                     Problem("20000x16 dim0", _sparsemax((20000, 16), 0))]),
    # Qwen3-MoE-like (Qwen3-30B-A3B: H 2048, 128 experts of I 768; here E 64), odd small, top-1
    Op("fused_moe", [Problem("T8192 H2048 E64 K8 I768", _moe(8192, 2048, 64, 8, 768, torch.int64), bench=True),
                     Problem("T7 H129 E3 K2 I33 i32", _moe(7, 129, 3, 2, 33, torch.int32)),
                     Problem("T5 H64 E4 K1 I16", _moe(5, 64, 4, 1, 16, torch.int64))],
       [Call("fwd", "fused_moe_forward"), Call("bwd", "fused_moe_backward"),
        Call("zero-empty", "fused_moe_forward", adapter=_moe_zero_empty)]),
    Op("layer_norm", [Problem("8192x4096", _norm(8192, 4096), bench=True), Problem("16384x8192", _norm(16384, 8192)),
                      Problem("1280x1280 no bias", _norm(1280, 1280, bias=False)),
                      Problem("7x131 no affine", _norm(7, 131, weight=False, bias=False))]),
    Op("kl_div", [Problem("8192x32000 batchmean", _kl_div(8192, 32000, "batchmean", False), bench=True),
                  Problem("8192x32000 none log-target", _kl_div(8192, 32000, "none", True)),
                  Problem("3x1001 sum true-fp32", _kl_div(3, 1001, "sum", False, torch.float32)),
                  Problem("5x77 mean log-target", _kl_div(5, 77, "mean", True))]),
    Op("jsd", [Problem("8192x128256 beta0.5 labels", _jsd(8192, 128256, 0.5, torch.int64), bench=True),
               Problem("3x1001 beta0", _jsd(3, 1001, 0.0, None)),
               Problem("5x77 beta1 i32-labels", _jsd(5, 77, 1.0, torch.int32)),
               Problem("6x1001 beta0.3 target-fp32", _jsd(6, 1001, 0.3, None, torch.float32))],
       [Call("fwd", "jsd_forward"), Call("fwd+grad", "jsd_forward", adapter=_jsd_with_grad)]),
    Op("fused_linear_jsd",
       [Problem("chunk 1024x128256 beta0.5 labels", _fused_linear_jsd_chunk(1024, 128256, 0.5, torch.int64),
                bench=True),
        Problem("chunk 3x1001 beta0", _fused_linear_jsd_chunk(3, 1001, 0.0, None)),
        Problem("chunk 5x77 beta1 i32-labels", _fused_linear_jsd_chunk(5, 77, 1.0, torch.int32))],
       [Call("chunk+grad", "fused_linear_jsd_forward", adapter=_fused_linear_jsd_kernel)]),
    Op("grpo_loss",
       [Problem("b8 l1024+1 V151936 mask old ref", _grpo(8, 1024, 151936, 1, True, True, True), bench=True),
        Problem("b2 l7 V1001 no old, no ref", _grpo(2, 7, 1001, 0, False, False, False)),
        Problem("b3 l5+1 V77 mask ref", _grpo(3, 5, 77, 1, True, False, True))],
       [Call("fwd", "grpo_loss_forward"), Call("fwd+grad", "grpo_loss_forward", adapter=_grpo_with_grad)]),
    # DyT: rows split over column blocks (8192, 20000), narrow rows packed per tile (64), fp32 parameters, no beta
    Op("dyt", [Problem("16384x8192", _dyt(16384, 8192), bench=True), Problem("7x131 no beta", _dyt(7, 131, beta=False)),
               Problem("4096x64 fp32 params", _dyt(4096, 64, param_dtype=torch.float32)),
               Problem("3x20000", _dyt(3, 20000))]),
    # PolyNorm: whole rows (8192 forward, 2048, narrow 128), looped rows (8192 backward), odd
    Op("poly_norm", [Problem("16384x8192", _poly_norm(16384, 8192), bench=True),
                     Problem("8192x2048", _poly_norm(8192, 2048)), Problem("65536x128", _poly_norm(65536, 128)),
                     Problem("7x131", _poly_norm(7, 131))]),
    # GroupNorm: large groups looped over channels (64x64 positions), whole small groups, positions looped
    # (1 channel per group of 128x128), no spatial dims, no affine
    Op("group_norm", [Problem("N32 C512 64x64 G32", _group_norm((32, 512, 64, 64), 32), bench=True),
                      Problem("N4 C32 128x128 G32", _group_norm((4, 32, 128, 128), 32)),
                      Problem("N8 C64 7x7 G8", _group_norm((8, 64, 7, 7), 8)),
                      Problem("N16 C4096 G1 (no spatial)", _group_norm((16, 4096), 1)),
                      Problem("N3 C6 5x3 G3 no affine", _group_norm((3, 6, 5, 3), 3, affine=False))]),
]


class MissingInput(Exception):
    pass


def bind_by_name(launcher: Callable, values: Dict[str, Any]):
    """(args, kwargs) for ``launcher`` from the named contract inputs; parameters with defaults may be left out."""
    args, kwargs = [], {}
    for param in inspect.signature(launcher).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        name = param.name
        if name in values:
            value = values[name]
        elif param.default is not param.empty:
            continue
        else:
            raise MissingInput(f"{launcher.__name__} wants {name!r}, which the case table does not provide")
        if param.kind == param.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[name] = value
    return args, kwargs
