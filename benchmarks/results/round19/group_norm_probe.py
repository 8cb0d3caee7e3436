"""Round nineteen's group_norm probe (from the repository root: PYTHONPATH=. python
benchmarks/results/round19/group_norm_probe.py [--cpu] [--budget SECONDS]).

The harness row: x (32, 512, 64, 64) bf16, 32 groups (16 channels x 4096 positions = 65536 elements a group),
weight and bias (512,), eps 1e-5. Bytes as benchmarks/specs.py counts them: forward 2 x numel x 2 B,
forward+backward 5 x numel x 2 B; "bwd" (backward alone) is counted as 3 x numel x 2 B (x, dy read, dx written).

Rows (do_bench medians):
- "op default": npu_liger.group_norm as the harness calls it (autograd, host checks), the plan in
  group_norm.CUDA_GROUP_PLANS (forward: tile 4096, 8 warps, 2 programs/SM, prefetch; backward: 4096, 8, 1/SM).
- "new t<tile> w<warps> p<programs per SM or all> pf<prefetch>": the NEW kernels launched directly with that
  plan for both directions (fwd = forward kernel, bwd = backward kernel + the partials' sum); fwd+bwd = the two.
- "old": the round-18 kernels (3 walks each way, budget tiles), copied below, launched the same way.
- Liger-Kernel (liger_group_norm) and torch.compile(F.group_norm), eager.
Every row's y, dx, dweight, dbias are checked against an fp32 eager reference (max abs error printed).
--cpu: tiny shapes under TRITON_INTERPRET=1 (a smoke test of every variant, prefetch included; no timings).
"""
import argparse
import os
import sys
import time

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import npu_liger  # noqa: E402
from npu_liger.npu_ops import group_norm as G  # noqa: E402
from npu_liger.npu_ops._norm import as_rows, load_param, sum_partials  # noqa: E402
from npu_liger.npu_ops._triton import grid_stride, launched_kernel, new_like, program_start  # noqa: E402
from npu_liger.tiling import TileRequest, plan_launch  # noqa: E402
from npu_liger.tiling.launch import cuda_sm_count  # noqa: E402

EPS = 1e-5

# ---- the old (round 18) kernels, verbatim but renamed ------------------------------------------------------------

@triton.jit
def _total_old(t):
    return tl.sum(tl.sum(t, axis=1), axis=0)


@triton.jit
def _group_sum_old(x_row, shift, d, ch_ids, hw_ids, channels, positions, SQUARED: tl.constexpr, BLOCK_C: tl.constexpr,
               BLOCK_HW: tl.constexpr):
    """sum((x - shift) - d) (or, ``SQUARED``, of its square) over one group row, walked in (BLOCK_C, BLOCK_HW)
    chunks."""
    acc = tl.zeros((BLOCK_C, BLOCK_HW), dtype=tl.float32)
    for c in tl.range(0, channels, BLOCK_C):
        chans = c + ch_ids
        for h in tl.range(0, positions, BLOCK_HW):
            pos = h + hw_ids
            mask = (chans < channels) & (pos < positions)
            x = tl.load(x_row + chans * positions + pos, mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, (x - shift) - d, 0.0)
            if SQUARED:
                acc += xc * xc
            else:
                acc += xc
    return _total_old(acc)


