"""Fused mixture of experts: the experts of a MoE block, exactly as Hugging Face's ``MixtralExperts.forward``
(transformers 5.x, experts stored as 3-D parameters):

    out[t] = sum over k of  w[t, k] * down_proj[e] @ (silu(g) * u),   [g; u] = gate_up_proj[e] @ x[t],
             e = top_k_index[t, k]

x (T, H); gate_up_proj (E, 2I, H) with the gate rows first; down_proj (E, H, I); top_k_index (T, K) int32/int64;
top_k_weights (T, K). A slot whose index is E (transformers' expert-parallel convention: served on another rank)
contributes nothing. Gradients for x, both weight tensors and top_k_weights.

Routing, on the device and of fixed shapes (no host synchronisation on expert counts; torch.compile and CUDA
graphs see shapes that depend on T, K and E only): the T*K slots are sorted by expert (a stable sort, so each
expert's rows are in slot order), ``searchsorted`` gives each expert's row range (``bounds``, E + 1 values; the
number of served slots is ``bounds[E]``), and a table of row tiles (``tile_expert``, ``tile_row``: at most
``cdiv(T*K, BLOCK_M) + min(E, T*K)`` tiles, unused ones marked E) tells every grouped-matmul tile its expert.
(``torch.bincount`` would give the counts too, but its CUDA kernel reads the maximum back to the host.)

Forward (kernels in ``_moe_kernels.py``, matmuls in ``_grouped_mm.py``):

    xs   = x[token of each sorted row]              gather                 (T*K, H)
    h    = xs @ gate_up_proj[e].T                   grouped matmul         (T*K, 2I)   saved for backward
    act  = silu(h[:, :I]) * h[:, I:]                SwiGLU rows
    y    = act @ down_proj[e].T                     grouped matmul         (T*K, H)
    out  = sum_k w * y[row of (t, k)]               combine: a gather of the K rows of each token, summed in
                                                    slot order in fp32 (deterministic, no atomics)

Backward, for the incoming gradient g (T, H):

    gs     = g[token of each sorted row]                                   (T*K, H)
    ga     = gs @ down_proj[e]                      the unweighted gradient of act, kept in fp32
    grad_h, w*act, grad_w = one row kernel: act recomputed from h, grad_act = w * ga,
             grad_h = [grad_act * up * silu'(gate), grad_act * silu(gate)], grad_w[slot] = ga . act (= g . y)
    grad_down_proj[e]    = gs[rows of e].T @ (w * act)[rows of e]
    grad_gate_up_proj[e] = grad_h[rows of e].T @ xs[rows of e]          (xs gathered again)
    grad_x[t]            = sum_k (grad_h @ gate_up_proj[e])[row of (t, k)]   (the combine, unweighted)

in two steps (``fused_moe_backward_down``: up to grad_down_proj, the last reader of h; then
``fused_moe_backward_gate_up``), so that h is freed before the second step's buffers exist.

Saved for backward: the inputs (x, both weight tensors, index, weights: no copies) and h, the (T*K, 2I) gate/up
projections in x's dtype. Not saved: the gathered xs and gs (T*K, H; gathered again, a copy), the SwiGLU product
(T*K, I; recomputed in the backward row kernel, as the dense MLP's ``gated_down_proj`` recomputes its gate
product) and y (T*K, H; the routing weights' gradient is ``ga . act`` instead). Recomputing h too would cost a
third of the forward's matmul work to save its T*K*2I values: ``NPU_LIGER_MOE_RECOMPUTE=1`` does that (the
autograd formula then saves an empty tensor and the backward recomputes the gather and the first matmul).

Precision: every matmul and row kernel computes in fp32 and rounds its output once to x's dtype (h, act, y,
grad_h; ga stays fp32, as it feeds the routing weights' dot products; the gathered copies are exact); the
combine sums the K weighted rows in fp32. Hugging Face's loop
rounds act twice and accumulates ``index_add_`` in x's dtype, so half-precision results are at least as close to
the float64 reference. Indices outside [0, E]: an IndexError on CPU, a device-side assert on CUDA (queued, no
synchronisation); on an NPU (no device assert kernel) they count as E (nothing), and no kernel ever reads or
writes outside the weights.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from ..tiling import TileRequest, memoised_plan, plan_launch
from ..tiling.ub_manager import next_power_of_2
from ._grouped_mm import MMTiles, grouped_linear, grouped_weight_grad, tiles_for
from ._moe_kernels import (COMBINE_MEMORY_MULTIPLIER, GATHER_MEMORY_MULTIPLIER, SWIGLU_BWD_MEMORY_MULTIPLIER,
                           SWIGLU_FWD_MEMORY_MULTIPLIER, _fused_moe_combine_kernel, _fused_moe_gather_kernel,
                           _fused_moe_swiglu_bwd_kernel, _fused_moe_swiglu_fwd_kernel)
from ._triton import COMPUTE_DTYPE_SIZE, cdiv, check_float_tensor, new_like, require_launchable

INDEX_DTYPES = (torch.int32, torch.int64)
RECOMPUTE_ENV = "NPU_LIGER_MOE_RECOMPUTE"


def recompute_gate_up() -> bool:
    return os.environ.get(RECOMPUTE_ENV, "0") == "1"


def check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights) -> None:
    check_float_tensor("x", x)
    check_float_tensor("gate_up_proj", gate_up_proj)
    check_float_tensor("down_proj", down_proj)
    check_float_tensor("top_k_weights", top_k_weights)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, hidden), got shape {tuple(x.shape)}")
    hidden = x.shape[1]
    if gate_up_proj.dim() != 3 or gate_up_proj.shape[2] != hidden or gate_up_proj.shape[1] % 2:
        raise ValueError(f"gate_up_proj must have shape (E, 2 * intermediate, H) with H = {hidden}, got "
                         f"{tuple(gate_up_proj.shape)}")
    experts, inter = gate_up_proj.shape[0], gate_up_proj.shape[1] // 2
    if experts < 1:
        raise ValueError("gate_up_proj must hold at least one expert (E >= 1)")
    if tuple(down_proj.shape) != (experts, hidden, inter):
        raise ValueError(f"down_proj must have shape (E, H, intermediate) = {(experts, hidden, inter)}, got "
                         f"{tuple(down_proj.shape)}")
    for name, t in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
        if t.dtype != x.dtype:
            raise TypeError(f"{name} must have the dtype of x ({x.dtype}), got {t.dtype}")
    if not isinstance(top_k_index, torch.Tensor):
        raise TypeError(f"top_k_index must be a torch.Tensor, got {type(top_k_index).__name__}")
    if top_k_index.dtype not in INDEX_DTYPES:
        raise TypeError(f"top_k_index must be int32 or int64, got {top_k_index.dtype}")
    if top_k_index.dim() != 2 or top_k_index.shape[0] != x.shape[0]:
        raise ValueError(f"top_k_index must have shape (T, K) with T = {x.shape[0]}, got {tuple(top_k_index.shape)}")
    if top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"top_k_weights must have the shape of top_k_index {tuple(top_k_index.shape)}, got "
                         f"{tuple(top_k_weights.shape)}")
    for name, t in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj), ("top_k_index", top_k_index),
                    ("top_k_weights", top_k_weights)):
        if t.device != x.device:
            raise RuntimeError(f"{name} must be on the device of x ({x.device}), got {t.device}")


def _check_index_range(flat: torch.Tensor, experts: int) -> None:
    if flat.numel() == 0:
        return
    if flat.device.type == "cpu":
        bad = flat[(flat < 0) | (flat > experts)]
        if bad.numel():
            raise IndexError(f"top_k_index holds {bad[0].item()}, outside [0, {experts}] (E = {experts} experts; "
                             f"E means a slot served elsewhere)")
    elif flat.device.type == "cuda":
        torch._assert_async(((flat >= 0) & (flat <= experts)).all(), "npu_liger.fused_moe: top_k_index outside [0, E]")


class Routing:
    """The device-side routing of (T, K) slots to E experts (module docstring): ``keys`` (slot -> expert, E for
    none), ``order`` (sorted row -> slot), ``pos`` (slot -> sorted row), ``bounds`` (E + 1 row offsets), and the
    grouped matmuls' fixed-size tile table."""

    def __init__(self, top_k_index: torch.Tensor, num_experts: int, tiles: MMTiles, check: bool = False):
        self.num_experts, self.tiles = num_experts, tiles
        self.n_tokens, self.top_k = top_k_index.shape
        n_slots = top_k_index.numel()
        device = top_k_index.device
        flat = top_k_index.reshape(-1).to(torch.int64)
        if check:
            _check_index_range(flat, num_experts)
        self.keys = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
        sorted_keys, self.order = torch.sort(self.keys, stable=True)
        self.bounds = torch.searchsorted(sorted_keys, torch.arange(num_experts + 1, device=device))
        self.pos = torch.empty_like(self.order).scatter_(0, self.order, torch.arange(n_slots, device=device))
        counts = self.bounds[1:] - self.bounds[:-1]
        tiles_per_expert = (counts + (tiles.block_m - 1)) // tiles.block_m
        tile_end = torch.cumsum(tiles_per_expert, 0)
        self.n_tiles = cdiv(n_slots, tiles.block_m) + min(num_experts, n_slots)
        j = torch.arange(self.n_tiles, device=device)
        self.tile_expert = torch.searchsorted(tile_end, j, right=True)
        expert = self.tile_expert.clamp(max=num_experts - 1)
        self.tile_row = self.bounds[expert] + (j - (tile_end[expert] - tiles_per_expert[expert])) * tiles.block_m

    def group_ends_i32(self) -> torch.Tensor:
        """The (E,) cumulative row ends, int32: ``torch._grouped_mm``'s ``offs``."""
        return self.bounds[1:].to(torch.int32)

    def valid_slots(self) -> torch.Tensor:
        return self.keys < self.num_experts


