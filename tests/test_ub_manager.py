"""Conformance of npu_liger.tiling to the seed UB-manager specification (docs/UB_MANAGER.md)."""

import sys
import types

import pytest
import triton

from npu_liger.tiling import ub_manager as ubm
from npu_liger.tiling import UBManager, compute_default_tiling_strategy, get_ub_manager, reset_ub_manager

UB_192K_BITS = 192 * 1024 * 8


@pytest.fixture(autouse=True)
def fresh_singleton(monkeypatch):
    monkeypatch.delenv(ubm.UB_CAPACITY_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "tbe", raising=False)
    monkeypatch.delitem(sys.modules, "tbe.common", raising=False)
    monkeypatch.delitem(sys.modules, "tbe.common.platform", raising=False)
    reset_ub_manager()
    yield
    reset_ub_manager()


def fake_cann(monkeypatch, ub_bytes, calls):
    """Install a stand-in for CANN's tbe.common.platform that records the SoC it is told about."""
    platform = types.ModuleType("tbe.common.platform")
    platform.set_current_compile_soc_info = lambda soc: calls.append(("set_soc", soc))
    platform.get_soc_spec = lambda key: calls.append(("get", key)) or ub_bytes
    for name, module in (("tbe", types.ModuleType("tbe")), ("tbe.common", types.ModuleType("tbe.common")),
                         ("tbe.common.platform", platform)):
        monkeypatch.setitem(sys.modules, name, module)


def test_env_var_in_bits_comes_first(monkeypatch):
    calls = []
    fake_cann(monkeypatch, 262144, calls)
    monkeypatch.setenv(ubm.UB_CAPACITY_ENV, "1572864")
    manager = UBManager()
    assert manager.ub_capacity_bits == 1572864
    assert manager.ub_capacity_bytes == 196608
    assert calls == []  # CANN is not consulted when the variable is set


@pytest.mark.parametrize("raw", ["0", "-8", "lots", "", str(ubm.MAX_UB_CAPACITY_BITS + 1), "99999999999999999999999"])
def test_invalid_env_var_is_an_error_naming_it(monkeypatch, raw):
    monkeypatch.setenv(ubm.UB_CAPACITY_ENV, raw)
    with pytest.raises(ValueError, match=ubm.UB_CAPACITY_ENV):
        UBManager()


def test_cann_soc_spec_in_bytes_is_second(monkeypatch):
    calls = []
    fake_cann(monkeypatch, 196608, calls)
    manager = UBManager(npu_model="Ascend910B3")
    assert manager.ub_capacity_bits == 196608 * 8
    assert ("get", "UB_SIZE") in calls and ("set_soc", "Ascend910B3") in calls


def test_no_source_raises_runtime_error_with_instructions(monkeypatch):
    monkeypatch.setitem(sys.modules, "tbe", None)  # import fails
    with pytest.raises(RuntimeError, match="ASCEND_UB_CAPACITY_BITS.*set_env.sh"):
        UBManager()


def test_npu_model_unknown_without_torch_npu():
    assert UBManager(ub_capacity_bits=8).npu_model == "unknown"


def test_singleton_and_reset(monkeypatch):
    monkeypatch.setenv(ubm.UB_CAPACITY_ENV, "1000")
    first = get_ub_manager()
    assert get_ub_manager() is first and first.ub_capacity_bits == 1000
    monkeypatch.setenv(ubm.UB_CAPACITY_ENV, "2000")
    assert get_ub_manager().ub_capacity_bits == 1000  # cached until reset
    reset_ub_manager()
    assert get_ub_manager().ub_capacity_bits == 2000


@pytest.mark.parametrize("value", [0, -1, 1.5, "8"])
def test_explicit_capacity_must_be_positive_int(value):
    with pytest.raises(ValueError, match="ub_capacity_bits"):
        UBManager(ub_capacity_bits=value)


def test_normalize_tiling_dims():
    assert ubm._normalize_tiling_dims(0) == {0}
    assert ubm._normalize_tiling_dims((0, 2)) == {0, 2}
    assert ubm._normalize_tiling_dims(()) == set()
    assert ubm._normalize_tiling_dims([0]) == set()
    assert ubm._normalize_tiling_dims(None) == set()


@pytest.mark.parametrize("n", list(range(0, 70)) + [1000, 4095, 4096, 4097, 2**31 - 1, 2**40 + 3])
def test_next_power_of_2_agrees_with_triton(n):
    assert ubm.next_power_of_2(n) == triton.next_power_of_2(n)