@launched_kernel(do_not_specialize=["n_rows"])
def _old_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, num_groups, channels, positions, x_stride, eps,
                           HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, WHOLE: tl.constexpr,
                           BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """``channels``: channels per group; ``positions``: HW; one group row (n, g) per iteration."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    ch_ids = tl.arange(0, BLOCK_C)[:, None]
    hw_ids = tl.arange(0, BLOCK_HW)[None, :]
    size = channels * positions
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride
        y_row = y_ptr + row * size
        ch0 = (row % num_groups) * channels
        shift = tl.load(x_row).to(tl.float32)
        if WHOLE:  # the group in one tile: x read once
            ch_ok = ch_ids < channels
            mask = ch_ok & (hw_ids < positions)
            offs = ch_ids * positions + hw_ids
            xs = tl.where(mask, tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
            xc = tl.where(mask, xs - _total_old(xs) / size, 0.0)
            rstd = 1.0 / tl.sqrt(_total_old(xc * xc) / size + eps)
            w = load_param(w_ptr, ch0 + ch_ids, ch_ok, 1.0, HAS_WEIGHT)
            b = load_param(b_ptr, ch0 + ch_ids, ch_ok, 0.0, HAS_BIAS)
            tl.store(y_row + offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
        else:  # mean, variance, then normalise, each a walk over the group's chunks
            d = _group_sum_old(x_row, shift, 0.0, ch_ids, hw_ids, channels, positions, False, BLOCK_C, BLOCK_HW) / size
            var = _group_sum_old(x_row, shift, d, ch_ids, hw_ids, channels, positions, True, BLOCK_C, BLOCK_HW) / size
            rstd = 1.0 / tl.sqrt(var + eps)
            for c in tl.range(0, channels, BLOCK_C):
                chans = c + ch_ids
                ch_ok = chans < channels
                w = load_param(w_ptr, ch0 + chans, ch_ok, 1.0, HAS_WEIGHT) * rstd
                b = load_param(b_ptr, ch0 + chans, ch_ok, 0.0, HAS_BIAS)
                for h in tl.range(0, positions, BLOCK_HW):
                    pos = h + hw_ids
                    mask = ch_ok & (pos < positions)
                    offs = chans * positions + pos
                    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                    tl.store(y_row + offs, (((x - shift) - d) * w + b).to(y_ptr.dtype.element_ty), mask=mask)


@launched_kernel(do_not_specialize=["n_rows", "dy_stride"])
def _old_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, num_groups, channels, positions,
                           dy_stride, x_stride, eps, HAS_WEIGHT: tl.constexpr, WHOLE: tl.constexpr,
                           BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """dx (module docstring), and group row (n, g)'s shares of dweight and dbias into row n of dw_ptr / db_ptr
    (N, C) at the group's channels, fp32."""
    # Inductor passes Python floats as fp64 scalars; the math stays fp32 either way
    eps = tl.cast(eps, tl.float32)
    ch_ids = tl.arange(0, BLOCK_C)[:, None]
    hw_ids = tl.arange(0, BLOCK_HW)[None, :]
    p_ids = tl.arange(0, BLOCK_C)
    size = channels * positions
    for row in tl.range(program_start(1), n_rows, grid_stride(1)):
        x_row = x_ptr + row * x_stride
        dy_row = dy_ptr + row * dy_stride
        dx_row = dx_ptr + row * size
        ch0 = (row % num_groups) * channels
        p_off = (row // num_groups) * (num_groups * channels) + ch0  # (n, first channel of g) in the (N, C) buffers
        shift = tl.load(x_row).to(tl.float32)
        if WHOLE:
            ch_ok = ch_ids < channels
            mask = ch_ok & (hw_ids < positions)
            offs = ch_ids * positions + hw_ids
            xs = tl.where(mask, tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, xs - _total_old(xs) / size, 0.0)
            rstd = 1.0 / tl.sqrt(_total_old(xc * xc) / size + eps)
            xhat = xc * rstd
            g = dy * load_param(w_ptr, ch0 + ch_ids, ch_ok, 1.0, HAS_WEIGHT)
            mean_g = _total_old(g) / size
            mean_gx = _total_old(g * xhat) / size
            dx = (g - mean_g - xhat * mean_gx) * rstd
            tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            tl.store(dw_ptr + p_off + p_ids, tl.sum(dy * xhat, axis=1), mask=p_ids < channels)
            tl.store(db_ptr + p_off + p_ids, tl.sum(dy, axis=1), mask=p_ids < channels)
        else:
            d = _group_sum_old(x_row, shift, 0.0, ch_ids, hw_ids, channels, positions, False, BLOCK_C, BLOCK_HW) / size
            sum_sq = 0.0
            sum_g = 0.0
            sum_gxc = 0.0
            for c in tl.range(0, channels, BLOCK_C):
                chans = c + ch_ids
                ch_ok = chans < channels
                w = load_param(w_ptr, ch0 + chans, ch_ok, 1.0, HAS_WEIGHT)
                for h in tl.range(0, positions, BLOCK_HW):
                    pos = h + hw_ids
                    mask = ch_ok & (pos < positions)
                    offs = chans * positions + pos
                    xc = tl.where(mask, (tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) - shift) - d, 0.0)
                    g = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32) * w
                    sum_sq += _total_old(xc * xc)
                    sum_g += _total_old(g)
                    sum_gxc += _total_old(g * xc)
            rstd = 1.0 / tl.sqrt(sum_sq / size + eps)
            mean_g = sum_g / size
            mean_gx = sum_gxc * rstd / size
            for c in tl.range(0, channels, BLOCK_C):
                chans = c + ch_ids
                ch_ok = chans < channels
                w = load_param(w_ptr, ch0 + chans, ch_ok, 1.0, HAS_WEIGHT)
                dw_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
                db_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
                for h in tl.range(0, positions, BLOCK_HW):
                    pos = h + hw_ids
                    mask = ch_ok & (pos < positions)
                    offs = chans * positions + pos
                    x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                    dy = tl.load(dy_row + offs, mask=mask, other=0.0).to(tl.float32)
                    xhat = tl.where(mask, (x - shift) - d, 0.0) * rstd
                    dx = (dy * w - mean_g - xhat * mean_gx) * rstd
                    tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                    dw_acc += tl.sum(dy * xhat, axis=1)
                    db_acc += tl.sum(dy, axis=1)
                p_mask = c + p_ids < channels
                tl.store(dw_ptr + p_off + c + p_ids, dw_acc, mask=p_mask)
                tl.store(db_ptr + p_off + c + p_ids, db_acc, mask=p_mask)