@memoised_plan
def _rows_plan(device_type: str, rows_pow2: int, n_cols: int, memory_multiplier: float):
    """(BLOCK_R, BLOCK_C) for a kernel over (rows, n_cols) tiles: the columns first (((n_cols,),) tiled on dim 0),
    then the rows that fit beside one column block (((rows_pow2, BLOCK_C),) tiled on dim 0, unit_param =
    BLOCK_C). The memory multipliers are in ``_moe_kernels.py``."""
    block_c = plan_launch(device_type, TileRequest(memory_multiplier, ((n_cols,),), (0,), COMPUTE_DTYPE_SIZE)).block
    return plan_launch(device_type, TileRequest(memory_multiplier, ((rows_pow2, block_c),), (0,), COMPUTE_DTYPE_SIZE))


def _plan(device_type: str, n_rows: int, n_cols: int, multiplier: float):
    plan = _rows_plan(device_type, next_power_of_2(max(n_rows, 1)), max(n_cols, 1), multiplier)
    block_r, block_c = plan.tiles[0]
    return plan, block_r, block_c


def gather_rows(src: torch.Tensor, routing: Routing) -> torch.Tensor:
    """``src[token of each sorted row]``: (T*K, C), rows past the served slots left unwritten."""
    n_rows, n_cols = routing.order.numel(), src.shape[1]
    out = torch.empty((n_rows, n_cols), dtype=src.dtype, device=src.device)
    if n_rows == 0 or n_cols == 0:
        return out
    plan, block_r, block_c = _plan(src.device.type, n_rows, n_cols, GATHER_MEMORY_MULTIPLIER)
    n_col_blocks = cdiv(n_cols, block_c)
    n_tasks = cdiv(n_rows, block_r) * n_col_blocks
    _fused_moe_gather_kernel[(plan.grid(n_tasks),)](
        src, routing.order, routing.bounds, out, n_rows, n_tasks, n_col_blocks, n_cols, routing.top_k,
        routing.num_experts, src.stride(0), src.stride(1), BLOCK_R=block_r, BLOCK_C=block_c, **plan.launch_options())
    return out


