"""The shared test factory every op's tests use: fresh inputs, tolerances, and the op checklist
(reference numerics, gradients, opcheck, fullgraph+dynamic compile without recompiles, no mutation)."""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, Sequence

import torch

DEVICE = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# fp32 kernels compute in fp32 and round once: relative error ~1e-7 against float64; 1e-5 leaves room for
# reductions over long rows. Half precision: a single final rounding is worth one unit roundoff, the floor of
# the tolerance. The Triton interpreter (CPU runs) truncates fp32 -> bf16 instead of rounding to nearest, which
# doubles that floor for bf16 there; compiled Triton rounds to nearest.
FP32_RTOL = 1e-5
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7 if DEVICE == "cpu" else 2.0**-8}


def randn(shape: Sequence[int], dtype=torch.float32, *, noncontiguous: bool = False, scale: float = 1.0,
          requires_grad: bool = False) -> torch.Tensor:
    """Fresh random data on the device under test. ``noncontiguous`` returns a strided view (every other
    element of a buffer twice as wide in the last dim)."""
    shape = tuple(shape)
    if noncontiguous and shape:
        wide = torch.randn(*shape[:-1], 2 * shape[-1], device=DEVICE) * scale
        t = wide.to(dtype)[..., ::2]
    else:
        t = (torch.randn(shape, device=DEVICE) * scale).to(dtype)
    return t.detach().requires_grad_(requires_grad)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().to(torch.float64).cpu(), ref.detach().to(torch.float64).cpu()
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return diff
    return diff / denom


def assert_close(out: torch.Tensor, ref64: torch.Tensor, eager_lowp: torch.Tensor | None = None, *, what="output"):
    """``out`` against the float64 reference. Half precision is judged against the eager half-precision
    reference's own error: no worse than twice it (floored at one unit roundoff)."""
    assert out.shape == ref64.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref64.shape)}"
    if out.numel() == 0:
        return
    err = rel_error(out, ref64)
    if out.dtype == torch.float32:
        tol = FP32_RTOL
    else:
        assert eager_lowp is not None, "half-precision checks need the eager half-precision reference"
        tol = max(2.0 * rel_error(eager_lowp, ref64), UNIT_ROUNDOFF[out.dtype])
    assert err <= tol, f"{what} ({out.dtype}): relative error {err:.3e} > tolerance {tol:.3e}"


def snapshot(tensors: Iterable) -> list:
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in tensors]


def assert_unchanged(before: list, after: Iterable, names: Sequence[str]):
    for name, old, new in zip(names, before, after):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old, new.detach()), f"{name} was modified by the op"


def assert_no_alias(outputs: Iterable[torch.Tensor], inputs: Iterable[torch.Tensor]):
    for out in outputs:
        for inp in inputs:
            if isinstance(out, torch.Tensor) and isinstance(inp, torch.Tensor) and out.numel() and inp.numel():
                assert out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr(), "output aliases an input"


def run_opcheck(op, args: tuple, kwargs: Dict | None = None):
    """torch.library.opcheck: schema, fake tensor, autograd registration and AOT dispatch consistency."""
    torch.library.opcheck(op, args, kwargs or {})


def assert_compiles_without_recompiles(fn: Callable, make_inputs: Callable[[int], tuple], sizes: Sequence[int],
                                       check: Callable[[tuple, object, object], None]):
    """``torch.compile(fn, fullgraph=True, dynamic=True)`` matches eager for every size, and after the first
    size no recompilation happens (shapes are symbolic end to end, tiles are chosen at run time)."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for i, size in enumerate(sizes):
        inputs = make_inputs(size)
        if i == 0:
            got = compiled(*inputs)
        else:
            with torch._dynamo.config.patch(error_on_recompile=True):
                got = compiled(*inputs)
        check(inputs, got, fn(*inputs))