def expected_block(ub_bits, margin, dtype_size, multiplier, unit_param):
    """The seed's formula written out independently: floor(safe bits / bits per block element), then the
    largest power of two not above it (at least 1)."""
    max_block = max(1, int(int(ub_bits * margin) // (multiplier * unit_param * dtype_size * 8)))
    block = 1
    while block * 2 <= max_block:
        block *= 2
    return block


@pytest.mark.parametrize("ub_bits", [UB_192K_BITS, 256 * 1024 * 8, 4096 * 8, 100])
@pytest.mark.parametrize("margin", [0.8, 0.9])
@pytest.mark.parametrize("dtype_size", [2, 4])
@pytest.mark.parametrize("multiplier", [3.0, 7.0, 10.0])
def test_default_strategy_formula(ub_bits, margin, dtype_size, multiplier):
    shapes = ((32, 128), (8, 128), (1 << 20,))
    got = ubm._default_strategy(ub_bits, margin, dtype_size, multiplier, shapes, (0, 0, 0))
    assert got == (
        expected_block(ub_bits, margin, dtype_size, multiplier, 128),
        expected_block(ub_bits, margin, dtype_size, multiplier, 128),
        expected_block(ub_bits, margin, dtype_size, multiplier, 1),
    )


def test_default_strategy_multi_dim_tiling_and_degenerate_fixed_dim():
    # tiling dims (0, 2): unit_param is dim 1 only; a fixed dim of size 0 falls back to unit_param 1
    assert ubm._default_strategy(UB_192K_BITS, 0.8, 4, 3.0, ((4, 10, 4),), ((0, 2),)) == (
        expected_block(UB_192K_BITS, 0.8, 4, 3.0, 10),)
    assert ubm._default_strategy(UB_192K_BITS, 0.8, 4, 3.0, ((4, 0),), (0,)) == (
        expected_block(UB_192K_BITS, 0.8, 4, 3.0, 1),)
    assert ubm._default_strategy(UB_192K_BITS, 0.8, 4, 3.0, (), ()) == ()


@pytest.mark.parametrize("bad_dim", [(), 2, -1, (0, 5), "0", [0]])
def test_invalid_tiling_dims_raise_value_error(bad_dim):
    manager = UBManager(ub_capacity_bits=UB_192K_BITS)
    with pytest.raises(ValueError, match="Invalid tiling_dim"):
        ubm._default_strategy(UB_192K_BITS, 0.8, 4, 3.0, ((4, 8),), (bad_dim,))
    with pytest.raises(ValueError, match="Invalid tiling_dim"):
        compute_default_tiling_strategy(shapes=((4, 8),), tiling_dims=(bad_dim,), ub_manager=manager)


def test_seed_examples_geglu_and_rope(monkeypatch):
    monkeypatch.setenv(ubm.UB_CAPACITY_ENV, str(UB_192K_BITS))
    # GEGLU forward, fp16, 4096 columns: desired 4096, max safe 8192 -> 4096
    assert compute_default_tiling_strategy(0.80, 2, 7.0, ((4096,),), (0,)) == ((4096,),)
    # larger rows are capped by the UB: 157286 bits*... -> largest power of two under 157286/(7*2) elements
    assert compute_default_tiling_strategy(0.80, 2, 7.0, ((100_000,),), (0,)) == (
        (expected_block(UB_192K_BITS, 0.8, 2, 7.0, 1),),)
    # ROPE: non-tiling head_dim padded to a power of two, tiled head counts capped
    got = compute_default_tiling_strategy(0.90, 4, 3.0, ((32, 128), (8, 96)), (0, 0))
    assert got == ((min(32, expected_block(UB_192K_BITS, 0.9, 4, 3.0, 128)), 128),
                   (min(8, expected_block(UB_192K_BITS, 0.9, 4, 3.0, 96)), 128))


def test_defaults_and_none_returns():
    manager = UBManager(ub_capacity_bits=UB_192K_BITS)
    default = compute_default_tiling_strategy(shapes=((1 << 20,),), tiling_dims=(0,), ub_manager=manager)
    assert default == ((expected_block(UB_192K_BITS, 0.8, 4, 10.0, 1),),)  # dtype_size 4, multiplier 10.0
    assert compute_default_tiling_strategy(0.8, 0, -1.0, ((1 << 20,),), (0,), ub_manager=manager) == default
    assert compute_default_tiling_strategy(shapes=None, tiling_dims=(0,), ub_manager=manager) is None
    assert compute_default_tiling_strategy(shapes=(), tiling_dims=(0,), ub_manager=manager) is None
    assert compute_default_tiling_strategy(shapes=((4,),), tiling_dims=None, ub_manager=manager) is None
    assert compute_default_tiling_strategy(shapes=((4,), (4,)), tiling_dims=(0,), ub_manager=manager) is None


def test_tiled_dim_never_exceeds_its_padded_size_and_is_at_least_one():
    manager = UBManager(ub_capacity_bits=UB_192K_BITS)
    assert compute_default_tiling_strategy(shapes=((3, 5),), tiling_dims=(0,), ub_manager=manager) == ((4, 8),)
    assert compute_default_tiling_strategy(shapes=((0,),), tiling_dims=(0,), ub_manager=manager) == ((1,),)
    tiny = UBManager(ub_capacity_bits=8)
    assert compute_default_tiling_strategy(shapes=((1000, 64),), tiling_dims=(0,), ub_manager=tiny) == ((1, 64),)


def test_compute_strategy_uses_singleton_without_explicit_manager(monkeypatch):
    with pytest.raises(RuntimeError):
        monkeypatch.setitem(sys.modules, "tbe", None)
        compute_default_tiling_strategy(shapes=((4,),), tiling_dims=(0,))
