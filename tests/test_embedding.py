"""Embedding: exact gather, weight gradients against float64 (duplicates, padding row, both backward paths),
determinism, index-range errors and in-kernel masking, opcheck, compile, tiling loops, no mutation, bad input;
on CUDA: no host synchronisation, and the device-side assert for bad indices (in a subprocess)."""

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import npu_liger
import npu_liger.npu_ops.embedding as embedding_kernels
from checklist import (DEVICE, FLOAT_DTYPES, FP32_RTOL, UNIT_ROUNDOFF, assert_close, assert_compiles_without_recompiles,
                       assert_no_alias, assert_unchanged, randn, rel_error, run_opcheck, snapshot)
from checklist import assert_compiled_forward_backward

embedding_op = torch.ops.npu_liger.embedding.default
embedding_backward_op = torch.ops.npu_liger.embedding_backward.default
INDEX_DTYPES = (torch.int32, torch.int64)

# Embedding dims: 1, primes, and the emulated NPU's column blocks (forward 8192,
# sorted backward 512 at the default UB). Vocabulary sizes: 1, primes, powers of two.
EMBED_DIMS = st.sampled_from([1, 2, 3, 7, 13, 31, 64, 127, 511, 512, 513, 1000, 4097, 8191, 8193])
VOCAB_SIZES = st.sampled_from([1, 2, 3, 7, 13, 31, 64, 127, 257, 1000])
INDEX_DIMS = st.sampled_from([1, 2, 3, 5, 17, 64])


def make_indices(shape, num_embeddings, dtype=torch.int64, distinct=None):
    """Random indices drawing from ``distinct`` random rows (many duplicates when it is small)."""
    distinct = num_embeddings if distinct is None else min(distinct, num_embeddings)
    pool = torch.randperm(num_embeddings)[:distinct]
    return pool[torch.randint(0, distinct, tuple(shape))].to(dtype).to(DEVICE)


def check_forward_backward(weight, indices, padding_idx=None):
    """Forward exact against F.embedding; the weight gradient against float64 autograd (half precision also
    against the eager half-precision one, and within one rounding of the fp32 sum)."""
    weight = weight.detach().requires_grad_(True)
    before = snapshot((weight, indices))
    out = npu_liger.embedding(weight, indices, padding_idx)
    grad_out = randn(out.shape, out.dtype)
    out.backward(grad_out)
    assert_unchanged(before, (weight, indices), ("weight", "indices"))
    assert_no_alias((out, weight.grad), (weight, indices, grad_out))

    assert out.dtype == weight.dtype and out.shape == (*indices.shape, weight.shape[1]) and out.is_contiguous()
    assert torch.equal(out, F.embedding(indices, weight.detach(), padding_idx)), "a gather must be exact"

    w64 = weight.detach().double().requires_grad_(True)
    F.embedding(indices, w64, padding_idx).backward(grad_out.double())
    w_lp = weight.detach().clone().requires_grad_(True)
    F.embedding(indices, w_lp, padding_idx).backward(grad_out)
    assert weight.grad.dtype == weight.dtype and weight.grad.shape == weight.shape
    assert_close(weight.grad, w64.grad, w_lp.grad, what="grad_weight")
    if weight.dtype != torch.float32:  # fp32 accumulation: only the final rounding to half precision is lost
        err = rel_error(weight.grad, w64.grad)
        assert err <= UNIT_ROUNDOFF[weight.dtype], f"grad_weight ({weight.dtype}): {err:.3e} > one rounding"
    if padding_idx is not None:
        assert not weight.grad[padding_idx].any(), "the padding row must get no gradient"


def make_weight(num_embeddings, dim, dtype, layout):
    """``layout``: "contiguous"; "strided" (every other column of a wider buffer); "transposed" (column-major)."""
    if layout == "transposed":
        return randn((dim, num_embeddings), dtype).t()
    return randn((num_embeddings, dim), dtype, noncontiguous=layout == "strided")


@given(num_embeddings=VOCAB_SIZES, dim=EMBED_DIMS, index_shape=st.lists(INDEX_DIMS, min_size=0, max_size=3),
       index_dtype=st.sampled_from(INDEX_DTYPES), noncontiguous_indices=st.booleans(),
       dtype=st.sampled_from(FLOAT_DTYPES), layout=st.sampled_from(["contiguous", "strided", "transposed"]),
       distinct=st.sampled_from([1, 3, None]), padding=st.sampled_from([None, "used", "any", "negative"]),
       data=st.data())