def old_plan(device_type, n_groups, channels, positions, multiplier):
    spatial = plan_launch(device_type, TileRequest(multiplier, ((positions,),), (0,), 4))
    chans = plan_launch(device_type, TileRequest(multiplier, ((channels, spatial.block),), (0,), 4))
    whole = spatial.block >= positions and chans.block >= channels
    return G.GroupTiles(chans.block, spatial.block, whole, chans.grid(n_groups), chans.launch_options(), False)


# ---- launchers taking a plan ----------------------------------------------------------------------------------------

def fwd(x, w, b, groups, tiles, old=False):
    channels, positions = x.shape[1] // groups, x[0, 0].numel()
    x2, y = as_rows(x, channels * positions), new_like(x)
    kernel = _old_fwd_kernel if old else G._group_norm_fwd_kernel
    extra = {} if old else {"PREFETCH": tiles.prefetch}
    kernel[(tiles.grid,)](x2, w, b, y, x2.shape[0], groups, channels, positions, x2.stride(0), EPS, HAS_WEIGHT=True,
                          HAS_BIAS=True, WHOLE=tiles.whole, BLOCK_C=tiles.block_c, BLOCK_HW=tiles.block_hw,
                          **extra, **tiles.options)
    return y


def bwd(dy, x, w, groups, tiles, old=False):
    channels, positions = x.shape[1] // groups, x[0, 0].numel()
    x2, dy2, dx = as_rows(x, channels * positions), as_rows(dy, channels * positions), new_like(x)
    partials = torch.empty((2, x.shape[0], x.shape[1]), dtype=torch.float32, device=x.device)
    kernel = _old_bwd_kernel if old else G._group_norm_bwd_kernel
    extra = {} if old else {"PREFETCH": tiles.prefetch}
    kernel[(tiles.grid,)](dy2, x2, w, dx, partials[0], partials[1], x2.shape[0], groups, channels, positions,
                          dy2.stride(0), x2.stride(0), EPS, HAS_WEIGHT=True, WHOLE=tiles.whole,
                          BLOCK_C=tiles.block_c, BLOCK_HW=tiles.block_hw, **extra, **tiles.options)
    return (dx, *sum_partials(partials, (w.dtype, w.dtype)))


