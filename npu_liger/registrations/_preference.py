"""What the chunked preference and policy losses (fused_linear_dpo, _orpo, _simpo, _cpo, _kto, _grpo) share: one
op factory. Each loss is npu_liger::<loss> (public: the loss and the metrics TRL logs) on top of
npu_liger::<loss>_with_grad (internal: the same and, when asked, grad_input / grad_weight / grad_bias from the same
chunked pass): schema -> fake -> device kernels -> autograd -> sharding, as fused_linear_jsd (see ``_loss.py`` for
how the gradients travel from the forward to the backward). The metrics have no gradient; the reference model's
inputs and every other tensor are constants (TRL detaches them)."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch

from ._loss import check_computed, scale_in_place, scaled, take_grads, wants_grad
from ._op import CHUNKED_LOSS, EagerPath, define_autograd, define_composite, define_entry, define_op
from ._sharding import sharding_rule

PAIR_OUTPUTS = ("loss", "chosen_logps", "rejected_logps", "chosen_logits_mean", "rejected_logits_mean", "nll_loss",
                "chosen_rewards", "rejected_rewards")


def pair_shapes(input, extra_scalars: int = 0):
    """The pair losses' output shapes: per-pair metrics (N / 2,), the rest 0-d."""
    pairs = (input.shape[0] // 2,)
    return [(), pairs, pairs, (), (), (), pairs, pairs] + [()] * extra_scalars


# SimPO's and CPO's arguments up to their last one (SimPO's gamma, CPO's average_log_prob)
MARGIN_ARGUMENTS = [("Tensor", "input", ""), ("Tensor", "weight", ""), ("Tensor", "target", ""),
                    ("Tensor?", "bias", "None"), ("int", "ignore_index", "-100"), ("float", "beta", "0.1"),
                    ("float", "alpha", "1.0"), ("float", "label_smoothing", "0.0"),
                    ("bool", "compute_nll_loss", "True")]



def define_preference_loss(name: str, arguments: Sequence[Tuple[str, str, str]], outputs: Sequence[str],
                           forward: Callable, check: Callable, output_shapes: Callable) -> Callable:
    """The public entry of loss ``name``. ``arguments``: (schema type, name, default) in order; the first two are
    the policy's input and weight, ``bias`` is the one other argument with a gradient. ``forward(*arguments,
    grad_input, grad_weight, grad_bias)`` returns the outputs then the three gradients (empty when not asked
    for); ``check(*arguments)`` validates; ``output_shapes(input)`` lists the outputs' shapes (all fp32)."""
    n_args, n_out = len(arguments), len(outputs)
    bias_at = [arg_name for _, arg_name, _ in arguments].index("bias")
    plain = ", ".join(f"{kind} {arg_name}" for kind, arg_name, _ in arguments)
    with_defaults = ", ".join(f"{kind} {arg_name}" + (f"={default}" if default else "")
                              for kind, arg_name, default in arguments)
    returns = ", ".join(f"Tensor {out}" for out in outputs)

    def fake(*args):
        check(*args[:n_args])
        grad_input, grad_weight, grad_bias = args[n_args:]
        input, weight, bias = args[0], args[1], args[bias_at]
        device = input.device
        metrics = [torch.empty(shape, dtype=torch.float32, device=device) for shape in output_shapes(input)]
        grads = [torch.empty(tuple(t.shape) if flag and t is not None else (0,), dtype=input.dtype, device=device)
                 for t, flag in ((input, grad_input), (weight, grad_weight), (bias, grad_bias and bias is not None))]
        return (*metrics, *grads)

    with_grad_op = define_op(f"{name}_with_grad({plain}, bool grad_input, bool grad_weight, bool grad_bias) -> "
                             f"({returns}, Tensor grad_input_, Tensor grad_weight_, Tensor grad_bias_)",
                             kernel=forward, fake=fake, opaque_in_graphs=CHUNKED_LOSS)

    def setup_context(ctx, inputs, output):
        ctx.flags = tuple(inputs[n_args:])
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(*output[n_out:])

    def backward(ctx, grad_loss, *_):
        check_computed(ctx, _flags_by_position(ctx.flags), name, grad_loss)
        grads = [None] * (n_args + 3)
        for position, g in zip((0, 1, bias_at), ctx.saved_tensors):
            if ctx.needs_input_grad[position]:
                grads[position] = scaled(g, grad_loss, "mean")
        return tuple(grads)

    def _flags_by_position(flags):
        by_position = [False] * (n_args + 3)
        for position, flag in zip((0, 1, bias_at), flags):
            by_position[position] = flag
        return by_position

    define_autograd(with_grad_op, backward=backward, setup_context=setup_context)

    def composite(*args):
        args = _filled(args)
        return with_grad_op(*args, wants_grad(args[0]), wants_grad(args[1]), wants_grad(args[bias_at]))[:n_out]

    defaults = [default for _, _, default in arguments]

    def _filled(args):
        """Every argument: the dispatcher leaves out trailing arguments equal to their defaults."""
        return tuple(args) + tuple(_python_default(d) for d in defaults[len(args):])

    public_op = define_composite(f"{name}({with_defaults}) -> ({returns})", composite)

    @sharding_rule(public_op)
    def _public_sharding(pl, *args):
        """Replicated only: the normalisers count the whole batch (pairs, sequences or tokens) and the
        log-softmax runs over the whole vocabulary; sharded inputs are gathered first."""
        return [pl.case([pl.R] * n_out)]

    @sharding_rule(with_grad_op)
    def _with_grad_sharding(pl, *args):
        return [pl.case([pl.R] * (n_out + 3))]

    def kernel(*args):
        return forward(*args, False, False, False)[:n_out]

    def eager_forward(ctx, *args):
        """Eager training calls: the forward keeps its gradients for the backward to scale in place."""
        ctx.flags = (args[0].requires_grad, args[1].requires_grad, args[bias_at] is not None
                     and args[bias_at].requires_grad)
        *outs, gx, gw, gb = forward(*args, *ctx.flags)
        ctx.grads = [gx, gw, gb]
        ctx.mark_non_differentiable(*outs[1:])
        return tuple(outs)

    def eager_backward(ctx, grad_loss, *_):
        grads = [None] * n_args
        for position, g, flag in zip((0, 1, bias_at), take_grads(ctx, name), ctx.flags):
            if flag:
                grads[position] = scale_in_place(g, grad_loss)
        return tuple(grads)

    def policy_needs_grad(*args) -> bool:
        bias = args[bias_at]
        return args[0].requires_grad or args[1].requires_grad or (bias is not None and bias.requires_grad)

    return define_entry(public_op, kernel=kernel,
                        eager=EagerPath(eager_forward, eager_backward, applies=policy_needs_grad))


def _python_default(default: str):
    """A schema default as the Python value (the defaults these ops use)."""
    if default in ("None", ""):
        return None
    if default in ("True", "False"):
        return default == "True"
    if default.startswith('"'):
        return default.strip('"')
    return float(default) if "." in default or "e" in default else int(default)
