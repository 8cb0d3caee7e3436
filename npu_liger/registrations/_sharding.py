"""DTensor sharding rules for every npu_liger op and its backward op (tensor parallel, sequence parallel, and
anything else that feeds the ops DTensors).

Each rule lists, for one mesh dimension, the placements under which running the op on the local shards gives
exactly the global result; DTensor expands them over every mesh dimension, picks the cheapest for the inputs it
gets and redistributes the inputs when none matches (so an unlisted layout is still correct, it just moves data
first). Rules go through the public ``torch.distributed.tensor.experimental.register_sharding``.

What each op accepts (R = Replicate, S(d) = Shard(d), P = Partial(sum)):

- geglu / swiglu ``(a, b)``: a and b both S(d) for any d -> S(d); both R -> R. Never P: the ops are nonlinear.
  Backward ``(grad_c, a, b)``: all S(d) -> S(d); all R -> R; grad_c P with a, b R -> P (linear in grad_c).
- embedding ``(weight (V, D), indices)``: weight R, indices R -> R; weight R, indices S(d) -> S(d) (batch or
  sequence parallel); weight S(1) (embedding dim), indices R -> S(last). Vocab-parallel (weight S(0)) is not
  listed: the kernel rejects indices outside its rows, and masking them would also need a shifted padding_idx,
  so DTensor gathers the weight first. Backward ``(grad_out, indices, V, padding_idx)``: R -> R;
  grad_out S(last), indices R -> S(1); grad_out and indices S(d) on a token dim -> P (each rank scatters its own
  tokens); grad_out P, indices R -> P.
- tvd ``(p (BT, V), q, shift_labels, reduction)``, rows S(0) or vocab S(1), labels follow the rows (S(0)) or
  are R for vocab sharding. ``none``: S(0) -> S(0), S(1) -> S(1). ``sum``: S(0) or S(1) -> P. ``batchmean``
  divides by the GLOBAL number of valid rows: exact only with S(1) (every rank sees every row) -> P; row-sharded
  inputs are gathered first. ``mean`` divides by valid rows * V: R only. (For a row-sharded mean, call
  ``reduction="sum"`` and divide by the all-reduced count yourself.) Backward mirrors the forward per reduction
  (grad_out R for the scalar reductions, or P with every other input R).
- rope ``(q, k (bsz, heads, seq, head_dim), cos, sin)``: batch S(0) (cos/sin S(0) when they carry a batch,
  else R), heads S(1) (cos/sin R), sequence S(2) (cos/sin S on their seq dim). Never head_dim: it holds the
  rotary pairs. qwen2vl_mrope: the same with cos/sin (3, bsz, seq, head_dim). llama4_rope ``(q, k (bsz, seq,
  heads, head_dim), freqs_cis)``: batch S(0), seq S(1), heads S(2), freqs_cis following batch/seq or R.
  Backward ops: the same, plus grads P with the tables R (linear in the grads).

- rms_norm ``(x, weight, eps, offset, casting_mode)``, layer_norm ``(x, weight, bias, eps)``,
  fused_add_rms_norm ``(x, residual, weight, ...)``: rows may be sharded, the normalised (last) dim may not: x
  (and residual) S(d) for any d < ndim - 1 with the parameters R -> S(d); all R -> R. Backward ops: grad and x
  S(d) -> grad_x S(d) and the parameter gradients P (each rank sums its own rows); all R -> R; grad P with x R
  -> P throughout (linear in the incoming gradient; fused_add_rms_norm's grad_sum P too).
- cross_entropy / fused_linear_cross_entropy and their internal ``*_with_grad`` / ``_backward`` ops: tokens
  S(0) (logits or x, and target; weight and bias R) for ``none`` (-> S(0)) and ``sum`` (loss -> P, grad_x S(0),
  grad_weight/grad_bias -> P), or all R. ``mean`` needs the global count of valid tokens: R only. Vocab-parallel
  (weight S(0)) needs collectives between the kernel's passes: not listed (docs/DISTRIBUTED.md).

- kl_div ``(y_pred, y_true, reduction, ...)``: as tvd without labels (none S(0) or S(1); sum S(0) or S(1) -> P;
  batchmean S(1) -> P; mean R only). jsd ``(input, target, shift_labels, ...)`` divides by the global count of
  valid rows: vocab S(1) with the labels R -> P (its terms are elementwise over log-probabilities), or all R.
  fused_linear_jsd (a log-softmax over the whole vocabulary, a global divisor) and grpo_loss (its divisors and
  clip_ratio count the whole batch): all R. Their internal and backward ops follow their forward.

FSDP2 and DDP need no rules: FSDP2 all-gathers parameters into plain tensors before the ops run.

Version gates live in ``_dtensor_api`` only. The one thing the public API gets wrong for these ops:
``register_sharding`` keys DTensor's sharding cache on non-tensor arguments only from the first ``int``
argument on, so ``tvd``'s ``reduction`` (a str) would not be part of the key and a cached ``"none"`` layout
would be reused for ``"sum"``. ``register_all`` widens the key to every non-tensor argument; where that
is impossible the ops whose result depends on such an argument get no rule (DTensor then raises
NotImplementedError instead of silently reusing a wrong layout).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Callable, Dict, Optional

import torch

from ._op import NAMESPACE

# op name -> rule function, filled only where DTensor is available (tests assert every op has one)
REGISTERED: Dict[str, Callable] = {}


def _dtensor_api() -> Optional[SimpleNamespace]:
    """The one version/availability gate: DTensor's placements and ``register_sharding`` (torch >= 2.6, the
    project's floor; the API and the None-for-non-tensor-argument convention are unchanged through 2.13), or None
    when torch.distributed is not built in (importing npu_liger must still work there)."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:  # torch without the public DTensor API
        return None
    try:  # private: used only to widen the cache key (see the module docstring)
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        schema_infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
        if not isinstance(schema_infos, dict):
            raise TypeError("op_to_schema_info is not a dict")
    except (ImportError, AttributeError, TypeError):
        RuntimeSchemaInfo, schema_infos = None, None
    return SimpleNamespace(register_sharding=register_sharding, Shard=Shard, Replicate=Replicate,
                           Partial=Partial, RuntimeSchemaInfo=RuntimeSchemaInfo, schema_infos=schema_infos)


