"""Round eighteen's probe (run from the repository root on a CUDA machine, PYTHONPATH=.): how much of the rotary
ops' forward+backward host time is the op template (entry, checks, call_op) and how much the launch path, on
the GPU host. Host µs per forward+backward (tiny tensors, best of 5 x 1000 calls) and whole-call do_bench medians
at the harness shape (bsz 4, seq 4096, 32 q / 8 kv heads, head_dim 128, bf16), the variants taking turns to
lead a round, for: the public function; a bare
autograd.Function around the same launchers (no entry rule, no input checks, no call_op); Liger-Kernel's."""
import statistics
import timeit

import torch
import triton

import npu_liger
from npu_liger.npu_ops.qwen2vl_mrope import launch_mrope
from npu_liger.npu_ops._rotary import launch_half_split


class BareRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return launch_half_split(q, k, cos, sin, backward=False)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        return (*launch_half_split(gq, gk, cos, sin, backward=True), None, None)


class BareMrope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, section):
        ctx.save_for_backward(cos, sin)
        ctx.section = section
        return launch_mrope(q, k, cos, sin, section, backward=False)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors
        return (*launch_mrope(gq, gk, cos, sin, ctx.section, backward=True), None, None, None)


def inputs(bsz, seq, hq, hk, hd, mrope):
    q = torch.randn(bsz, seq, hq, hd, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(bsz, seq, hk, hd, device="cuda", dtype=torch.bfloat16).requires_grad_()
    shape = (3, bsz, seq, hd) if mrope else (bsz, seq, hd)
    cos, sin = torch.randn(shape, device="cuda"), torch.randn(shape, device="cuda")
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    section = [hd // 8, 3 * hd // 16, 3 * hd // 16]
    return q, k, cos, sin, gq, gk, section


def variants(mrope):
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    out = {}
    if mrope:
        out["npu_liger"] = lambda q, k, c, s, sec: npu_liger.qwen2vl_mrope(t(q), t(k), c, s, sec)
        out["bare Function"] = lambda q, k, c, s, sec: BareMrope.apply(t(q), t(k), c, s, sec)
        try:
            from liger_kernel.ops.qwen2vl_mrope import LigerQwen2VLMRopeFunction as L
            out["liger"] = lambda q, k, c, s, sec: L.apply(t(q), t(k), c, s, sec, 1)[:2]
        except ImportError as e:
            print("liger:", e)
    else:
        out["npu_liger"] = lambda q, k, c, s, sec: npu_liger.rope(t(q), t(k), c, s)
        out["bare Function"] = lambda q, k, c, s, sec: BareRope.apply(t(q), t(k), c, s)
        try:
            from liger_kernel.ops.rope import LigerRopeFunction as L
            out["liger"] = lambda q, k, c, s, sec: L.apply(t(q), t(k), c, s, None, 1)[:2]
        except ImportError as e:
            print("liger:", e)
    return out


def fb(fn, q, k, c, s, gq, gk, sec):
    oq, ok = fn(q, k, c, s, sec)
    return torch.autograd.grad((oq, ok), (q, k), (gq.transpose(1, 2), gk.transpose(1, 2)))


def main():
    print(torch.cuda.get_device_name())
    for mrope in (False, True):
        name = "qwen2vl_mrope" if mrope else "rope"
        small = inputs(1, 4, 2, 1, 16, mrope)
        big = inputs(4, 4096, 32, 8, 128, mrope)
        vs = variants(mrope)
        host, dev = {k: [] for k in vs}, {k: [] for k in vs}
        names = list(vs)
        for r in range(3):
            for v in names[r % len(names):] + names[:r % len(names)]:  # each variant leads one round
                fn = vs[v]
                q, k, c, s, gq, gk, sec = small
                call = lambda: fb(fn, q, k, c, s, gq, gk, sec)  # noqa: E731
                call()
                torch.cuda.synchronize()
                host[v].append(min(timeit.repeat(call, number=1000, repeat=5)) / 1000 * 1e6)
                torch.cuda.synchronize()
                q, k, c, s, gq, gk, sec = big
                dev[v].append(triton.testing.do_bench(lambda: fb(fn, q, k, c, s, gq, gk, sec),
                                                      return_mode="median"))
        for v in vs:
            print(f"{name:14s} {v:14s} host f+b {statistics.median(host[v]):7.1f} µs   harness shape f+b "
                  f"{statistics.median(dev[v]):.4f} ms (rounds {min(dev[v]):.4f}-{max(dev[v]):.4f})")
    a = torch.randn(4, 64, device="cuda", requires_grad=True)
    g = torch.randn_like(a)
    floor = min(timeit.repeat(lambda: torch.autograd.grad(a * 2, a, g), number=1000, repeat=5)) / 1000 * 1e6
    print(f"autograd.grad of x * 2: {floor:.1f} µs")


if __name__ == "__main__":
    main()