def test_matches_reference(num_embeddings, dim, index_shape, index_dtype, noncontiguous_indices, dtype, layout,
                           distinct, padding, data):
    if num_embeddings * dim > 300_000:
        dim = 257
    while torch.Size(index_shape).numel() * max(dim, 64) > 100_000:  # keep the interpreter's work bounded
        index_shape = index_shape[1:]
    weight = make_weight(num_embeddings, dim, dtype, layout)
    if noncontiguous_indices and index_shape:
        wide = make_indices((*index_shape[:-1], 2 * index_shape[-1]), num_embeddings, index_dtype, distinct)
        indices = wide[..., ::2]
    else:
        indices = make_indices(index_shape, num_embeddings, index_dtype, distinct)
    padding_idx = None
    if padding == "used":
        padding_idx = int(indices.reshape(-1)[0])
    elif padding == "any":
        padding_idx = data.draw(st.integers(0, num_embeddings - 1), label="padding_idx")
    elif padding == "negative":  # counted from the end, as F.embedding does
        padding_idx = int(indices.reshape(-1)[0]) - num_embeddings if indices.numel() else -1
    check_forward_backward(weight, indices, padding_idx)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_many_duplicates_accumulate(dtype):
    indices = make_indices((4, 150), 50, torch.int32, distinct=3)
    check_forward_backward(randn((50, 33), dtype), indices, padding_idx=None)
    check_forward_backward(randn((50, 33), dtype), indices, int(indices[0, 0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_updates_are_not_lost(dtype):
    """1000 gradients of 1.0 into one row: half-precision accumulation would stall (bf16 at 256); fp32 gives
    1000, which both formats hold exactly."""
    indices = torch.zeros(1000, dtype=torch.int64, device=DEVICE)
    grad_out = torch.ones((1000, 5), dtype=dtype, device=DEVICE)
    grad_weight = embedding_backward_op(grad_out, indices, 3, -1)
    assert grad_weight.dtype == dtype
    assert torch.equal(grad_weight[0], torch.full((5,), 1000.0, dtype=dtype, device=DEVICE))
    assert not grad_weight[1:].any()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_is_bitwise_reproducible(dtype):
    """One sorted kernel, no atomics: the same bits run after run (the second run under
    ``torch.use_deterministic_algorithms(True)``, which the backward must not trip)."""
    indices = make_indices((3, 200), 64, torch.int64, distinct=7)
    grad_out = randn((3, 200, 70), dtype, scale=3.0)
    ref64 = torch.zeros((64, 70), dtype=torch.float64, device=DEVICE)
    ref64.index_add_(0, indices.reshape(-1), grad_out.reshape(-1, 70).double())
    ref64[5] = 0.0
    tol = FP32_RTOL if dtype == torch.float32 else UNIT_ROUNDOFF[dtype]
    first = embedding_backward_op(grad_out, indices, 64, 5)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        second = embedding_backward_op(grad_out.clone(), indices.clone(), 64, 5)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(first, second)
    assert rel_error(first, ref64) <= tol


class _NanEmpty:
    """Stands in for the ``torch`` module inside the kernel file: floating-point ``torch.empty`` comes back full
    of NaN, so any element of grad_weight the backward kernel fails to write shows up."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        out = torch.empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out


@pytest.mark.parametrize("dim", [1, 33, 600])
def test_backward_writes_every_element_of_grad_weight(dim, monkeypatch):
    """grad_weight is allocated uninitialised: untouched rows, the padding row and every column block must be
    written by the kernel (zeros where no token names the row)."""
    monkeypatch.setattr(embedding_kernels, "torch", _NanEmpty())
    indices = make_indices((2, 9), 40, distinct=6)
    grad_out = randn((2, 9, dim))
    grad_weight = embedding_backward_op(grad_out, indices, 40, int(indices[0, 0]))
    expected = torch.zeros(40, dim, dtype=torch.float64, device=DEVICE)
    expected.index_add_(0, indices.reshape(-1), grad_out.reshape(-1, dim).double())
    expected[int(indices[0, 0])] = 0.0
    assert not grad_weight.isnan().any(), "some elements of grad_weight were never written"
    assert_close(grad_weight, expected)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_long_runs_go_to_the_long_run_kernel(index_dtype, monkeypatch):
    """Runs around the LONG_RUN threshold (and a long padding run): the long-run kernel sums exactly the runs
    longer than LONG_RUN, each once, the main kernel every other row; together they write every element."""
    long_run = embedding_kernels.LONG_RUN
    lengths = {0: long_run, 1: long_run + 1, 2: 2 * long_run + 5, 3: 1, 4: 3, 5: 3 * long_run + 2, 7: long_run + 2}
    flat_indices = torch.cat([torch.full((count,), row) for row, count in lengths.items()])
    flat_indices = flat_indices[torch.randperm(flat_indices.numel())].to(index_dtype).to(DEVICE)
    monkeypatch.setattr(embedding_kernels, "torch", _NanEmpty())
    launches = []
    long_kernel = embedding_kernels._embedding_bwd_long_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return long_kernel[grid]

    monkeypatch.setattr(embedding_kernels, "_embedding_bwd_long_kernel", Counting())
    for padding_idx in (-1, 5):
        grad_out = randn((flat_indices.numel(), 37))
        grad_weight = embedding_backward_op(grad_out, flat_indices, 9, padding_idx)
        expected = torch.zeros(9, 37, dtype=torch.float64, device=DEVICE)
        expected.index_add_(0, flat_indices.long(), grad_out.double())
        if padding_idx >= 0:
            expected[padding_idx] = 0.0
        assert not grad_weight.isnan().any()
        assert_close(grad_weight, expected)
    assert len(launches) == 2


# On CUDA a bad index trips a device-side assert, which leaves the process's CUDA context unusable: the tests that
# raise IndexError run elsewhere, and test_bad_index_trips_the_device_assert_on_cuda checks CUDA in subprocesses.
HOST_CHECK = DEVICE != "cuda"


@pytest.mark.skipif(not HOST_CHECK, reason="CUDA reports bad indices by a device-side assert (tested below)")
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", [-1, -7, 10, 12345])
def test_out_of_range_indices_raise_naming_the_value(bad, index_dtype):
    weight = randn((10, 6), requires_grad=True)
    indices = torch.tensor([[0, 3], [bad, 9]], dtype=index_dtype, device=DEVICE)
    with pytest.raises(IndexError, match=rf"index {bad} is out of range .*num_embeddings=10"):
        npu_liger.embedding(weight, indices)
    with pytest.raises(IndexError, match=rf"index {bad} is out of range"):
        embedding_op(weight.detach(), indices)
    with pytest.raises(IndexError, match=rf"index {bad} is out"):
        embedding_backward_op(randn((2, 2, 6)), indices, 10, -1)


@pytest.mark.parametrize("by_token", [False, True])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_kernels_mask_out_of_range_indices_without_the_range_check(index_dtype, by_token, monkeypatch):
    """With the range check switched off, bad indices touch nothing outside weight: weight is a view into a
    buffer whose neighbouring rows hold a sentinel, and no sentinel reaches the output. Both backward task
    layouts (per vocabulary row, per token)."""
    monkeypatch.setattr(embedding_kernels, "check_index_range", lambda indices, num_embeddings, flag=None: None)
    monkeypatch.setattr(embedding_kernels, "_tasks_by_token", lambda *args: by_token)
    big = 2**31 - 1 if index_dtype == torch.int32 else 2**40
    buffer = torch.full((14, 5), 777.0, device=DEVICE)
    buffer[2:12] = randn((10, 5))
    weight = buffer[2:12]
    indices = torch.tensor([3, -1, 10, 0, -(2**31), big, 3, 11, -2], dtype=index_dtype, device=DEVICE)
    valid = (indices >= 0) & (indices < 10)
    out = embedding_kernels.embedding_forward(weight, indices)
    assert torch.equal(out[valid], weight[indices[valid].long()])
    assert not out[~valid].any(), "tokens with out-of-range indices read something"

    grad_out = randn((9, 5))
    grad_weight = embedding_kernels.embedding_backward(grad_out, indices, 10, -1)
    expected = torch.zeros(10, 5, device=DEVICE).index_add_(0, indices[valid].long(), grad_out[valid])
    assert_close(grad_weight, expected.double())


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad", [None, -1, 10, "min", "max"])
def test_kernels_clear_the_index_flag_for_out_of_range_indices(bad, index_dtype, monkeypatch):
    """CUDA's device-side check, run anywhere: the forward kernel and the backward kernel's per-row layout each
    clear the flag they are given exactly when some index is outside [0, V) (the flag is read here instead of
    being asserted on)."""
    flags = []
    monkeypatch.setattr(embedding_kernels, "index_check_flag",
                        lambda device: torch.ones((), dtype=torch.int32, device=device))
    monkeypatch.setattr(embedding_kernels, "check_index_range",
                        lambda indices, num_embeddings, flag=None: flags.append(int(flag)))
    monkeypatch.setattr(embedding_kernels, "_tasks_by_token", lambda *args: False)
    info = torch.iinfo(index_dtype)
    indices = make_indices((3, 7), 10, index_dtype)
    if bad is not None:
        indices[1, random.randrange(7)] = {"min": info.min, "max": info.max}.get(bad, bad)
    embedding_kernels.embedding_forward(randn((10, 6)), indices)
    embedding_kernels.embedding_backward(randn((3, 7, 6)), indices, 10, -1)
    assert flags == [int(bad is None)] * 2


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_autograd_backward_trusts_the_forwards_index_check(index_dtype, monkeypatch):
    """A plain eager training call checks the indices' range once, in the forward: the backward of that call
    launches for the indices the forward saved (``embedding_backward_of_forward``: no second check, int64 keys
    cast without the clamp) and gives the checked op's gradient. The op called directly still checks."""
    checks = []
    original = embedding_kernels.check_index_range
    monkeypatch.setattr(embedding_kernels, "check_index_range",
                        lambda *args, **kwargs: (checks.append("check"), original(*args, **kwargs)))
    weight = randn((40, 24), requires_grad=True)
    indices = make_indices((3, 50), 40, index_dtype, distinct=7)  # runs beyond LONG_RUN too
    grad_out = randn((3, 50, 24))
    npu_liger.embedding(weight, indices, 5).backward(grad_out)
    assert checks == ["check"]
    checked = embedding_backward_op(grad_out, indices, 40, 5)
    assert checks == ["check"] * 2 and torch.equal(weight.grad, checked)
    w64 = weight.detach().double().requires_grad_(True)
    F.embedding(indices, w64, 5).backward(grad_out.double())
    assert rel_error(weight.grad, w64.grad) <= FP32_RTOL


@pytest.mark.skipif(DEVICE != "cuda" or not hasattr(torch.cuda, "use_mem_pool"), reason="CUDA memory pools")
def test_kept_flag_is_allocated_outside_graph_pools(monkeypatch):
    """The first call's flag, kept for every later call, never lives in a CUDA-graph pool: torch.compile's
    CUDA-graph warm-up sends the calling thread's allocations to the graph's pool (as use_mem_pool does here),
    whose memory the replays overwrite; torch refuses such a tensor ("not tracked as outputs")."""
    monkeypatch.setattr(embedding_kernels, "_INDEX_FLAGS", {})
    device = torch.device(DEVICE)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        flag = embedding_kernels.index_check_flag(device)
        inside = torch.ones((), dtype=torch.int32, device=device)  # what an allocation there gets
    in_pool = {block["address"] for segment in pool.snapshot() for block in segment["blocks"]
               if block["state"] == "active_allocated"}
    assert inside.data_ptr() in in_pool, "the test's pool took nothing: it checks nothing"
    assert flag.data_ptr() not in in_pool and int(flag) == 1
    assert embedding_kernels.index_check_flag(device) is flag


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's index flag")
def test_index_flag_is_kept_per_device_except_while_capturing():
    """The kernels only ever clear the flag, and a cleared one trips the (sticky) device assert, so calls reuse
    one flag per device; a CUDA-graph capture gets a fresh one (allocated inside it, it would hold no 1 outside
    the graph). The capture and replay themselves: test_cuda_graph_capture_and_replay."""
    device = torch.device(DEVICE)
    flag = embedding_kernels.index_check_flag(device)
    assert embedding_kernels.index_check_flag(device) is flag and int(flag) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = embedding_kernels.index_check_flag(device)
    assert captured is not flag and embedding_kernels.index_check_flag(device) is flag


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 7)])
def test_empty_indices_give_empty_outputs(shape):
    weight = randn((7, 4), requires_grad=True)
    out = npu_liger.embedding(weight, torch.zeros(shape, dtype=torch.int64, device=DEVICE))
    assert out.shape == (*shape, 4)
    out.sum().backward()
    assert weight.grad.shape == (7, 4) and not weight.grad.any()


