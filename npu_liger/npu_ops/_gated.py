"""Host launchers shared by the gated elementwise ops (GEGLU, SwiGLU): ``c = act(a) * b`` over a flat view.

Each op keeps its own kernels and memory analysis; these functions do the checks, allocation, tiling and
launch that are the same for both. The kernels' signatures are
``fwd(a, b, c, n_elements, BLOCK)`` and ``bwd(grad_c, a, b, grad_a, grad_b, n_elements, BLOCK)``.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._triton import cdiv, check_float_tensor, check_same_layout, flat, flat_plan, new_like, require_launchable



def check_gated_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    check_float_tensor("a", a)
    check_float_tensor("b", b)
    check_same_layout("b", b, "a", a)


def gated_forward(kernel, a: torch.Tensor, b: torch.Tensor, memory_multiplier: float) -> torch.Tensor:
    check_gated_inputs(a, b)
    c = new_like(a)
    n = a.numel()
    if n == 0:
        return c
    require_launchable(a.device)
    plan = flat_plan(a.device.type, n, memory_multiplier)  # the flat tensor is tiled
    kernel[(plan.grid(cdiv(n, plan.block)),)](
        flat(a), flat(b), c.view(-1), n, BLOCK=plan.block, **plan.launch_options()
    )
    return c


def gated_backward(kernel, grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   memory_multiplier: float) -> Tuple[torch.Tensor, torch.Tensor]:
    check_gated_inputs(a, b)
    check_float_tensor("grad_c", grad_c)
    check_same_layout("grad_c", grad_c, "a", a)
    grad_a, grad_b = new_like(a), new_like(a)
    n = a.numel()
    if n == 0:
        return grad_a, grad_b
    require_launchable(a.device)
    plan = flat_plan(a.device.type, n, memory_multiplier)
    kernel[(plan.grid(cdiv(n, plan.block)),)](
        flat(grad_c), flat(a), flat(b), grad_a.view(-1), grad_b.view(-1), n, BLOCK=plan.block,
        **plan.launch_options()
    )
    return grad_a, grad_b