def swiglu_rows(h: torch.Tensor, routing: Routing) -> torch.Tensor:
    """``silu(h[:, :I]) * h[:, I:]`` for the served rows of the (T*K, 2I) gate/up buffer."""
    n_rows, inter = h.shape[0], h.shape[1] // 2
    act = torch.empty((n_rows, inter), dtype=h.dtype, device=h.device)
    if n_rows == 0 or inter == 0:
        return act
    plan, block_r, block_i = _plan(h.device.type, n_rows, inter, SWIGLU_FWD_MEMORY_MULTIPLIER)
    n_col_blocks = cdiv(inter, block_i)
    n_tasks = cdiv(n_rows, block_r) * n_col_blocks
    _fused_moe_swiglu_fwd_kernel[(plan.grid(n_tasks),)](
        h, act, routing.bounds, n_rows, n_tasks, n_col_blocks, inter, routing.num_experts, BLOCK_R=block_r,
        BLOCK_I=block_i, **plan.launch_options())
    return act


def swiglu_rows_backward(grad_act: torch.Tensor, h: torch.Tensor, weights: torch.Tensor,
                         routing: Routing) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_h (T*K, 2I), w * act (T*K, I), grad_w per sorted row (T*K,) fp32) for the served rows."""
    n_rows, inter = h.shape[0], h.shape[1] // 2
    grad_h, wact = new_like(h), torch.empty((n_rows, inter), dtype=h.dtype, device=h.device)
    grad_w = torch.zeros((n_rows,), dtype=torch.float32, device=h.device)
    if n_rows == 0 or inter == 0:
        return grad_h, wact, grad_w
    plan, block_r, block_i = _plan(h.device.type, n_rows, inter, SWIGLU_BWD_MEMORY_MULTIPLIER)
    n_row_blocks = cdiv(n_rows, block_r)
    _fused_moe_swiglu_bwd_kernel[(plan.grid(n_row_blocks),)](
        grad_act, h, weights, routing.order, routing.bounds, grad_h, wact, grad_w, n_rows, n_row_blocks, inter,
        routing.top_k, routing.num_experts, weights.stride(0), weights.stride(1), BLOCK_R=block_r, BLOCK_I=block_i,
        **plan.launch_options())
    return grad_h, wact, grad_w


def combine(y: torch.Tensor, routing: Routing, weights: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """(T, C): per token, the (weighted) sum of its served slots' rows of y, in slot order."""
    n_tokens, n_cols = routing.n_tokens, y.shape[1]
    out = torch.empty((n_tokens, n_cols), dtype=dtype, device=y.device)
    if n_tokens == 0 or n_cols == 0:
        return out
    if routing.top_k == 0:
        return out.zero_()
    plan, block_t, block_c = _plan(y.device.type, n_tokens, n_cols, COMBINE_MEMORY_MULTIPLIER)
    n_col_blocks = cdiv(n_cols, block_c)
    n_tasks = cdiv(n_tokens, block_t) * n_col_blocks
    w = y if weights is None else weights  # not read when unweighted
    _fused_moe_combine_kernel[(plan.grid(n_tasks),)](
        y, routing.pos, routing.keys, w, out, n_tokens, n_tasks, n_col_blocks, n_cols, routing.top_k,
        routing.num_experts, w.stride(0), w.stride(1) if w.dim() > 1 else 0, WEIGHTED=weights is not None,
        BLOCK_T=block_t, BLOCK_C=block_c, **plan.launch_options())
    return out


