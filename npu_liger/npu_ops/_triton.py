"""What every kernel file shares: portable math helpers and the checks a launcher runs before launching.

Portability rules (docs/DESIGN.md, section 3): 1-D grids with stride loops, fp32 arithmetic inside kernels and a cast on
store, int64 offsets, no fp64/fp8, masks for padded extents, and math through the helpers below rather
than ``tl.math``/``libdevice`` names that differ between community Triton and triton-ascend (write tanh as
``2 * tl.sigmoid(2 * x) - 1``, or better, rearrange so the sigmoid is used directly).

Two Triton-interpreter quirks every kernel must respect (the CPU backend runs the interpreter):
- write ``tensor * CONSTANT``, not ``CONSTANT * tensor``, for ``tl.constexpr`` globals (the interpreter turns
  the latter into a constexpr that has no ``.to``);
- ``@triton.jit`` helpers return one value or a tuple of them (``chunk_walk``: the interpreter, CUDA and
  triton-ascend's frontend all take it), never a nested structure.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from typing import Callable

import torch
import triton
import triton.language as tl

from ..tiling import TileRequest, memoised_plan, plan_launch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# All kernel arithmetic is fp32, so every TileRequest sizes its tiles in fp32 elements.
COMPUTE_DTYPE_SIZE = 4


@memoised_plan
def flat_plan(device_type: str, n: int, memory_multiplier: float):
    """The plan of a kernel that tiles one dimension of ``n`` elements (a flat tensor, or one row at a time):
    request ((n,),) tiled on dim 0, no fixed dims. BLOCK = ``plan.block``."""
    return plan_launch(device_type, TileRequest(memory_multiplier, ((n,),), (0,), COMPUTE_DTYPE_SIZE))


@triton.jit
def tanh(y):
    """tanh without libdevice, to ~3e-7 relative error everywhere: (1 - e^-2|y|) / (1 + e^-2|y|) loses digits to
    cancellation near 0, so |y| < 0.25 takes the Taylor series to y^7 (remainder below 1e-7 there). NaN gives NaN,
    +-inf gives +-1 (as torch.tanh)."""
    a = tl.abs(y)
    e = tl.exp(a * -2.0)
    far = (1.0 - e) / (1.0 + e)
    a2 = a * a
    near = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))))
    t = tl.where(a < 0.25, near, far)
    return tl.where(y < 0.0, -t, t)


@triton.jit
def tanh_derivative(y):
    """1 - tanh(y)^2 = 4 e / (1 + e)^2 with e = e^-2|y|, to a few roundings everywhere: 1 - t * t from a rounded t
    cancels where tanh nears +-1 (at |y| = 5, 1 - t^2 is 1.8e-4 and t's one rounding is 3e-4 of it). NaN gives
    NaN, +-inf gives 0."""
    e = tl.exp(tl.abs(y) * -2.0)
    d = 1.0 + e
    return e * 4.0 / (d * d)


@triton.jit
def program_start(BLOCK: tl.constexpr):
    """int64 offset of this program's first block in a 1-D grid-stride loop."""
    return tl.program_id(0).to(tl.int64) * BLOCK


@triton.jit
def grid_stride(BLOCK: tl.constexpr):
    """int64 distance between a program's consecutive blocks (num_programs * BLOCK can pass 2**31)."""
    # `program_id * 0 +` makes a tensor on every flavour: the interpreter returns num_programs as a constexpr.
    return (tl.program_id(0) * 0 + tl.num_programs(0)).to(tl.int64) * BLOCK


@triton.jit
def chunk_walk(n_cols, BLOCK_N: tl.constexpr, REVERSE: tl.constexpr):
    """(chunks, first chunk's start, step) of a walk over a row's BLOCK_N-column chunks, forwards or, with
    ``REVERSE``, from the last chunk back to the first: a second walk over a row that a first walk just read finds
    the chunks read last still in the L2 (the looped softmax, grpo_loss's gradient pass)."""
    n_chunks = tl.cdiv(n_cols, BLOCK_N)
    if REVERSE:
        first = (n_chunks - 1) * BLOCK_N
        step = -BLOCK_N
    else:
        first = n_chunks * 0
        step = BLOCK_N
    return n_chunks, first, step


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code: plain integer math (``triton.cdiv`` is a constexpr function in recent Triton:
    ~1 us more per host call, measured on swiglu's launcher)."""
    return -(-a // b)


def interpreter_enabled() -> bool:
    """Whether this process's kernels were defined for the Triton interpreter (decided when triton.jit ran)."""
    return type(program_start).__name__ == "InterpretedFunction"


def interpreter_requested() -> bool:
    """Whether TRITON_INTERPRET asks for the interpreter now (the values triton reads as on)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def _interpret_value() -> str:
    value = os.environ.get("TRITON_INTERPRET")
    return "unset" if value is None else repr(value)


def _check_interpreter_consistent() -> None:
    """TRITON_INTERPRET is read when each ``triton.jit`` runs, so setting it after ``import triton`` but before
    ``import npu_liger`` gives interpreted kernels calling triton's own compiled helpers (``tl.sigmoid``, ...),
    which fails at the first launch with an unrelated-looking error. Refuse at import instead."""
    library = type(tl.sigmoid).__name__  # a @triton.jit function of triton.language.standard
    ours = type(program_start).__name__
    if library in ("JITFunction", "InterpretedFunction") and library != ours:
        change = "set" if ours == "InterpretedFunction" else "unset or changed"
        raise ImportError(
            f"TRITON_INTERPRET was {change} too late, after triton was imported (it is {_interpret_value()} now): "
            f"triton's own kernels were built with the interpreter "
            f"{'on' if library == 'InterpretedFunction' else 'off'}, npu_liger's with it "
            f"{'on' if ours == 'InterpretedFunction' else 'off'}. Set TRITON_INTERPRET=1 for CPU (or leave it "
            "unset for CUDA/NPU) before anything imports triton: in the shell (TRITON_INTERPRET=1 python ...), "
            "or at the very top of the script."
        )


_check_interpreter_consistent()


def _round_bf16_to_nearest_even() -> None:
    """Make the Triton interpreter round fp32 -> bf16 casts to nearest even, as compiled Triton (CUDA and
    triton-ascend) does: the interpreter truncates (``x.to(tl.bfloat16)`` and stores alike), which biases every
    bf16 result of the CPU backend towards zero (swiglu's mean error 3.6e-3 against 1.7e-3 for torch's rounding)
    and made CPU results differ from GPU ones. One place for every kernel: the interpreter's cast, by the usual
    bit arithmetic on the fp32 value (NaN kept a quiet NaN, overflow to inf). Other casts are untouched."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "npu_liger_rounds", False):
        return
    truncating_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
            nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
            rounded = np.where(nan, ((bits >> 16) | np.uint32(0x0040)).astype(np.uint16), rounded)
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return truncating_cast(self, src, dst_type)

    cast_impl.npu_liger_rounds = True
    builder.cast_impl = cast_impl

# The Triton interpreter keeps per-launch state (the current program id) in globals, so two threads launching
# at once corrupt each other's kernels (exceptions, or silently wrong results). CPU launches are serialised.
INTERPRETER_LOCK = threading.RLock()


if interpreter_enabled():
    _round_bf16_to_nearest_even()


def serialized(launcher):
    """``launcher`` holding ``INTERPRETER_LOCK`` while it runs when kernels run on the interpreter; unchanged
    (no cost) on GPU and NPU. ``define_op``/``define_autograd`` apply it to every op kernel; code that calls a
    launcher directly wraps it once at import."""
    if not interpreter_enabled():
        return launcher

    @functools.wraps(launcher)
    def locked(*args, **kwargs):
        with INTERPRETER_LOCK:
            return launcher(*args, **kwargs)

    return locked


# ---------------------------------------------------------------------------------------------------------------
# Launching a kernel on CUDA without JITFunction.run on every call.
#
# ``kernel[grid](*args, **constexprs)`` costs ~100 µs of host time per launch on a slow training-node CPU (see
# BENCHMARKS.md, "Host cost per call"): Triton binds the arguments, specialises each one, builds a cache key and
# launch metadata, then makes the ~16 µs driver launch. npu_liger's ops call the same few kernels with
# arguments of the same kinds over and over, so ``LaunchedKernel`` remembers the compiled kernel per cheap key
# (device; each tensor's dtype and 16-byte alignment; each int's "== 1", "% 16 == 0" and 32-bit range: every
# property Triton specialises on, a superset of them where an argument is not specialised; the constexprs and
# launch options) and calls the compiled kernel's launcher directly. The first launch of each key, launches
# under a Triton launch hook (profilers), callable grids, and every non-CUDA backend (the interpreter,
# triton-ascend) take Triton's own path. NPU_LIGER_DIRECT_LAUNCH=0 turns the shortcut off.


def _direct_launch_supported() -> bool:
    """CUDA's Triton, not the interpreter, with the launcher API this shortcut calls (Triton 3.x)."""
    if interpreter_enabled() or os.environ.get("NPU_LIGER_DIRECT_LAUNCH", "1") == "0":
        return False
    try:
        from triton.runtime.driver import driver

        return torch.cuda.is_available() and driver.active.get_current_target().backend == "cuda"
    except Exception:  # no usable driver: Triton's own path reports whatever is wrong
        return False


def _launch_hooks_set() -> bool:
    """Whether a launch hook is installed (Triton 3.5+ keeps them in HookChains, empty unless a profiler adds
    one; older versions keep a function or None)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return True  # an older Triton keeps its hooks elsewhere: always take its own path
    return any(_hook_active(h) for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def _current_raw_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)  # what Triton's CUDA driver itself calls


def _args_key(args) -> tuple:
    """What Triton's specialisation can depend on, per argument: a tensor's dtype and 16-byte alignment; an
    int's class among "== 1", "% 16 == 0" and 32-bit range (one small int, cheaper to build than a tuple: this
    runs on every launch); floats by type; anything else (None, bools, constexprs) by value."""
    key = []
    for arg in args:
        kind = type(arg)
        if kind is int:
            fits = -0x80000000 <= arg <= 0x7FFFFFFF
            key.append(1 if arg == 1 else (2 if arg & 15 == 0 else 3) if fits else (4 if arg & 15 == 0 else 5))
        elif isinstance(arg, torch.Tensor):
            key.append((arg.dtype, arg.data_ptr() & 15 == 0))
        elif kind is float:
            key.append(float)
        else:
            key.append((kind, arg))
    return tuple(key)


class _GraphCapture(threading.local):
    active = False


_graph_capture = _GraphCapture()


@contextlib.contextmanager
def capture_launches_in_graph():
    """Inside the block, ``LaunchedKernel`` launches go through ``torch.library.wrap_triton``: a graph being traced
    (AOTAutograd's functionalization) records each one as a Triton-kernel node, which Inductor then launches from
    its own generated code (``registrations/_op.py``, ``define_op``, says when)."""
    previous, _graph_capture.active = _graph_capture.active, True
    try:
        yield
    finally:
        _graph_capture.active = previous


def recording_launches(device: torch.device) -> bool:
    """Whether launches on ``device`` may be recorded rather than run now: inside ``capture_launches_in_graph``
    or a CUDA-graph capture, and on devices other than CPU and CUDA (NPU graph capture is not checked here).
    Code that keeps a device tensor between calls allocates a fresh one then (one allocated while recording
    is never filled outside the recording)."""
    if _graph_capture.active:
        return True
    if device.type == "cuda":
        return torch.cuda.is_current_stream_capturing()
    return device.type != "cpu"


def allocate_outside_graph_pools(make: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """``make()`` for a tensor kept between calls. On CUDA it runs on a helper thread and waits for its kernels
    there: a CUDA-graph capture and torch.compile's CUDA-graph warm-up both send this thread's allocations to the
    graph's private pool, whose memory later replays overwrite (torch refuses such a tensor, "tensor(s) in the
    cudagraph pool not tracked as outputs"). The caller must not be capturing (``recording_launches``)."""
    if device.type != "cuda":
        return make()

    def make_and_wait():
        with torch.cuda.device(device):
            made = make()
            torch.cuda.current_stream().synchronize()  # filled before any stream of the caller reads it
        return made

    return on_helper_thread(make_and_wait)


def on_helper_thread(fn: Callable):
    """``fn()`` run to completion on a new thread: its result, or its exception raised here."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error

    helper = threading.Thread(target=run, name="npu_liger-helper")
    helper.start()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class LaunchedKernel:
    """A ``@triton.jit`` kernel that the host launches (``kernel[grid](...)`` as usual); see the comment above.
    Attribute access goes to the JITFunction, so tools that inspect kernels see Triton's object."""

    _direct = None  # decided at the first launch of any kernel: _direct_launch_supported()

    def __init__(self, jit_function):
        self.jit_function = jit_function
        parameters = list(inspect.signature(jit_function.fn).parameters.values())
        self._names = [p.name for p in parameters]
        self._defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
        self._compiled = {}  # key -> (compiled kernel, names of the parameters after the positional arguments)

    def __getattr__(self, name):
        return getattr(self.jit_function, name)

    def __getitem__(self, grid):
        if _graph_capture.active:  # a traced graph records the launch (``capture_launches_in_graph``)
            return functools.partial(_recorded_launch, torch.library.wrap_triton(self.jit_function)[grid])
        if LaunchedKernel._direct is None:
            LaunchedKernel._direct = _direct_launch_supported()
        if not LaunchedKernel._direct or callable(grid) or _launch_hooks_set():
            return self.jit_function[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        device = torch.cuda.current_device()
        key = (device, _args_key(args), tuple(kwargs.items()))
        entry = self._compiled.get(key)
        if entry is None:  # first launch of this key: Triton compiles (or finds) and launches it
            compiled = self.jit_function[grid](*args, **kwargs)
            compiled = compiled.result() if hasattr(compiled, "result") else compiled
            self._compiled[key] = (compiled, self._names[len(args):])
            return compiled
        compiled, rest = entry
        values = (*args, *[kwargs[n] if n in kwargs else self._defaults[n] for n in rest])
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        compiled.run(grid[0], grid_1, grid_2, _current_raw_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *values)  # None: no launch metadata, no hooks
        return compiled


# Launch options a recorded launch drops: torch's wrap_triton takes num_warps, num_stages and num_ctas as launch
# options and any other keyword as a kernel argument. A register cap (maxnreg) is a tuning choice, never needed for
# correctness, so Inductor's launch goes without it.
_UNRECORDED_OPTIONS = ("maxnreg",)


def _recorded_launch(launch, *args, **kwargs):
    return launch(*args, **{k: v for k, v in kwargs.items() if k not in _UNRECORDED_OPTIONS})


def launched_kernel(fn=None, **jit_options):
    """``@triton.jit`` (same options) for a kernel launched from the host, as a ``LaunchedKernel`` on CUDA.
    ``@triton.jit`` helpers called from kernels stay plain. Under the interpreter this is ``triton.jit``."""

    def wrap(f):
        jitted = triton.jit(f, **jit_options)
        return jitted if interpreter_enabled() else LaunchedKernel(jitted)

    return wrap(fn) if fn is not None else wrap


def require_launchable(device: torch.device) -> None:
    """CPU tensors run through the Triton interpreter, which must be chosen before triton.jit runs."""
    if device.type == "cpu" and not interpreter_enabled():
        if interpreter_requested():  # set, but after triton (and npu_liger) were imported: the kernels are compiled
            raise RuntimeError(
                f"npu_liger runs CPU tensors through the Triton interpreter, and TRITON_INTERPRET is "
                f"{_interpret_value()} now, but it was set too late: npu_liger's kernels were built when triton "
                "and npu_liger were imported, without it. Set TRITON_INTERPRET=1 before anything imports triton: "
                "in the shell (TRITON_INTERPRET=1 python ...), or at the very top of the script."
            )
        raise RuntimeError(
            "npu_liger runs CPU tensors through the Triton interpreter: set TRITON_INTERPRET=1 in the "
            f"environment before importing triton or npu_liger (it is {_interpret_value()} now). CUDA and NPU "
            "tensors need it unset."
        )


def check_float_tensor(name: str, tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {tensor.dtype}")


def check_same_layout(name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``tensor`` must match ``ref`` in shape, dtype and device (the usual elementwise-pair contract)."""
    if tensor.shape != ref.shape:
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, got {tuple(tensor.shape)}")
    if tensor.dtype != ref.dtype:
        raise TypeError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {tensor.dtype}")
    if tensor.device != ref.device:
        raise RuntimeError(f"{name} must be on the device of {ref_name} ({ref.device}), got {tensor.device}")


def new_like(tensor: torch.Tensor, dtype=None) -> torch.Tensor:
    """A new contiguous tensor of ``tensor``'s shape and device, in ``dtype`` (default: the same), for a launcher
    to write. ``torch.empty_like`` with a memory format costs about half the host time of
    ``torch.empty(t.shape, dtype=..., device=...)``, which builds a Size and a device object per call (2.5 against
    5.3 us on a CI-class CPU); a launcher allocates one to three outputs per call."""
    return torch.empty_like(tensor, dtype=dtype, memory_format=torch.contiguous_format)


def flat(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D view of ``tensor`` (copying only when the input is not contiguous)."""
    return tensor.contiguous().view(-1)
