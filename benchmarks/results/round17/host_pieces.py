"""Round seventeen's probe (run from the repository root on a CUDA machine:
``python benchmarks/results/round17/host_pieces.py``): what each piece of a launcher's host path costs on the GPU
host, in µs per call (``timeit``, best of 5 repeats of N calls, tiny tensors so the GPU keeps up and the time is
the host's). The pieces are the ones round sixteen timed on the development CPU with launches faked."""
import timeit

import torch
import torch.nn.functional as F

import npu_liger
from npu_liger.npu_ops import _triton
from npu_liger.npu_ops._triton import _args_key, _current_raw_stream, new_like
from npu_liger.npu_ops.swiglu import _swiglu_fwd_kernel

N = 2000


def us(fn, n=N):
    fn()
    torch.cuda.synchronize()
    best = min(timeit.repeat(fn, number=n, repeat=5))
    torch.cuda.synchronize()
    return best / n * 1e6


def main():
    dev = torch.device("cuda")
    a = torch.randn(4, 64, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    rows = {}
    rows["torch.empty_like(x, contiguous) on CUDA"] = us(lambda: new_like(a))
    rows["torch.empty((2, 40, 64), fp32) on CUDA"] = us(lambda: torch.empty((2, 40, 64), dtype=torch.float32,
                                                                              device=dev))
    rows["x.reshape(-1, n).stride(1)"] = us(lambda: a.reshape(-1, 64).stride(1))
    rows["torch.cuda.current_device()"] = us(torch.cuda.current_device)
    rows["raw stream"] = us(lambda: _current_raw_stream(0))
    args = (a.view(-1), b.view(-1), c.view(-1), a.numel())
    rows["_args_key(4 args)"] = us(lambda: _args_key(args))
    rows["kernel[grid](...) LaunchedKernel"] = us(lambda: _swiglu_fwd_kernel[(1,)](*args, BLOCK=256))
    entry = next(iter(_swiglu_fwd_kernel._compiled.values()))[0] if isinstance(
        _swiglu_fwd_kernel, _triton.LaunchedKernel) else None
    if entry is not None:
        fn, meta = entry.function, entry.packed_metadata
        rows["compiled.run(...) alone"] = us(lambda: entry.run(1, 1, 1, _current_raw_stream(0), fn, meta, None,
                                                             None, None, *args, 256))  # 256: BLOCK, by value
    rows["jit_function[grid](...) Triton's path"] = us(
        lambda: getattr(_swiglu_fwd_kernel, "jit_function", _swiglu_fwd_kernel)[(1,)](*args, BLOCK=256))
    rows["torch silu(a) * b (2 launches)"] = us(lambda: F.silu(a) * b)
    with torch.no_grad():
        rows["npu_liger.swiglu forward, no grad"] = us(lambda: npu_liger.swiglu(a, b))
    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    g = torch.randn_like(a)

    def fb(fn):
        return lambda: torch.autograd.grad(fn(al, bl), (al, bl), g)

    rows["swiglu f+b: npu_liger"] = us(fb(npu_liger.swiglu), 500)
    rows["swiglu f+b: eager torch"] = us(fb(lambda x, y: F.silu(x) * y), 500)
    rows["autograd.grad of x * 2 (1+1 launches)"] = us(lambda: torch.autograd.grad(al * 2, al, g), 500)
    x = torch.randn(4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    rows["layer_norm f+b: npu_liger"] = us(lambda: torch.autograd.grad(npu_liger.layer_norm(x, w, bias), (x, w, bias),
                                                                     g), 500)
    rows["layer_norm f+b: eager torch"] = us(lambda: torch.autograd.grad(F.layer_norm(x, (64,), w, bias),
                                                                       (x, w, bias), g), 500)
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        rows["swiglu f+b: Liger"] = us(fb(LigerSiLUMulFunction.apply), 500)
    except Exception as e:  # noqa: BLE001
        rows["swiglu f+b: Liger"] = f"unavailable ({type(e).__name__})"
    print(f"host µs per call, {torch.cuda.get_device_name()}, best of 5 x N")
    for name, value in rows.items():
        print(f"{name:48s} {value:8.2f}" if isinstance(value, float) else f"{name:48s} {value}")


if __name__ == "__main__":
    main()