def _gate_up(x: torch.Tensor, gate_up_proj: torch.Tensor, routing: Routing) -> torch.Tensor:
    return grouped_linear(gather_rows(x, routing), gate_up_proj, routing)


def fused_moe_forward(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out (T, H) in x's dtype, h (T*K, 2I): the gate/up projections the backward needs)."""
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    require_launchable(x.device)
    routing = Routing(top_k_index, gate_up_proj.shape[0], tiles_for(x.device.type), check=True)
    h = _gate_up(x, gate_up_proj, routing)
    y = grouped_linear(swiglu_rows(h, routing), down_proj, routing)
    return combine(y, routing, top_k_weights, x.dtype), h


def _check_backward_inputs(grad_out, x, gate_up_proj, down_proj, top_k_index, top_k_weights) -> None:
    check_fused_moe_inputs(x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    check_float_tensor("grad_out", grad_out)
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out must have the shape of x {tuple(x.shape)}, got {tuple(grad_out.shape)}")
    require_launchable(x.device)


def _empty(x: torch.Tensor) -> torch.Tensor:
    """A gradient not asked for."""
    return torch.empty((0,), dtype=x.dtype, device=x.device)


# The backward is two steps, so that h (the forward's gate/up projections, saved for the backward) can be freed
# between them: the first reads it last, the second builds the largest buffers (a (T*K, H) gather and the
# gate_up_proj gradient). Each step drops every (T*K, ...) buffer it made as soon as their last product is done;
# the step boundary is where the caller lets h go (the eager formula hands it over, torch.compile's backward frees
# a saved tensor after its last use).
def fused_moe_backward_down(grad_out: torch.Tensor, x: torch.Tensor, gate_up_proj: torch.Tensor,
                            down_proj: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                            gate_up_out: torch.Tensor, grad_experts: bool = True
                            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step one, through down_proj and the SwiGLU: (grad_h (T*K, 2I), grad_down_proj (empty unless
    ``grad_experts``), grad_top_k_weights). ``gate_up_out``: the forward's h, or an empty tensor to recompute it."""
    _check_backward_inputs(grad_out, x, gate_up_proj, down_proj, top_k_index, top_k_weights)
    routing = Routing(top_k_index, gate_up_proj.shape[0], tiles_for(x.device.type))
    h = gate_up_out if gate_up_out.numel() or routing.order.numel() == 0 else _gate_up(x, gate_up_proj, routing)
    del gate_up_out
    grad_rows = gather_rows(grad_out.to(x.dtype), routing)
    grad_act = grouped_linear(grad_rows, down_proj.transpose(1, 2), routing, torch.float32)  # fp32: feeds a dot
    grad_h, weighted_act, grad_w_rows = swiglu_rows_backward(grad_act, h, top_k_weights, routing)
    del grad_act, h  # a recomputed h is freed here
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    grad_w = torch.where(routing.valid_slots(), grad_w_rows[routing.pos], zero)
    grad_w = grad_w.view(top_k_weights.shape).to(top_k_weights.dtype)
    grad_down = grouped_weight_grad(grad_rows, weighted_act, routing) if grad_experts else _empty(x)
    return grad_h, grad_down, grad_w


def fused_moe_backward_gate_up(grad_h: torch.Tensor, x: torch.Tensor, gate_up_proj: torch.Tensor,
                               top_k_index: torch.Tensor, grad_x: bool = True, grad_experts: bool = True
                               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Step two, from grad_h: (grad_x, grad_gate_up_proj), each empty unless asked for."""
    check_float_tensor("grad_h", grad_h)
    n_slots = top_k_index.numel()
    if grad_h.shape != (n_slots, gate_up_proj.shape[1]) or grad_h.dtype != x.dtype:
        raise ValueError(f"grad_h must be ({n_slots}, {gate_up_proj.shape[1]}) in {x.dtype}, got "
                         f"{tuple(grad_h.shape)} in {grad_h.dtype}")
    require_launchable(x.device)
    routing = Routing(top_k_index, gate_up_proj.shape[0], tiles_for(x.device.type))
    gx = combine(grouped_linear(grad_h, gate_up_proj.transpose(1, 2), routing), routing, None, x.dtype) if grad_x \
        else _empty(x)
    grad_gate_up = grouped_weight_grad(grad_h, gather_rows(x, routing), routing) if grad_experts else _empty(x)
    return gx, grad_gate_up


def fused_moe_backward(grad_out: torch.Tensor, x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                       top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate_up_out: torch.Tensor,
                       grad_x: bool = True, grad_experts: bool = True
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both steps: (grad_x, grad_gate_up_proj, grad_down_proj, grad_top_k_weights), for callers that keep h
    throughout anyway."""
    grad_h, grad_down, grad_w = fused_moe_backward_down(grad_out, x, gate_up_proj, down_proj, top_k_index,
                                                        top_k_weights, gate_up_out, grad_experts)
    gx, grad_gate_up = fused_moe_backward_gate_up(grad_h, x, gate_up_proj, top_k_index, grad_x, grad_experts)
    return gx, grad_gate_up, grad_down, grad_w
