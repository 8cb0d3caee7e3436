"""What the two loss ops (cross_entropy, fused_linear_cross_entropy) share: their options' schema, the statistics
output, and how the gradients travel: they come out of the forward pass (for an incoming gradient of 1) and the
backward only scales them by the incoming gradient.

Two paths with the same numbers:
- the registered formula (torch.compile, DTensor, dispatch modes, functorch): the forward op returns the
  gradients as extra outputs, saved for backward, and the backward multiplies them into new tensors (under
  torch.compile AOTAutograd may donate the saved buffers, so Inductor can do that multiply in place);
- eager training calls: an ``autograd.Function`` keeps the gradients on its context and scales them in place
  in the backward (no second (BT, V) or (V, H) buffer: the point of a memory-saving loss). They are used up
  by that backward, so a second backward through the same graph raises instead of returning wrong gradients.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch

from ..npu_ops._loss import LossOptions
from ..npu_ops._loss import scale_in_place as scale_kernel

# The options of both public ops' schemas, after their tensors (``npu_ops._loss.LossOptions``, in its order).
OPTIONS_SCHEMA = ('int ignore_index=-100, str reduction="mean", float label_smoothing=0.0, float? softcap=None, '
                  "float lse_square_scale=0.0, bool use_token_scaling=False")
# The same without defaults, for the internal ops.
OPTIONS_ARGS = ("int ignore_index, str reduction, float label_smoothing, float? softcap, float lse_square_scale, "
                "bool use_token_scaling")
N_OPTIONS = len(LossOptions._fields)


class CrossEntropyOutput(NamedTuple):
    """What the losses return when statistics are asked for (Liger's ``CrossEntropyOutput``): the loss and, for
    each ``return_*`` flag set, its statistic (None otherwise; see ``npu_ops._loss.LossStats``)."""
    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def wants_stats(return_z_loss: bool, return_token_accuracy: bool, return_predicted_tokens: bool) -> bool:
    return return_z_loss or return_token_accuracy or return_predicted_tokens


def stats_output(outputs, return_z_loss: bool, return_token_accuracy: bool,
                 return_predicted_tokens: bool) -> CrossEntropyOutput:
    """(loss, z_loss, token_accuracy, predicted_tokens) with the statistics not asked for left out."""
    loss, z_loss, accuracy, predicted = outputs
    return CrossEntropyOutput(loss, z_loss if return_z_loss else None, accuracy if return_token_accuracy else None,
                              predicted if return_predicted_tokens else None)


def fake_stats(ref: torch.Tensor, n_rows, reduction: str, stats: bool, loss_dtype: torch.dtype) -> tuple:
    """The fakes' (z_loss, token_accuracy, predicted_tokens), as ``npu_ops._loss.loss_stats`` / ``empty_stats``."""
    if not stats:
        return (ref.new_empty((0,), dtype=torch.float32), ref.new_empty((0,), dtype=torch.float32),
                ref.new_empty((0,), dtype=torch.int64))
    shape = (n_rows,) if reduction == "none" else ()
    return (ref.new_empty(shape, dtype=loss_dtype), ref.new_empty(shape, dtype=torch.float32),
            ref.new_empty((n_rows,), dtype=torch.int64))


def sharded_rows_result(pl, reduction: str, stats: bool = False):
    """The losses' sharding: tokens sharded (rows S(0), targets S(0), weight, bias and class weights R) or
    everything R. Rows are independent for ``none`` (the loss -> S(0)) and ``sum`` (-> P; grad_x rows S(0),
    grad_weight and grad_bias P); ``mean`` divides by the GLOBAL weight of the valid rows, so it is R only (call
    ``sum`` and divide by the all-reduced count), and so are the statistics of a scalar reduction (the token
    accuracy is a mean). The loss's placement for row-sharded inputs (the z-loss's too), or None where rows may
    not be sharded."""
    if stats and reduction != "none":
        return None
    return {"none": pl.S(0), "sum": pl.P}.get(reduction)


def saveable(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Autograd refuses to save inference-mode tensors (a teacher's output made under ``torch.inference_mode()``,
    say). A backward needs their values, not their identity, so those are saved as a plain copy (torch's own
    losses save new tensors computed from them the same way)."""
    return tensor.clone() if tensor is not None and tensor.is_inference() else tensor


def wants_grad(tensor: Optional[torch.Tensor]) -> bool:
    return tensor is not None and tensor.requires_grad and torch.is_grad_enabled()


def scaled(grad: torch.Tensor, grad_loss: torch.Tensor, reduction: str) -> torch.Tensor:
    """``grad`` times the incoming gradient of the loss, as a new tensor in grad's dtype (for ``none``,
    grad_loss has one entry per row of grad)."""
    if reduction == "none":
        return grad.mul(grad_loss.unsqueeze(-1)).to(grad.dtype)
    return grad * grad_loss.to(torch.float32)  # a 0-d fp32 factor keeps grad's dtype (and computes in fp32)


def scale_in_place(grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """``grad *= grad_loss`` (0-d, or one per row of a 2-D grad), skipped on the device where grad_loss is exactly
    1. The eager paths' backward (serialised there)."""
    return scale_kernel(grad, grad_loss.detach())


def take_grads(ctx, op_name: str) -> List[Optional[torch.Tensor]]:
    """The gradients an eager forward left on ``ctx``, once."""
    if torch.is_grad_enabled():
        raise NotImplementedError(f"double backward (a gradient of the gradient) of npu_liger::{op_name} is not "
                                  "supported")
    grads = ctx.grads
    if grads is None:
        raise RuntimeError(f"npu_liger::{op_name}: trying to backward through the loss a second time; its "
                           "gradients were computed in the forward and used up by the first backward (call the "
                           "loss again, or use torch.ops.npu_liger." + op_name + " for retain_graph=True)")
    ctx.grads = None
    return grads


def check_computed(ctx, flags, op_name: str, grad_loss: torch.Tensor) -> None:
    """The registered formula's guards: a gradient autograd wants must have been computed by the forward, and
    no create_graph backward (the saved gradients are constants to autograd: a second derivative through them
    would be silently wrong)."""
    if torch.is_grad_enabled():  # create_graph=True, whether or not grad_loss itself requires grad
        raise NotImplementedError(f"double backward (a gradient of the gradient) of npu_liger::{op_name} is not "
                                  "supported")
    for needed, computed in zip(ctx.needs_input_grad, flags):
        if needed and not computed:
            raise RuntimeError(f"npu_liger::{op_name}_with_grad was called without asking for a gradient that "
                               f"autograd needs; call npu_liger::{op_name} (or npu_liger.{op_name}), which asks "
                               "for exactly the gradients needed")
