"""softmax: numerics and gradients against torch.softmax in float64 (half precision against torch's own
half-precision softmax), both kernel paths (several whole rows per tile; a row looped in chunks with the online
max and sum), non-finite rows as torch gives them, opcheck, compile, empty and bad input, the nn module."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
from checklist import (DEVICE, FLOAT_DTYPES, UNIT_ROUNDOFF, assert_close, assert_compiled_forward_backward,
                       assert_no_alias, assert_unchanged, randn, run_opcheck, snapshot)
from npu_liger.npu_ops import softmax as kernels
from npu_liger.npu_ops._norm import plan_rows

COLS = st.sampled_from([1, 2, 7, 33, 128, 257, 600])
LEADING = st.sampled_from([(), (1,), (5,), (3, 4), (2, 3, 7), (45,)])


def check_softmax(x):
    """``npu_liger.softmax(x)`` forward and x's gradient against torch.softmax in float64 and, for half precision,
    against torch's softmax in x's dtype; x unchanged and not aliased. Returns (y, grad_x)."""
    leaf = x.detach().requires_grad_(True)
    before = snapshot([leaf])
    y = npu_liger.softmax(leaf)
    dy = randn(y.shape, y.dtype)
    y.backward(dy)
    assert_unchanged(before, [leaf], ["x"])
    assert_no_alias([y, leaf.grad], [leaf, dy])
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous() and leaf.grad.dtype == x.dtype

    def reference(convert):
        ref_leaf = convert(x).detach().requires_grad_(True)
        ref = torch.softmax(ref_leaf, -1)
        ref.backward(dy.to(ref.dtype))
        return ref, ref_leaf.grad

    y64, g64 = reference(lambda t: t.double())
    y_lp, g_lp = reference(lambda t: t.clone())
    assert_close(y, y64, y_lp, what="softmax")
    # The gradient y * (dy - sum(y * dy)) cancels where a row is nearly one-hot: each element's rounding error
    # is about u * y * (|dy| + sum|y * dy|) however small the result (measured on an H200: 6e-4 relative in
    # float32 for 128 columns of scale 10). Four such units (the sum's order differs between kernels) floor the
    # tolerance; half precision also rounds twice (the stored y, then the gradient).
    u = 2.0**-24 if x.dtype == torch.float32 else UNIT_ROUNDOFF[x.dtype]
    dy64, yy = dy.double(), y64.abs()
    bound = (yy * (dy64.abs() + (yy * dy64.abs()).sum(-1, keepdim=True))).norm().item()
    g_norm = g64.norm().item()
    floor = 4.0 * u * bound / g_norm if g_norm > 0 else 0.0  # a zero gradient (one column) is judged absolutely
    assert_close(leaf.grad, g64, g_lp, what="grad of x", roundings=2, floor=floor)
    return y, leaf.grad


@given(leading=LEADING, n_cols=COLS, dtype=st.sampled_from(FLOAT_DTYPES), scale=st.sampled_from([1.0, 10.0]),
       shift=st.sampled_from([0.0, -300.0]), noncontiguous=st.booleans())
def test_matches_torch_softmax(leading, n_cols, dtype, scale, shift, noncontiguous):
    """``shift``: rows far from 0 (exp(x) alone would underflow: the max must be subtracted)."""
    check_softmax(randn((*leading, n_cols), dtype, noncontiguous=noncontiguous, scale=scale) + shift)


def test_tiny_ub_loops_wide_rows_and_packs_narrow_rows(small_ub):
    """A 1 KiB UB: 300-wide rows loop in 64-wide chunks (forward and backward); 16-wide rows go several per tile,
    and 85 x 4 rows over 40 programs take several iterations."""
    small_ub(1024)
    wide = plan_rows("cpu", 9, 300, kernels.FORWARD_MEMORY_MULTIPLIER, persistent=False)
    narrow = plan_rows("cpu", 85 * 4, 16, kernels.BACKWARD_MEMORY_MULTIPLIER, persistent=False)
    assert not wide.whole_row and wide.block_rows == 1 and wide.block_cols * 4 < 300
    assert narrow.whole_row and narrow.block_rows > 1 and narrow.grid == 40 < 85 * 4 / narrow.block_rows
    for shape, scale in (((9, 300), 5.0), ((85, 4, 16), 1.0)):
        check_softmax(randn(shape, scale=scale))
    x = randn((7, 300), torch.bfloat16, noncontiguous=True, scale=3.0)  # half precision through the looped path
    check_softmax(x)
    # a row whose first chunks are all -inf: the online statistics must not meet -inf - (-inf)
    x = randn((3, 300), scale=2.0)
    x[0, :200] = float("-inf")
    x[1, :64] = float("-inf")
    check_softmax(x)


def test_default_ub_keeps_hidden_8192_whole():
    """Ascend910B3: 8192-wide rows are one tile in the forward and the backward (tiles of at most 8192 elements,
    what the Ascend check fits); 16384 and 20000 loop."""
    if DEVICE != "cpu":
        pytest.skip("the emulated Ascend910B3 plan")
    for multiplier in (kernels.FORWARD_MEMORY_MULTIPLIER, kernels.BACKWARD_MEMORY_MULTIPLIER):
        tiles = plan_rows("cpu", 16384, 8192, multiplier, False)
        assert tiles.whole_row and tiles.block_rows == 1 and tiles.block_cols == 8192
        assert not plan_rows("cpu", 3, 16384, multiplier, False).whole_row
        assert not plan_rows("cpu", 3, 20000, multiplier, False).whole_row
        narrow = plan_rows("cpu", 4 * 32 * 1024, 128, multiplier, False)  # attention rows
        assert narrow.whole_row and narrow.block_rows * narrow.block_cols == 8192 and narrow.grid == 40


def test_cuda_plan_keeps_rows_up_to_16k_whole():
    """The CUDA policy (``_plan``) is plain arithmetic (no GPU needed): whole rows up to 16384 columns in one
    program, one row per program from 8192 columns (16 warps forward, 8 backward) with streaming stores; wider rows
    loop in 16384-column chunks on 16 warps with the prefetch and the reversed second walk; narrow rows go several
    per program with plain stores."""
    wide, switches = kernels._plan("cuda", 16384, 8192, "forward")
    assert (wide.whole_row, wide.block_rows, wide.block_cols, wide.grid, wide.options) == (
        True, 1, 8192, 16384, {"num_warps": 16})
    assert switches == {"PREFETCH": False, "REVERSE": False, "STREAM": True}
    back, _ = kernels._plan("cuda", 16384, 8192, "backward")
    assert back.whole_row and back.options == {"num_warps": 8}
    assert kernels._plan("cuda", 16384, 16384, "backward")[0].block_cols == 16384
    looped, switches = kernels._plan("cuda", 64, 65536, "forward")
    assert (looped.whole_row, looped.block_cols, looped.grid, looped.options) == (False, 16384, 64, {"num_warps": 16})
    assert switches == {"PREFETCH": True, "REVERSE": True, "STREAM": True}
    narrow, switches = kernels._plan("cuda", 65536, 1024, "forward")
    assert narrow.whole_row and narrow.block_rows > 1 and not switches["STREAM"]


@pytest.mark.parametrize("ub", [None, 1024])
def test_non_finite_rows_match_torch(ub, small_ub):
    """A NaN or +inf makes the row NaN, a row of -inf only is NaN, -inf entries of other rows give 0: what
    torch.softmax gives, on both kernel paths (the forward's NaN pattern and values; the backward's too)."""
    if ub is not None:
        small_ub(ub)
    x = randn((7, 300))
    x[1, 5] = float("nan")
    x[2, :] = float("-inf")
    x[3, 100] = float("inf")
    x[4, ::3] = float("-inf")
    x[5, 299] = float("nan")
    x[6, 0] = float("inf")
    x.requires_grad_(True)
    y = npu_liger.softmax(x)
    ref = torch.softmax(x.detach().clone().requires_grad_(True), -1)
    torch.testing.assert_close(y, ref, equal_nan=True)
    dy = randn(y.shape)
    y.backward(dy)
    ref_x = x.detach().clone().requires_grad_(True)
    torch.softmax(ref_x, -1).backward(dy)
    torch.testing.assert_close(x.grad, ref_x.grad, equal_nan=True)
    assert y[0].isfinite().all() and y[4].isfinite().all() and (y[4, ::3] == 0).all()
    # a NaN incoming gradient reaches its whole row (through sum(dy * y)), as torch's backward gives it
    dy[0, 7] = float("nan")
    got = torch.ops.npu_liger.softmax_backward(dy, y.detach())
    torch.testing.assert_close(got, torch._softmax_backward_data(dy, y.detach(), -1, y.dtype), equal_nan=True)
    assert got[0].isnan().all() and not got[4].isnan().any()


def test_cuda_prefetch_and_streaming_stores(monkeypatch, small_ub):
    """The CUDA-only switches of ``_plan``, which CI's interpreter never ran: ``PREFETCH`` (``CUDA_PREFETCH``: both
    walks of a looped row load the next chunk before reducing or storing this one; the second walk, reversed, loads
    the chunk before, none past the row's start) and ``STREAM`` (the ``.cs`` stores; the interpreter ignores the
    modifier, the branch's stores still run). Forced on the CPU plan with a 1 KiB UB: 300-wide rows in 64-wide
    chunks (a partial last one), forward and backward, rows whose first or last chunks are all -inf (prefetched
    values past the row's end are -inf too), the file's non-finite rows, and whole narrow rows (STREAM only)."""
    plan = kernels._plan
    on_cpu = []

    def cuda_like(device_type, n_rows, n_cols, direction):
        tiles, switches = plan(device_type, n_rows, n_cols, direction)
        on_cpu.append((switches["PREFETCH"], switches["STREAM"]))
        return tiles, {**switches, "PREFETCH": not tiles.whole_row, "STREAM": True}

    monkeypatch.setattr(kernels, "_plan", cuda_like)
    small_ub(1024)
    for direction in ("forward", "backward"):
        tiles, switches = cuda_like("cpu", 9, 300, direction)
        assert not tiles.whole_row and tiles.block_cols * 4 < 300 and switches["PREFETCH"] and switches["REVERSE"]
    check_softmax(randn((9, 300), scale=5.0))
    check_softmax(randn((7, 300), torch.bfloat16, noncontiguous=True, scale=3.0))
    x = randn((4, 300), scale=2.0)
    x[0, :200] = float("-inf")
    x[1, :64] = float("-inf")
    x[2, 256:] = float("-inf")  # the last (partial) chunk, the reversed walk's first
    x[3, 64:] = float("-inf")
    check_softmax(x)
    test_non_finite_rows_match_torch(1024, small_ub)  # through the forced switches too
    check_softmax(randn((85, 4, 16)))  # whole rows: PREFETCH stays off, STREAM on
    assert on_cpu and not any(p or s for p, s in on_cpu)  # the CPU plan had both off: they were forced


@pytest.mark.parametrize("shape", [(0, 16), (3, 0), (2, 0, 8), (0,)])
def test_empty_inputs(shape):
    x = randn(shape, requires_grad=True)
    y = npu_liger.softmax(x)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape


def test_zero_dim_input_is_one_element():
    x = torch.tensor(3.0, device=DEVICE, requires_grad=True)
    y = npu_liger.softmax(x)
    assert y.shape == () and y.item() == 1.0
    y.backward()
    assert x.grad.item() == 0.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    x = randn((5, 37), dtype, requires_grad=True)
    run_opcheck(torch.ops.npu_liger.softmax.default, (x,))
    run_opcheck(torch.ops.npu_liger.softmax.default, (randn((3, 2, 37), dtype, noncontiguous=True),))
    y = torch.softmax(x.detach().float(), -1).to(dtype)
    run_opcheck(torch.ops.npu_liger.softmax_backward.default, (randn((5, 37), dtype), y))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    def fn(x):
        return npu_liger.softmax(x * 2.0) * 3.0 + npu_liger.softmax(x.transpose(0, 1)).sum()

    assert_compiled_forward_backward(fn, lambda x: torch.softmax(x * 2.0, -1) * 3.0
                                     + torch.softmax(x.transpose(0, 1), -1).sum(),
                                     lambda n: (randn((n, 5, 40), requires_grad=True),), [7, 9, 17])


def test_double_backward_raises_clear_error():
    x = randn((3, 8), requires_grad=True)
    (gx,) = torch.autograd.grad((npu_liger.softmax(x) * randn((3, 8))).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("call,error,match", [
    (lambda: npu_liger.softmax(randn((3, 8)).long()), TypeError, "x must be float32"),
    (lambda: npu_liger.softmax(randn((3, 8)).double()), TypeError, "x must be float32"),
    (lambda: npu_liger.softmax([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
    (lambda: torch.ops.npu_liger.softmax_backward(randn((3, 8), torch.float16), randn((3, 8))), TypeError,
     "grad_out must be torch.float32"),
    (lambda: torch.ops.npu_liger.softmax_backward(randn((3, 9)), randn((3, 8))), ValueError,
     r"grad_out must have shape \(3, 8\)"),
])
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_module_is_the_function():
    module = npu_liger.nn.Softmax()
    x = randn((4, 3, 21))
    assert torch.equal(module(x), npu_liger.softmax(x))
    assert dict(module.state_dict()) == {} and not list(module.parameters())
