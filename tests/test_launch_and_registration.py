"""The launch policy per backend, the emulated chip table, and how the ops are registered."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import npu_liger
from checklist import DEVICE
from npu_liger.tiling import ASCEND_CHIPS, TileRequest, emulated_chip, get_chip, plan_launch
from npu_liger.tiling import launch

ELEMENTWISE = TileRequest(4.0, ((1 << 24,),), (0,), 4)


def test_chip_table_covers_the_families():
    for name in ["Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4", "Ascend910_9392", "Ascend950"]:
        chip = get_chip(name)
        assert chip.ub_bytes > 0 and chip.vector_cores > 0
    assert get_chip("Ascend910B3").ub_bytes == 196608 and get_chip("Ascend910B3").vector_cores == 40
    with pytest.raises(ValueError, match="unknown Ascend chip"):
        get_chip("Ascend310P9")


def test_emulated_chip_is_selectable(monkeypatch):
    monkeypatch.delenv("NPU_LIGER_EMULATED_CHIP", raising=False)
    monkeypatch.delenv("NPU_LIGER_EMULATED_UB_BYTES", raising=False)
    assert emulated_chip().name == "Ascend910B3"
    monkeypatch.setenv("NPU_LIGER_EMULATED_CHIP", "Ascend910B1")
    assert plan_launch("cpu", ELEMENTWISE).max_programs == 48
    monkeypatch.setenv("NPU_LIGER_EMULATED_UB_BYTES", "oops")
    with pytest.raises(ValueError, match="NPU_LIGER_EMULATED_UB_BYTES"):
        emulated_chip()


def test_cpu_plan_is_the_npu_plan_of_the_emulated_chip(monkeypatch):
    monkeypatch.delenv("NPU_LIGER_EMULATED_UB_BYTES", raising=False)
    for name, chip in ASCEND_CHIPS.items():
        monkeypatch.setenv("NPU_LIGER_EMULATED_CHIP", name)
        plan = plan_launch("cpu", ELEMENTWISE)
        safe_elements = chip.ub_bytes * 0.8 / (4.0 * 4)
        assert plan.block <= safe_elements < 2 * plan.block, name
        assert plan.backend == "cpu" and plan.chip == name and plan.ub_bytes == chip.ub_bytes
        assert plan.grid(10**9) == chip.vector_cores and plan.grid(3) == 3 and plan.grid(0) == 1
        assert plan.launch_options() == {}


def test_npu_plan_uses_ub_manager_and_driver_cores(monkeypatch):
    from npu_liger.tiling import reset_ub_manager

    monkeypatch.setenv("ASCEND_UB_CAPACITY_BITS", str(2 * 196608 * 8))
    monkeypatch.setattr(launch, "npu_vector_core_count", lambda device_index=0: 100_000)
    reset_ub_manager()
    try:
        plan = plan_launch("npu", ELEMENTWISE)
    finally:
        reset_ub_manager()
    assert plan.backend == "npu" and plan.block == 16384
    assert plan.grid(10**9) == 65535  # triton-ascend's grid limit caps the core count


def test_cuda_plan_is_one_program_per_tile_with_warps():
    plan = plan_launch("cuda", ELEMENTWISE)
    assert plan.max_programs is None and plan.grid(123_456) == 123_456
    assert plan.launch_options()["num_warps"] in (4, 8, 16)


def test_plans_are_memoised():
    assert plan_launch("cuda", ELEMENTWISE) is plan_launch("cuda", ELEMENTWISE)


def test_memoised_plan_functions_follow_the_chip_and_stay_visible_to_record_plans(monkeypatch):
    """A kernel's plan function runs once per (arguments, chip): the emulated UB is part of the key, and while
    record_plans() records it runs every time, naming the launcher that asked."""
    from npu_liger.tiling import memoised_plan, record_plans

    runs = []

    @memoised_plan
    def plan(device_type, n):
        runs.append(n)
        return plan_launch(device_type, TileRequest(4.0, ((n,),), (0,), 4))

    def launcher():
        return plan("cpu", 100_000)

    monkeypatch.delenv("NPU_LIGER_EMULATED_UB_BYTES", raising=False)
    first = launcher()
    assert launcher() is first and runs == [100_000]
    monkeypatch.setenv("NPU_LIGER_EMULATED_UB_BYTES", "4096")
    small = launcher()
    assert small.block < first.block and len(runs) == 2
    with record_plans() as records:
        launcher()
        launcher()
    assert len(records) == 2 and len(runs) == 4
    assert records[0].caller.endswith("test_launch_and_registration.launcher")


ALL_OPS = ["geglu", "swiglu", "embedding", "tvd", "rope", "qwen2vl_mrope", "llama4_rope"]


@pytest.mark.parametrize("op", ALL_OPS)
def test_ops_are_registered_for_every_backend_key(op):
    for name in [op, f"{op}_backward"]:
        for key in ["CPU", "CUDA", "PrivateUse1", "Autograd", "Meta"]:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"npu_liger::{name}", key), (name, key)
    assert callable(getattr(npu_liger, op)) and op in npu_liger.__all__


def test_npu_registration_path_after_privateuse1_rename():
    """torch_npu renames PrivateUse1 to "npu"; the ops must be found whichever is imported first."""
    script = textwrap.dedent(
        """
        import torch
        order = {order!r}
        if order == "rename-first":
            torch.utils.rename_privateuse1_backend("npu")
            import npu_liger
        else:
            import npu_liger
            torch.utils.rename_privateuse1_backend("npu")
        assert torch._C._get_privateuse1_backend_name() == "npu"
        for op in {ops!r}:
            for name in [op, op + "_backward"]:
                assert torch._C._dispatch_has_kernel_for_dispatch_key("npu_liger::" + name, "PrivateUse1"), name
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    for order in ["rename-first", "import-first"]:
        result = subprocess.run([sys.executable, "-c", script.format(order=order, ops=ALL_OPS)], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_import_touches_no_driver():
    script = "import npu_liger, torch; assert not torch.cuda.is_initialized(); print('ok')"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_cpu_without_interpreter_raises_clear_error():
    script = "import npu_liger, torch\n" \
             "try:\n    npu_liger.geglu(torch.ones(3), torch.ones(3))\n" \
             "except RuntimeError as e:\n    print('TRITON_INTERPRET=1' in str(e))\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.stdout.strip() == "True", result.stderr


def test_functional_api_is_exported():
    for op in ALL_OPS:
        assert getattr(npu_liger, op) is getattr(getattr(npu_liger.registrations, op), op)
        assert op in npu_liger.__all__


def test_eager_entry_matches_the_op_and_yields_to_dispatch_modes():
    """npu_liger.<op> skips the dispatcher in plain eager calls, but a TorchDispatchMode still sees the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    device = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
    a = torch.randn(37, device=device, requires_grad=True)
    b = torch.randn(37, device=device, requires_grad=True)
    fast = npu_liger.geglu(a, b)
    fast.sum().backward()
    fast_grads = (a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    slow = torch.ops.npu_liger.geglu(a, b)
    slow.sum().backward()
    assert torch.equal(fast, slow) and torch.equal(fast_grads[0], a.grad) and torch.equal(fast_grads[1], b.grad)
    assert fast.grad_fn is not None and "Geglu" in type(fast.grad_fn).__name__

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        npu_liger.geglu(a.detach(), b.detach())
    assert "npu_liger.geglu.default" in counter.ops


def test_eager_entry_without_grad_returns_plain_tensor():
    device = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
    a = torch.randn(5, device=device, requires_grad=True)
    with torch.no_grad():
        out = npu_liger.geglu(a, a.detach())
    assert out.grad_fn is None and not out.requires_grad


def test_record_plans_sees_every_launch_with_its_caller():
    """``npu_liger.tiling.record_plans()``: the supported way to watch launch plans (the demo uses it)."""
    import npu_liger
    from npu_liger.tiling import PlanRecord, record_plans

    a = torch.randn(3, 40, device=os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu"))
    npu_liger.swiglu(a, a)  # outside the block: not recorded
    with record_plans() as plans, record_plans() as nested:
        npu_liger.swiglu(a, a)
        npu_liger.tvd(torch.softmax(a, -1), torch.softmax(a * 2, -1))
    npu_liger.swiglu(a, a)
    assert all(isinstance(r, PlanRecord) for r in plans) and plans == nested
    callers = [r.caller for r in plans]
    assert callers[0].startswith("npu_liger.npu_ops.") and callers[-1] == "npu_liger.npu_ops.tvd.tvd_forward"
    assert len(plans) == 2 and plans[-1].request.shapes == ((40,),) and plans[-1].device_type == a.device.type


def test_direct_launch_key_separates_what_triton_specialises_on():
    """``LaunchedKernel`` reuses a compiled kernel only for arguments Triton would compile the same way: ints
    equal to 1, multiples of 16 and beyond 32 bits, tensor dtypes and 16-byte alignment all change the key."""
    from npu_liger.npu_ops._triton import _args_key

    def _arg_key(value):
        return _args_key((value,))

    keys = [_arg_key(v) for v in (1, 2, 3, 16, 32, 2**31, -2**31 - 1)]
    assert keys[1] == keys[2] and keys[3] == keys[4]  # 2 ~ 3, 16 ~ 32: compiled alike
    assert len({keys[0], keys[1], keys[3], keys[5]}) == 4 and keys[6] != keys[1]
    t = torch.zeros(8, dtype=torch.float32)
    assert _arg_key(t) != _arg_key(t[1:])  # 4-byte offset: no longer 16-byte aligned
    assert _arg_key(t) == _arg_key(torch.zeros(3, dtype=torch.float32)) != _arg_key(t.half())
    assert _arg_key(0.5) == _arg_key(2.0) and _arg_key(None) != _arg_key(False) != _arg_key(True)
    assert _args_key((t, 1, None)) != _args_key((t, 2, None)) and _args_key((1, 2)) != _args_key((2, 1))


def test_kernels_are_triton_functions_under_the_interpreter():
    from npu_liger.npu_ops import rms_norm
    from npu_liger.npu_ops._triton import LaunchedKernel, interpreter_enabled

    kernel = rms_norm._rms_norm_fwd_kernel
    assert isinstance(kernel, LaunchedKernel) != interpreter_enabled()
    assert kernel.fn.__name__ == "_rms_norm_fwd_kernel"  # JITFunction attributes reachable either way


@pytest.mark.skipif(os.environ.get("NPU_LIGER_TEST_DEVICE") != "cuda", reason="the direct launch is CUDA's")
@pytest.mark.parametrize("direct", ["1", "0"])
def test_direct_launch_reuses_compiled_kernels_and_matches_triton(direct):
    """Same results with and without the shortcut, on aligned and misaligned views, one entry per key."""
    script = textwrap.dedent("""
        import torch, npu_liger
        from npu_liger.npu_ops import swiglu
        kernel = swiglu._swiglu_fwd_kernel
        base = torch.randn(2, 4097, device="cuda")
        for _ in range(3):
            for offset in (0, 1, 4):  # 16-byte aligned, then two misaligned starts
                a, b = base[0, offset:offset + 4000], base[1, offset:offset + 4000]
                torch.testing.assert_close(npu_liger.swiglu(a, b), torch.nn.functional.silu(a) * b)
        print(len(kernel._compiled) if hasattr(kernel, "_compiled") else "none")
    """)
    env = dict(os.environ, NPU_LIGER_DIRECT_LAUNCH=direct)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    # offsets 1 and 4 elements (4 and 16 bytes): 0 and 4 are aligned, 1 is not -> two keys when direct
    assert result.stdout.strip() == ("2" if direct == "1" else "0"), result.stdout


def test_direct_launch_yields_to_launch_hooks():
    """Profilers install Triton launch hooks: then every launch takes Triton's own path (which calls them)."""
    import triton

    from npu_liger.npu_ops._triton import _launch_hooks_set

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime.launch_enter_hook, "add"):
        pytest.skip("this Triton has no launch-hook chains")
    assert not _launch_hooks_set()  # the default: empty chains
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert _launch_hooks_set()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