def test_zero_width_and_scalar_indices():
    weight = randn((7, 0), requires_grad=True)
    out = npu_liger.embedding(weight, torch.tensor([1, 2, 6], device=DEVICE))
    assert out.shape == (3, 0)
    out.sum().backward()
    assert weight.grad.shape == (7, 0)
    if HOST_CHECK:  # checked even when no kernel runs
        with pytest.raises(IndexError, match="index 7"):
            npu_liger.embedding(weight, torch.tensor([7], device=DEVICE))
    weight = randn((7, 3), requires_grad=True)
    out = npu_liger.embedding(weight, torch.tensor(4, device=DEVICE))
    assert out.shape == (3,) and torch.equal(out, weight[4])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_opcheck(dtype):
    weight = randn((11, 37), dtype, requires_grad=True)
    indices = make_indices((4, 5), 11, distinct=4)
    run_opcheck(embedding_op, (weight, indices))
    run_opcheck(embedding_op, (weight, indices.int(), int(indices[0, 0])))
    run_opcheck(embedding_op, (randn((11, 6), dtype, noncontiguous=True, requires_grad=True), indices.t(), 2))
    run_opcheck(embedding_backward_op, (randn((4, 5, 37), dtype), indices, 11, int(indices[1, 1])))
    run_opcheck(embedding_backward_op, (randn((4, 5, 37), dtype), indices.int(), 11, -1))