def new_tiles(n_groups, channels, positions, tile, warps, per_sm, prefetch):
    block_hw = min(triton.next_power_of_2(positions), tile)
    block_c = min(triton.next_power_of_2(channels), max(1, tile // block_hw))
    if CPU:  # tiles 64x smaller: several chunks, tails in both dims
        block_hw = min(triton.next_power_of_2(positions), max(1, tile // 64))
        block_c = min(triton.next_power_of_2(channels), max(1, tile // 64 // block_hw))
        return G.GroupTiles(block_c, block_hw, False, min(n_groups, 3), {}, prefetch)
    grid = n_groups if per_sm is None else min(n_groups, per_sm * cuda_sm_count())
    return G.GroupTiles(block_c, block_hw, False, grid, {"num_warps": warps}, prefetch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--budget", type=float, default=50.0, help="seconds; later variants are skipped past it")
    args = parser.parse_args()
    t0 = time.time()
    dev = "cpu" if CPU else "cuda"
    N, C, H, W, groups = (2, 12, 8, 24, 2) if CPU else (32, 512, 64, 64, 32)
    dtype = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((N, C, H, W), device=dev, dtype=dtype, generator=gen)
    w = (1.0 + 0.1 * torch.randn((C,), device=dev, generator=gen)).to(dtype)
    b = (0.1 * torch.randn((C,), device=dev, generator=gen)).to(dtype)
    dy = torch.randn((N, C, H, W), device=dev, dtype=dtype, generator=gen)
    numel = x.numel()
    bytes_f, bytes_b, bytes_fb = 2 * numel * 2, 3 * numel * 2, 5 * numel * 2
    channels, positions, n_groups = C // groups, H * W, N * groups

    # fp32 reference
    xr, wr, br = (t.detach().float().requires_grad_(True) for t in (x, w, b))
    yr = F.group_norm(xr, groups, wr, br, EPS)
    yr.backward(dy.float())
    ref = (yr.detach(), xr.grad, wr.grad, br.grad)

    def errors(y, dx, dw, db):
        return "  err y {:.2e} dx {:.2e} dw {:.2e} db {:.2e}".format(
            *[(a.float() - r).abs().max().item() for a, r in zip((y, dx, dw, db), ref)])

    if CPU:
        def bench(fn):
            fn()
            return float("nan")
        copy_gbps = float("nan")
    else:
        def bench(fn):
            return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
        src = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy_gbps = 2 * src.numel() / bench(lambda: dst.copy_(src)) / 1e6
        del src, dst
    name = "CPU interpreter" if CPU else torch.cuda.get_device_name()
    print(f"{name}  copy {copy_gbps:.0f} GB/s  x {tuple(x.shape)} {dtype} G{groups}  triton {triton.__version__}"
          f"  torch {torch.__version__}")
    print(f"plans: forward {G.plan_groups(dev, n_groups, channels, positions, G.FORWARD_MEMORY_MULTIPLIER)}")
    print(f"       backward {G.plan_groups(dev, n_groups, channels, positions, G.BACKWARD_MEMORY_MULTIPLIER)}")

    def report(label, f_ms, b_ms, fb_ms, err):
        def cell(ms, nbytes):
            if ms != ms:  # nan (CPU)
                return "      -         "
            gbps = nbytes / ms / 1e6
            return f"{ms * 1e3:7.1f}us {gbps / copy_gbps:4.2f}c"
        print(f"{label:34s} fwd {cell(f_ms, bytes_f)}  bwd {cell(b_ms, bytes_b)}  fwd+bwd {cell(fb_ms, bytes_fb)}"
              f"{err}", flush=True)

    def autograd_row(label, call):
        try:
            xa, wa, ba = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
            y = call(xa, wa, ba)
            y.backward(dy)
            err = errors(y, xa.grad, wa.grad, ba.grad)

            def fb():
                y = call(xa, wa, ba)
                y.backward(dy)
            with torch.no_grad():
                f_ms = bench(lambda: call(x, w, b))
            report(label, f_ms, float("nan"), bench(fb), err)
        except Exception as e:  # noqa: BLE001
            print(f"{label:34s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)

    def direct_row(label, ft, bt, old=False):
        try:
            y = fwd(x, w, b, groups, ft, old)
            dx, dw, db = bwd(dy, x, w, groups, bt, old)
            err = errors(y, dx, dw, db)
            f_ms = bench(lambda: fwd(x, w, b, groups, ft, old))
            b_ms = bench(lambda: bwd(dy, x, w, groups, bt, old))
            report(label, f_ms, b_ms, f_ms + b_ms, err)
        except Exception as e:  # noqa: BLE001
            print(f"{label:34s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)

    autograd_row("op default (autograd)", lambda a, c, d: npu_liger.group_norm(a, c, d, groups, EPS))
    direct_row("old kernels", old_plan(dev, n_groups, channels, positions, G.FORWARD_MEMORY_MULTIPLIER),
               old_plan(dev, n_groups, channels, positions, G.BACKWARD_MEMORY_MULTIPLIER), old=True)
    variants = [  # tile, warps, programs per SM (None: one per group), prefetch
        (4096, 8, 2, True), (4096, 8, 1, True), (4096, 8, None, True), (4096, 8, None, False), (4096, 8, 2, False),
        (4096, 8, 4, True), (4096, 4, 2, True), (4096, 16, 1, True), (8192, 16, 1, True), (8192, 16, 2, True),
        (8192, 8, 1, True), (2048, 4, 4, True), (2048, 4, None, True), (2048, 4, 8, True), (4096, 4, 4, True),
        (8192, 16, None, False),
    ]
    for tile, warps, per_sm, prefetch in variants:
        if time.time() - t0 > args.budget and not CPU:
            print(f"new t{tile} w{warps} p{per_sm or 'all'} pf{int(prefetch)} skipped: past the {args.budget:.0f} s "
                  "budget")
            continue
        t = new_tiles(n_groups, channels, positions, tile, warps, per_sm, prefetch)
        direct_row(f"new t{tile} w{warps} p{per_sm or 'all'} pf{int(prefetch)}", t, t)
    if CPU:
        return
    try:
        from liger_kernel.transformers.functional import liger_group_norm
        autograd_row("liger", lambda a, c, d: liger_group_norm(a, c, d, C, groups, EPS))
    except Exception as e:  # noqa: BLE001
        print(f"liger FAILED: {type(e).__name__}: {e}")
    if time.time() - t0 < args.budget + 5:
        compiled = torch.compile(lambda a, c, d: F.group_norm(a, groups, c, d, EPS))
        autograd_row("torch.compile", compiled)
    autograd_row("eager", lambda a, c, d: F.group_norm(a, groups, c, d, EPS))
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