def _scalar_argnums(op):
    """(index of the op's first non-tensor argument, index of its first int argument): DTensor keys its sharding
    cache on the arguments from ``register_sharding``'s choice, the first int, on; 100 means none."""
    first_scalar = first_int = 100
    for i, arg in enumerate(op._schema.arguments):
        t = arg.type.getElementType() if isinstance(arg.type, torch.OptionalType) else arg.type
        if not isinstance(t, torch.TensorType):
            first_scalar = min(first_scalar, i)
        if isinstance(t, torch.IntType):
            first_int = min(first_int, i)
    return first_scalar, first_int


def _rules(api):
    """name -> rule. A rule takes the op's arguments (DTensorSpecs for tensors) and returns
    [(output placements, input placements)] for one mesh dim; None stands for each non-tensor argument."""
    R, P, S = api.Replicate(), api.Partial(), api.Shard

    def gate(a, b):
        return [([R], [R, R])] + [([S(d)], [S(d), S(d)]) for d in range(a.ndim)]

    def gate_backward(grad_c, a, b):
        return [([R, R], [R, R, R]), ([P, P], [P, R, R])] + [([S(d), S(d)], [S(d)] * 3) for d in range(a.ndim)]

    def embedding(weight, indices, padding_idx=-1):
        return ([([R], [R, R, None]), ([S(indices.ndim)], [S(1), R, None])]
                + [([S(d)], [R, S(d), None]) for d in range(indices.ndim)])

    def embedding_backward(grad_out, indices, num_embeddings, padding_idx):
        return ([([R], [R, R, None, None]), ([P], [P, R, None, None]), ([S(1)], [S(indices.ndim), R, None, None])]
                + [([P], [S(d), S(d), None, None]) for d in range(indices.ndim)])

    def tvd_layouts(shift_labels, reduction):
        """(p/q placement, label placement, output placement) triples that are exact for this reduction."""
        rows, vocab = (S(0), S(0)), (S(1), R)
        exact = {"none": [rows + (S(0),), vocab + (S(1),)], "sum": [rows + (P,), vocab + (P,)],
                 "batchmean": [vocab + (P,)]}.get(reduction, [])
        return [(pq, None if shift_labels is None else lab, out) for pq, lab, out in exact]

    def tvd(p, q, shift_labels=None, reduction="batchmean", ignore_index=-100):
        lab_r = None if shift_labels is None else R
        return [([R], [R, R, lab_r, None, None])] + [
            ([out], [pq, pq, lab, None, None]) for pq, lab, out in tvd_layouts(shift_labels, reduction)]

    def tvd_backward(grad_out, p, q, shift_labels, reduction, ignore_index):
        lab_r = None if shift_labels is None else R
        rules = [([R, R], [R, R, R, lab_r, None, None]), ([P, P], [P, R, R, lab_r, None, None])]
        for pq, lab, _ in tvd_layouts(shift_labels, reduction):
            grad = pq if reduction == "none" else R
            rules.append(([pq, pq], [grad, pq, pq, lab, None, None]))
        return rules

    def rotary(batch_dim, heads_dim, seq_dim, tables, table_batch_dim, extra):
        """q/k sharded on batch, heads or seq (never head_dim: the rotary pairs); the ``tables`` table arguments
        (cos/sin or freqs_cis, all one shape) follow the batch when they carry one (size > 1, at
        ``table_batch_dim``), follow the sequence on their seq dim (always ndim - 2), else replicate. ``extra``:
        trailing non-tensor arguments."""

        def rule(q, k, table, *args):
            t_batch = S(table_batch_dim) if table.ndim >= 3 and table.shape[table_batch_dim] > 1 else R
            cases = [(R, R), (S(batch_dim), t_batch), (S(heads_dim), R), (S(seq_dim), S(table.ndim - 2))]
            return [([qk, qk], [qk, qk] + [tab] * tables + [None] * extra) for qk, tab in cases]

        def backward_rule(grad_q, grad_k, *args):
            return rule(grad_q, grad_k, *args) + [([P, P], [P, P] + [R] * tables + [None] * extra)]

        return rule, backward_rule

    def row_dims(x):
        return range(x.ndim - 1)  # every dim but the normalised one

    def opt(t, placement):
        return None if t is None else placement  # an absent optional tensor argument

    def rms_norm(x, weight, *scalars):
        return [([R], [R, R, None, None, None])] + [([S(d)], [S(d), R, None, None, None]) for d in row_dims(x)]

    def rms_norm_backward(grad_out, x, weight, *scalars):
        return ([([R, R], [R, R, R, None, None, None]), ([P, P], [P, R, R, None, None, None])]
                + [([S(d), P], [S(d), S(d), R, None, None, None]) for d in row_dims(x)])

    def fused_add_rms_norm(x, residual, weight, *scalars):
        return ([([R, R], [R, R, R, None, None, None])]
                + [([S(d), S(d)], [S(d), S(d), R, None, None, None]) for d in row_dims(x)])

    def fused_add_rms_norm_backward(grad_normed, grad_sum, s, weight, *scalars):
        rest = [None, None, None]
        return ([([R, R], [R, opt(grad_sum, R), R, R] + rest), ([P, P], [P, opt(grad_sum, P), R, R] + rest)]
                + [([S(d), P], [S(d), opt(grad_sum, S(d)), S(d), R] + rest) for d in row_dims(s)])

    def layer_norm(x, weight=None, bias=None, eps=1e-5):
        return ([([R], [R, opt(weight, R), opt(bias, R), None])]
                + [([S(d)], [S(d), opt(weight, R), opt(bias, R), None]) for d in row_dims(x)])

    def layer_norm_backward(grad_out, x, weight, bias, eps):
        params = [opt(weight, R), opt(bias, R), None]
        return ([([R, R, R], [R, R] + params), ([P, P, P], [P, R] + params)]
                + [([S(d), P, P], [S(d), S(d)] + params) for d in row_dims(x)])

    # The losses: tokens sharded (rows S(0), targets S(0), weight and bias R) or everything R. Rows are independent
    # for "none" (-> S(0)) and "sum" (loss -> P; grad_x rows S(0); grad_weight and grad_bias -> P); "mean" divides
    # by the GLOBAL number of valid rows, so it is R only (call "sum" and divide by the all-reduced count).
    def loss_reduced(reduction):
        return {"none": S(0), "sum": P}.get(reduction)

    def cross_entropy_with_grad(logits, target, ignore_index, reduction, *args):
        rules = [([R, R], [R, R] + [None] * 6)]
        if loss_reduced(reduction) is not None:
            rules.append(([loss_reduced(reduction), S(0)], [S(0), S(0)] + [None] * 6))
        return rules

    def cross_entropy(logits, target, ignore_index=-100, reduction="mean", *args):
        return [([out], ins) for (out, _), ins in cross_entropy_with_grad(logits, target, ignore_index, reduction)]

    def flce_with_grad(x, weight, target, bias, ignore_index, reduction, *args):
        b = None if bias is None else R
        rules = [([R, R, R, R], [R, R, R, b] + [None] * 8)]
        if loss_reduced(reduction) is not None:
            rules.append(([loss_reduced(reduction), S(0), P, P], [S(0), R, S(0), b] + [None] * 8))
        return rules

    def flce(x, weight, target, bias=None, ignore_index=-100, reduction="mean", *args):
        b = None if bias is None else R
        rules = [([R], [R, R, R, b] + [None] * 5)]
        if loss_reduced(reduction) is not None:
            rules.append(([loss_reduced(reduction)], [S(0), R, S(0), b] + [None] * 5))
        return rules

    def flce_backward(grad_loss, x, weight, target, bias, *args):
        b = None if bias is None else R
        return [([R, R, R], [R, R, R, R, b] + [None] * 7), ([S(0), P, P], [S(0), S(0), R, S(0), b] + [None] * 7)]

    def kl_div(y_pred, y_true, reduction="batchmean", *args):
        return [([R], [R, R, None, None, None])] + [
            ([out], [pq, pq, None, None, None]) for pq, _, out in tvd_layouts(None, reduction)]

    def kl_div_backward(grad_out, y_pred, y_true, reduction, log_target, eps, grad_pred, grad_true):
        def grads(placement):  # a gradient not asked for is an empty (0,) tensor: replicated
            return [placement if grad_pred else R, placement if grad_true else R]
        rest = [None] * 5
        rules = [(grads(R), [R, R, R] + rest), (grads(P), [P, R, R] + rest)]
        for pq, _, _ in tvd_layouts(None, reduction):
            rules.append((grads(pq), [pq if reduction == "none" else R, pq, pq] + rest))
        return rules

    def jsd_with_grad(input, target, shift_labels, beta, ignore_index, compute_grad):
        lab = None if shift_labels is None else R
        grad_vocab = S(1) if compute_grad else R
        return [([R, R], [R, R, lab, None, None, None]), ([P, grad_vocab], [S(1), S(1), lab, None, None, None])]

    def jsd(input, target, shift_labels=None, *args):
        lab = None if shift_labels is None else R
        return [([R], [R, R, lab, None, None]), ([P], [S(1), S(1), lab, None, None])]

    def replicated(n_outputs):
        def rule(*args):
            return [([R] * n_outputs, [None if a is None else R if hasattr(a, "placements") else None
                                       for a in args])]
        return rule

    rope, rope_backward = rotary(0, 1, 2, tables=2, table_batch_dim=0, extra=0)
    mrope, mrope_backward = rotary(0, 1, 2, tables=2, table_batch_dim=1, extra=1)
    llama4, llama4_backward = rotary(0, 2, 1, tables=1, table_batch_dim=0, extra=0)
    return {
        "geglu": gate, "geglu_backward": gate_backward, "swiglu": gate, "swiglu_backward": gate_backward,
        "embedding": embedding, "embedding_backward": embedding_backward, "tvd": tvd, "tvd_backward": tvd_backward,
        "rope": rope, "rope_backward": rope_backward, "qwen2vl_mrope": mrope, "qwen2vl_mrope_backward": mrope_backward,
        "llama4_rope": llama4, "llama4_rope_backward": llama4_backward,
        "rms_norm": rms_norm, "rms_norm_backward": rms_norm_backward, "fused_add_rms_norm": fused_add_rms_norm,
        "fused_add_rms_norm_backward": fused_add_rms_norm_backward, "layer_norm": layer_norm,
        "layer_norm_backward": layer_norm_backward,
        "cross_entropy": cross_entropy, "cross_entropy_with_grad": cross_entropy_with_grad,
        "fused_linear_cross_entropy": flce, "fused_linear_cross_entropy_with_grad": flce_with_grad,
        "fused_linear_cross_entropy_backward": flce_backward,
        "kl_div": kl_div, "kl_div_backward": kl_div_backward, "jsd": jsd, "jsd_with_grad": jsd_with_grad,
        "fused_linear_jsd": replicated(1), "fused_linear_jsd_with_grad": replicated(3),
        "grpo_loss": replicated(4), "grpo_loss_with_grad": replicated(5),
    }


def register_all() -> Dict[str, Callable]:
    """Register the rule of every op. Idempotent."""
    api = _dtensor_api()
    if api is None:
        return REGISTERED
    namespace = getattr(torch.ops, NAMESPACE)
    for name, rule in _rules(api).items():
        if name in REGISTERED:
            continue
        op = getattr(namespace, name).default
        first_scalar, first_int = _scalar_argnums(op)
        widen = first_scalar < first_int  # e.g. tvd's reduction (a str) sits before its first int
        if widen and api.RuntimeSchemaInfo is None:
            warnings.warn(f"npu_liger: no DTensor sharding rule for {name} on this torch version "
                          "(its non-tensor arguments cannot be made part of DTensor's sharding cache key)")
            continue
        api.register_sharding(op)(rule)
        if widen:
            api.schema_infos[op] = api.RuntimeSchemaInfo(static_argnum=first_scalar, needs_pytree=True)
        REGISTERED[name] = rule
    return REGISTERED


register_all()