def test_compiled_fullgraph_dynamic_forward_backward_without_recompiles():
    compiled = assert_compiled_forward_backward(
        lambda w, i: npu_liger.embedding(w * 2.0, i, 1),
        lambda w, i: F.embedding(i, w * 2.0, padding_idx=1),
        lambda size: (randn(size[:2], requires_grad=True), make_indices((2, size[2]), size[0], distinct=4)),
        [(5, 19, 8), (9, 7, 33), (17, 33, 130), (40, 3, 7)],  # (num_embeddings, dim, tokens per row)
    )
    # The range check runs inside the op at run time, so it still fires in the compiled graph.
    if HOST_CHECK:
        with torch._dynamo.config.patch(error_on_recompile=True), pytest.raises(IndexError, match="index 40"):
            compiled(randn((40, 3), requires_grad=True), torch.tensor([[0, 40], [1, 2]], device=DEVICE))


def test_compile_helper_forward_only():
    assert_compiles_without_recompiles(
        lambda w, i: npu_liger.embedding(w, i) + 1.0,
        lambda n: (randn((n + 3, 5)), make_indices((n, 3), n + 3, torch.int32)),
        [4, 9, 17],
        lambda inputs, got, eager: assert_close(got, F.embedding(inputs[1], inputs[0].double()) + 1.0),
    )