@pytest.mark.skipif(DEVICE != "cpu", reason="the Triton interpreter's cast")
def test_interpreter_rounds_bf16_to_nearest_even_as_compiled_triton_does():
    """fp32 -> bf16 in a kernel (a store's cast) rounds as torch's ``.bfloat16()`` does: ties to even, NaN stays
    NaN, overflow gives inf (the interpreter alone truncates: 1 + 3 * 2^-9 would become 1 + 2^-8)."""
    import triton
    import triton.language as tl

    from npu_liger.npu_ops._triton import launched_kernel

    @launched_kernel
    def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask).to(y_ptr.dtype.element_ty), mask=mask)

    special = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 3 * 2**-9, -(1 + 3 * 2**-9), float("nan"), float("inf"), 3.4e38, 0.0,
               -0.0, 1e-40]
    x = torch.cat([torch.tensor(special), torch.randn(1000) * 10.0 ** torch.randint(-30, 30, (1000,))])
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _copy_kernel[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert torch.equal(y.view(torch.int16)[~x.isnan()], x.bfloat16().view(torch.int16)[~x.isnan()])
    assert y[x.isnan()].isnan().all()


def test_on_helper_thread_returns_or_raises_in_the_caller():
    """allocate_outside_graph_pools' thread: the caller gets fn's result, or its exception, and fn ran elsewhere."""
    import threading

    from npu_liger.npu_ops._triton import on_helper_thread

    caller = threading.get_ident()
    assert on_helper_thread(threading.get_ident) != caller
    assert on_helper_thread(lambda: 42) == 42

    def fails():
        raise ValueError("from the helper")

    with pytest.raises(ValueError, match="from the helper"):
        on_helper_thread(fails)
