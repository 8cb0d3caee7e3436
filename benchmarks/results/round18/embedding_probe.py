"""Round eighteen's probe (run from the repository root on a CUDA machine, PYTHONPATH=.): what the embedding
forward kernel's index check costs, at the harness shape (V 128256, D 4096, 16384 tokens, bf16). Kernel-only
do_bench medians (no host check, no assert), interleaved over 3 rounds, as fractions of the copy bandwidth:
the kernel with CHECK on (what the op runs), with CHECK off, a variant whose check is a masked store of the
flag (no per-tile reduction), the same three at other tile shapes, and torch.compile of F.embedding."""
import statistics

import torch
import triton
import triton.language as tl

from npu_liger.npu_ops import embedding as E
from npu_liger.npu_ops._triton import grid_stride, program_start

V, D, T = 128256, 4096, 16384


@triton.jit
def masked_flag_kernel(weight_ptr, indices_ptr, out_ptr, ok_ptr, n_tokens, num_embeddings, dim, stride_wv,
                       stride_wd, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    for start in tl.range(program_start(BLOCK_N), n_tokens, grid_stride(BLOCK_N)):
        tokens = start + tl.arange(0, BLOCK_N)
        token_mask = tokens < n_tokens
        rows = tl.load(indices_ptr + tokens, mask=token_mask, other=0).to(tl.int64)
        valid = token_mask & (rows >= 0) & (rows < num_embeddings)
        tl.store(ok_ptr + tokens * 0, tl.zeros_like(tokens).to(tl.int32), mask=token_mask & ~valid)
        src = weight_ptr + tl.where(valid, rows, 0)[:, None] * stride_wv
        dst = out_ptr + tokens[:, None] * dim
        for col_start in tl.range(0, dim, BLOCK_D):
            cols = (col_start + tl.arange(0, BLOCK_D)).to(tl.int64)
            col_mask = cols < dim
            values = tl.load(src + cols[None, :] * stride_wd, mask=valid[:, None] & col_mask[None, :], other=0.0)
            tl.store(dst + cols[None, :], values, mask=token_mask[:, None] & col_mask[None, :])


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(V, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    idx = torch.randint(0, V, (T,), device="cuda", generator=gen)
    out = torch.empty(T, D, device="cuda", dtype=torch.bfloat16)
    flag = torch.ones((), dtype=torch.int32, device="cuda")
    src, dst = torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), torch.empty(256 << 20, dtype=torch.uint8,
                                                                                         device="cuda")
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    copy_gbps = 2 * src.numel() / copy_ms / 1e6
    nbytes = 2 * T * D * 2 + T * 8
    plan = E._token_plan("cuda", triton.next_power_of_2(T), D)
    bn, bd = plan.tiles[0]
    print(f"{torch.cuda.get_device_name()}  copy {copy_gbps:.0f} GB/s  plan tiles {plan.tiles} "
          f"grid {plan.grid(triton.cdiv(T, bn))} options {plan.launch_options()}")

    def ours(check, bn=bn, bd=bd, warps=None):
        opts = dict(plan.launch_options())
        if warps:
            opts["num_warps"] = warps
        return lambda: E._embedding_fwd_kernel[(plan.grid(triton.cdiv(T, bn)),)](
            weight, idx, out, flag, T, V, D, weight.stride(0), weight.stride(1), CHECK=check, BLOCK_N=bn,
            BLOCK_D=bd, **opts)

    def masked(bn=bn, bd=bd):
        opts = plan.launch_options()
        return lambda: masked_flag_kernel[(plan.grid(triton.cdiv(T, bn)),)](
            weight, idx, out, flag, T, V, D, weight.stride(0), weight.stride(1), BLOCK_N=bn, BLOCK_D=bd, **opts)

    compiled = torch.compile(lambda: torch.nn.functional.embedding(idx, weight))
    variants = {"ours CHECK on": ours(True), "ours CHECK off": ours(False), "masked-store check": masked(),
                "compile F.embedding": compiled}
    for obn, obd in ((1, 4096), (2, 2048), (4, 1024), (8, 512)):
        if (obn, obd) != (bn, bd):
            variants[f"CHECK on  ({obn}, {obd})"] = ours(True, obn, obd)
            variants[f"CHECK off ({obn}, {obd})"] = ours(False, obn, obd)
            variants[f"masked    ({obn}, {obd})"] = masked(obn, obd)
    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    expected = torch.nn.functional.embedding(idx, weight)
    times = {k: [] for k in variants}
    for _ in range(3):
        for name, fn in variants.items():
            out.zero_()
            fn()
            result = out if name != "compile F.embedding" else fn()
            assert torch.equal(result, expected), name
            times[name].append(triton.testing.do_bench(fn, return_mode="median"))
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"{name:28s} {ms:.4f} ms  {nbytes / ms / 1e6:6.0f} GB/s  {nbytes / ms / 1e6 / copy_gbps:.3f} of copy"
              f"  rounds {min(ts):.4f}-{max(ts):.4f}")
    assert flag.item() == 1


if __name__ == "__main__":
    main()