def test_tiling_loops_iterate_with_a_small_ub(small_ub):
    """A 4 KiB UB: with D = 300 the forward walks 128-column blocks and the backward 16-column blocks, one token
    per forward tile; with D = 3 the forward's token blocks are 32 wide, and 1500 tokens make 47 of them, so
    the 40 programs of the persistent grid loop (as they do over the backward's row x column-block tasks)."""
    small_ub(4096)
    forward = embedding_kernels._token_plan("cpu", 32, 300, embedding_kernels.FORWARD_MEMORY_MULTIPLIER)
    assert forward.tiles == ((1, 128),) and forward.max_programs == 40
    assert embedding_kernels._backward_plan("cpu", 300).tiles == ((8, 16),)
    many_tokens = embedding_kernels._token_plan("cpu", 2048, 3, embedding_kernels.FORWARD_MEMORY_MULTIPLIER)
    assert many_tokens.tiles == ((32, 4),)
    check_forward_backward(randn((20, 300)), make_indices((2, 15), 20), 3)
    check_forward_backward(randn((20, 300), torch.bfloat16, noncontiguous=True), make_indices((30,), 20, distinct=5),
                           None)
    check_forward_backward(randn((50, 3)), make_indices((1500,), 50, torch.int32), 7)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs")
def test_cuda_graph_capture_and_replay():
    """Forward and backward (their index assert included: it is a kernel launch, no host copy) capture and
    replay, and give the eager results. A bad index in a replay: test_bad_index_trips_the_device_assert_on_cuda."""
    weight = randn((50, 64), torch.bfloat16)
    indices = make_indices((4, 33), 50, distinct=20)
    grad_out = randn((4, 33, 64), torch.bfloat16)
    eager_out = embedding_op(weight, indices)
    eager_grad = embedding_backward_op(grad_out, indices, 50, 3)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles the kernels) outside the capture
        embedding_op(weight, indices)
        embedding_backward_op(grad_out, indices, 50, 3)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = embedding_op(weight, indices)
        grad = embedding_backward_op(grad_out, indices, 50, 3)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager_out) and torch.equal(grad, eager_grad)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA's sync debug mode")
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_no_host_synchronisation_on_cuda(index_dtype):
    """Forward, and forward + backward through autograd (long runs included), with any synchronising CUDA call
    made an error: the index check is a device-side assert, and nothing else waits for the GPU."""
    weight = randn((300, 64), torch.bfloat16, requires_grad=True)
    indices = make_indices((4, 100), 300, index_dtype, distinct=9)  # runs of ~44 > LONG_RUN tokens
    indices[0, 0] = 299
    grad_out = randn((4, 100, 64), torch.bfloat16)
    npu_liger.embedding(weight, indices, 3).backward(grad_out)  # compiles the kernels outside the checked block
    weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = npu_liger.embedding(weight.detach(), indices, 3)
        npu_liger.embedding(weight, indices, 3).backward(grad_out)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(out, F.embedding(indices, weight.detach()))
    w64 = weight.detach().double().requires_grad_(True)
    F.embedding(indices, w64, 3).backward(grad_out.double())
    assert rel_error(weight.grad, w64.grad) <= UNIT_ROUNDOFF[torch.bfloat16]


_BAD_INDEX_SCRIPT = textwrap.dedent("""
    import sys, torch, npu_liger
    case = sys.argv[1]
    weight = torch.randn(10, 8, device="cuda", requires_grad=True)
    good = torch.tensor([[0, 9], [3, 4]], device="cuda")
    bad = torch.tensor([[0, 9], [3, int(sys.argv[2])]], device="cuda")
    if case == "forward":
        out = npu_liger.embedding(weight, bad)
    elif case == "backward":
        out = torch.ops.npu_liger.embedding_backward(torch.randn(2, 2, 8, device="cuda"), bad, 10, -1)
    else:  # a CUDA graph captured with good indices, replayed after a bad one is copied in
        static = good.clone()
        npu_liger.embedding(weight.detach(), static)  # compiles the kernel outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = npu_liger.embedding(weight.detach(), static)
        graph.replay()
        torch.cuda.synchronize()
        print("good replay ok", flush=True)
        static.copy_(bad)
        graph.replay()
    print("queued without error", flush=True)  # the assert is asynchronous: nothing has failed yet
    try:
        torch.cuda.synchronize()
    except RuntimeError as error:  # torch.AcceleratorError in recent versions: a RuntimeError
        print(f"raised {type(error).__name__}: {error}", flush=True)
        sys.exit(3)
    print("UNREACHED", flush=True)
""")


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA device-side assert")
@pytest.mark.parametrize("case, bad", [("forward", 10), ("forward", -1), ("backward", 12345), ("graph", 10)])
def test_bad_index_trips_the_device_assert_on_cuda(case, bad):
    """A device-side assert leaves the process's CUDA context unusable, so each case runs in its own Python: the
    op returns without synchronising, and the next synchronisation raises RuntimeError for the device-side
    assert, whose kernel printed the message naming indices and the range."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _BAD_INDEX_SCRIPT, case, str(bad)], cwd=Path(__file__).parents[1],
                          env=env, capture_output=True, text=True, timeout=300)  # cwd: this checkout's npu_liger
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3 and "queued without error" in proc.stdout, output
    assert "device-side assert triggered" in proc.stdout, output
    assert "embedding: indices must be in [0, 10)" in output, output  # printed by the assert kernel (torch >= 2.5)
    if case == "graph":
        assert "good replay ok" in proc.stdout, output


def test_module_matches_torch_embedding():
    torch.manual_seed(0)
    ours = npu_liger.nn.Embedding(23, 9, padding_idx=-1).to(DEVICE)
    assert ours.padding_idx == 22 and not ours.weight[22].any()
    ref = torch.nn.Embedding(23, 9, padding_idx=-1).to(DEVICE)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    indices = make_indices((4, 6), 23)
    indices[0, 0] = 22
    out, out_ref = ours(indices), ref(indices)
    assert torch.equal(out, out_ref)
    grad = randn(out.shape)
    out.backward(grad)
    out_ref.backward(grad)
    assert_close(ours.weight.grad, ref.weight.grad.double())
    assert not ours.weight.grad[22].any()
    assert "23, 9, padding_idx=22" in repr(ours)
    with pytest.raises(ValueError, match="padding_idx must be within"):
        npu_liger.nn.Embedding(5, 2, padding_idx=5)


def test_gradient_flows_to_weight_only_and_double_backward_raises():
    weight = randn((6, 4), requires_grad=True)
    indices = torch.tensor([1, 1, 5], device=DEVICE)
    with torch.no_grad():
        assert not npu_liger.embedding(weight, indices).requires_grad
    assert not npu_liger.embedding(weight.detach(), indices).requires_grad
    eager, dispatched = npu_liger.embedding(weight, indices), embedding_op(weight, indices)
    assert torch.equal(eager, dispatched)
    (grad_eager,) = torch.autograd.grad(eager.sum(), weight)
    grad_out = torch.ones_like(dispatched).requires_grad_(True)
    (grad_op,) = torch.autograd.grad(dispatched, weight, grad_out, create_graph=True)
    assert torch.equal(grad_eager, grad_op) and torch.equal(grad_op[1], torch.full((4,), 2.0, device=DEVICE))
    with pytest.raises(NotImplementedError, match="double backward"):
        grad_op.sum().backward()


def test_ops_are_registered_for_every_backend_key():
    for op in ["embedding", "embedding_backward"]:
        for key in ["CPU", "CUDA", "PrivateUse1"]:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"npu_liger::{op}", key), (op, key)


def _idx(*values):
    return lambda: torch.tensor(values, device=DEVICE)


@pytest.mark.parametrize(
    "weight, indices, padding_idx, error, match",
    [
        (lambda: torch.ones(4, 3, dtype=torch.int64, device=DEVICE), _idx(0), -1, TypeError,
         "weight must be float32, float16 or bfloat16"),
        (lambda: randn((4, 3)).double(), _idx(0), -1, TypeError, "weight must be float32"),
        (lambda: randn((12,)), _idx(0), -1, ValueError, "weight must be 2-D"),
        (lambda: randn((2, 3, 4)), _idx(0), -1, ValueError, "weight must be 2-D"),
        (lambda: randn((4, 3)), lambda: randn((2,)), -1, TypeError, "indices must be int32 or int64"),
        (lambda: randn((4, 3)), lambda: torch.zeros(2, dtype=torch.int16, device=DEVICE), -1, TypeError,
         "indices must be int32 or int64"),
        (lambda: randn((4, 3)), lambda: [0, 1], -1, TypeError, "indices must be a torch.Tensor"),
        (lambda: randn((4, 3)), lambda: torch.zeros(2, dtype=torch.int64, device="meta"), -1, RuntimeError,
         "indices must be on the device of weight"),
        (lambda: randn((4, 3)), _idx(0), 4, ValueError, r"padding_idx must be within \[-num_embeddings"),
        (lambda: randn((4, 3)), _idx(0), -5, ValueError, r"padding_idx must be within .* = \[-4, 4\), got -5"),
        (lambda: randn((4, 3)), _idx(0), True, TypeError, "padding_idx must be an int or None, got bool"),
        (lambda: randn((4, 3)), _idx(0), 1.0, TypeError, "padding_idx must be an int or None, got float"),
    ],
)
def test_bad_input_raises_clear_error(weight, indices, padding_idx, error, match):
    with pytest.raises(error, match=match):
        npu_liger.embedding(weight(), indices(), padding_idx)


@pytest.mark.parametrize(
    "grad_out, indices, num_embeddings, padding_idx, error, match",
    [
        (lambda: randn((3, 4)), _idx(0, 1), 5, -1, ValueError, r"grad_out must have shape \(\*indices.shape"),
        (lambda: randn((2,)), _idx(0, 1), 5, -1, ValueError, "grad_out must have shape"),
        (lambda: torch.ones(2, 4, dtype=torch.int32, device=DEVICE), _idx(0, 1), 5, -1, TypeError,
         "grad_out must be float32"),
        (lambda: randn((2, 4)), lambda: randn((2,)), 5, -1, TypeError, "indices must be int32 or int64"),
        (lambda: randn((2, 4)), _idx(0, 1), -3, -1, ValueError, "num_embeddings must be >= 0"),
        (lambda: randn((2, 4)), _idx(0, 1), 5, 5, ValueError, "padding_idx must be < num_embeddings"),
    ],
)
def test_backward_bad_input_raises_clear_error(grad_out, indices, num_embeddings, padding_idx, error, match):
    with pytest.raises(error, match=match):
        embedding_backward_op(grad_out(), indices(), num_embeddings, padding_idx)


@pytest.mark.parametrize("padding_idx", [None, -1, -3, 0, 4])
def test_padding_idx_follows_torch_everywhere(padding_idx):
    """The public function, nn.Embedding and the HF patch take torch's padding_idx: None is no padding row,
    -1 the last row (not "none", which is only the schema's internal sentinel)."""
    weight = randn((6, 5))
    indices = torch.tensor([[5, 0, 3], [5, 4, 2]], device=DEVICE)
    grad_out = randn((2, 3, 5))
    w_ref = weight.detach().clone().requires_grad_(True)
    F.embedding(indices, w_ref, padding_idx).backward(grad_out)
    w_ours = weight.detach().clone().requires_grad_(True)
    npu_liger.embedding(w_ours, indices, padding_idx).backward(grad_out)
    assert torch.equal(w_ours.grad, w_ref.grad)

    module = npu_liger.nn.Embedding(6, 5, padding_idx=padding_idx).to(DEVICE)
    torch_module = torch.nn.Embedding(6, 5, padding_idx=padding_idx).to(DEVICE)
    assert module.padding_idx == torch_module.padding_idx
    with torch.no_grad():
        module.weight.copy_(weight)
    module(indices).backward(grad_out)
    assert torch.equal(module.weight.grad, w_ref.grad)

    from npu_liger.transformers import modules

    hf_style = torch.nn.Embedding(6, 5, padding_idx=padding_idx).to(DEVICE)
    with torch.no_grad():
        hf_style.weight.copy_(weight)
    assert modules.patch_embedding(hf_style)
    hf_style(indices).backward(grad_out)
    assert torch.equal(hf_style.weight.grad, w_ref.grad)


@pytest.mark.parametrize("padding_idx", [-1, 3])
def test_backward_task_layouts_agree_and_token_tasks_scale_with_tokens(padding_idx, monkeypatch):
    """The per-token task layout (the CPU's when tokens < vocabulary rows) gives bitwise the per-row layout's
    result, long runs and the padding row included, and launches tasks in proportion to the tokens."""
    if DEVICE != "cpu":
        pytest.skip("the per-token layout is the CPU interpreter's")
    num_embeddings = 3000
    indices = torch.cat([torch.full((40,), 7), torch.tensor([3, 2999, 0, 3, 12, 3])]).to(DEVICE)  # a long run of 7
    indices = indices[torch.randperm(indices.numel(), device=DEVICE)].reshape(2, 23)
    grad_out = randn((2, 23, 9), torch.bfloat16)
    tasks = []
    kernel = embedding_kernels._embedding_bwd_kernel

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                tasks.append(args[6])  # n_tasks
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(embedding_kernels, "_embedding_bwd_kernel", Recording())
    by_token = embedding_kernels.embedding_backward(grad_out, indices, num_embeddings, padding_idx)
    monkeypatch.setattr(embedding_kernels, "_tasks_by_token", lambda *args: False)
    by_row = embedding_kernels.embedding_backward(grad_out, indices, num_embeddings, padding_idx)
    assert torch.equal(by_token, by_row)
    expected = torch.zeros(num_embeddings, 9, dtype=torch.float64, device=DEVICE)
    expected.index_add_(0, indices.reshape(-1), grad_out.reshape(-1, 9).double())
    if padding_idx >= 0:
        expected[padding_idx] = 0
    assert_close(by_token, expected, expected.to(torch.bfloat16))
    n_col_blocks = tasks[1] // num_embeddings
    assert tasks == [46 * n_col_blocks, num_embeddings * n_col_blocks]
