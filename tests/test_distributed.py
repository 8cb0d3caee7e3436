"""The ops under torch.distributed: real 2-process groups (gloo on CPU in CI, NCCL on 2 CUDA GPUs).

Each op runs with DTensor inputs in the layouts its sharding rule lists (no communication inside the op, the
expected output layout) and in layouts it does not list (DTensor redistributes first), forward and backward,
against the same op on the full tensors in one process. A small Llama-style model (npu_liger embedding, rope,
swiglu) trains a few steps under FSDP2 (``fully_shard``) and DDP with the loss patch on
(fused_linear_cross_entropy), and under tensor parallel (``parallelize_module``, also under ``torch.compile``),
matching the single-process run with the unfused loss.

All worker processes are launched once per pytest session (only the selected cases run) and time-bounded:
    pytest tests/test_distributed.py                                   # CPU, gloo, Triton interpreter
    NPU_LIGER_TEST_DEVICE=cuda pytest tests/test_distributed.py        # 2 GPUs, NCCL (NCCL_NVLS_ENABLE=0 kept)
Run one worker pair by hand: python tests/test_distributed.py [case ...]  (launches both ranks itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

WORLD_SIZE = 2
DEVICE = os.environ.get("NPU_LIGER_TEST_DEVICE", "cpu")
LAUNCH_TIMEOUT_S = float(os.environ.get("NPU_LIGER_DIST_TIMEOUT", "600"))  # the whole worker pair
COLLECTIVE_TIMEOUT_S = 120  # one collective (a rank that fails mid-case unblocks its peer after this)
CASES = {}  # name -> function(env) run on every rank


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------------------------------------------------------
# Launcher (the pytest process)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(names, timeout_s: float = LAUNCH_TIMEOUT_S) -> dict:
    """Run ``names`` on WORLD_SIZE fresh processes; returns case -> "ok" or the first failure (with its rank).
    Every rank writes its results as it goes, so a timeout still reports which cases finished."""
    out_dir = tempfile.mkdtemp(prefix="npu_liger_dist_")
    # the workers import npu_liger from this checkout, installed or not
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(WORLD_SIZE),
               NPU_LIGER_TEST_DEVICE=DEVICE, NPU_LIGER_DIST_OUT=out_dir, NCCL_NVLS_ENABLE="0",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    procs, logs = [], []
    for rank in range(WORLD_SIZE):
        log = open(os.path.join(out_dir, f"rank{rank}.log"), "w+")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", *names],
                                      env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=log,
                                      stderr=subprocess.STDOUT))
        logs.append(log)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            timed_out = True
            break
        if any(p.returncode not in (None, 0) for p in procs):  # a rank died: give its peer a moment, then stop
            try:
                [p.wait(timeout=30) for p in procs]
            except subprocess.TimeoutExpired:
                pass
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    results = {}
    for rank in range(WORLD_SIZE):
        path = os.path.join(out_dir, f"rank{rank}.json")
        per_rank = json.load(open(path)) if os.path.exists(path) else {}
        for name in names:
            status = per_rank.get(name)
            if status is None:
                logs[rank].seek(0)
                tail = logs[rank].read()[-4000:]
                status = (f"did not finish ({'timed out after %.0f s' % timeout_s if timed_out else 'worker exited'},"
                          f" exit code {procs[rank].returncode}); log tail:\n{tail}")
            if results.get(name, "ok") == "ok" and status != "ok":
                results[name] = f"rank {rank}: {status}"
            results.setdefault(name, status)
    for log in logs:
        log.close()
    if all(status == "ok" for status in results.values()):
        shutil.rmtree(out_dir, ignore_errors=True)
    else:
        results = {name: status if status == "ok" else f"{status}\n(worker logs: {out_dir})"
                   for name, status in results.items()}
    return results


# ---------------------------------------------------------------------------------------------------------------
# Worker


class Env:
    """What a case gets: the mesh, this rank, the device and helpers to build identical data on every rank."""

    def __init__(self):
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.device = torch.device(f"cuda:{self.rank}") if DEVICE == "cuda" else torch.device(DEVICE)
        self.mesh = init_device_mesh(self.device.type, (self.world,))

    def randn(self, *shape, seed, dtype=None):
        import torch

        g = torch.Generator().manual_seed(seed)  # on the CPU, so every rank and device gets the same numbers
        return torch.randn(shape, generator=g, dtype=dtype or torch.float32).to(self.device)


def _worker(names):
    if DEVICE == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton (through npu_liger) is first imported
    from datetime import timedelta

    import torch
    import torch._dynamo
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    if DEVICE == "npu":
        import torch_npu  # noqa: F401
    backend = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[DEVICE]
    dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    torch.set_num_threads(1)
    import npu_liger  # noqa: F401

    env = Env()
    results, path = {}, os.path.join(os.environ["NPU_LIGER_DIST_OUT"], f"rank{rank}.json")
    for name in names:
        started = time.perf_counter()
        try:
            CASES[name](env)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the launcher
            results[name] = traceback.format_exc()
        print(f"[rank {rank}] {name}: {'ok' if results[name] == 'ok' else 'FAILED'} "
              f"({time.perf_counter() - started:.1f} s)", flush=True)
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)
        torch._dynamo.reset()
        dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------------
# Op cases: DTensor vs the single-process op


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def layout(*placements, out=None, no_comm=True):
    """One way to distribute an op's arguments: a placement per argument (None: not a tensor), the expected
    output placements (the rule's own layout) and whether the op must run without any collective (forward, and
    its backward op through autograd), i.e. whether a rule matches these placements as they are."""
    return placements, out, no_comm


def check_sharded(env, fn, args, layouts, *, grads=(), seed=1000, mesh=None):
    """``fn(*args)`` with DTensor arguments, for each of ``layouts``, against ``fn`` on the full tensors in this
    process: the outputs, and the gradients of the arguments whose indices are in ``grads``. On a 2-D ``mesh``
    each placement is a tuple (one per mesh dim)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    ref_args = [a.detach().clone().requires_grad_(i in grads) if isinstance(a, torch.Tensor) else a
                for i, a in enumerate(args)]
    ref_out = _as_tuple(fn(*ref_args))
    cotangents = [env.randn(*o.shape, seed=seed + i, dtype=o.dtype) for i, o in enumerate(ref_out)]
    if grads:
        sum((o * c).sum() for o, c in zip(ref_out, cotangents, strict=True)).backward()

    mesh = mesh or env.mesh
    as_placements = lambda pl: tuple(pl) if isinstance(pl, tuple) else (pl,)  # noqa: E731
    for placements, out, no_comm in layouts:
        where = f"placements {placements}"
        dt_args = [distribute_tensor(a.detach(), mesh, as_placements(pl)).requires_grad_(i in grads)
                   if pl is not None else a for i, (a, pl) in enumerate(zip(args, placements, strict=True))]
        comm = CommDebugMode() if no_comm else contextlib.nullcontext()
        with comm:
            dt_out = _as_tuple(fn(*dt_args))
        if no_comm:
            assert comm.get_total_counts() == 0, f"{where}: forward communicated: {comm.get_comm_counts()}"
        for i, (o, r) in enumerate(zip(dt_out, ref_out, strict=True)):
            assert isinstance(o, DTensor), f"{where}: output {i} is {type(o).__name__}, not a DTensor"
            if out is not None:
                assert o.placements == as_placements(out[i]), f"{where}: output {i} placed {o.placements}, " \
                                                               f"expected {out[i]}"
            torch.testing.assert_close(o.full_tensor(), r.detach(), msg=lambda m: f"{where}: output {i}: {m}")
        if not grads:
            continue
        loss = sum((o.full_tensor() * c).sum() for o, c in zip(dt_out, cotangents, strict=True))
        comm = CommDebugMode() if no_comm else contextlib.nullcontext()
        with comm:
            loss.backward()
        if no_comm:
            assert comm.get_total_counts() == 0, f"{where}: backward communicated: {comm.get_comm_counts()}"
        for i in grads:
            g = dt_args[i].grad
            assert isinstance(g, DTensor), f"{where}: grad of argument {i} is {type(g).__name__}"
            torch.testing.assert_close(g.full_tensor(), ref_args[i].grad,
                                       msg=lambda m: f"{where}: grad of argument {i}: {m}")


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Replicate(), Partial(), Shard


def _from_local(env, t, placement):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, env.mesh, [placement], run_check=False)


@case
def gated_mlp_ops(env):
    """geglu/swiglu: every common Shard(d) and Replicate, no communication; Partial and mixed layouts are
    redistributed (a Partial input must never reach a nonlinear op)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    a, b = env.randn(5, 6, 8, seed=1), env.randn(5, 6, 8, seed=2)  # dim 0 splits unevenly (3 + 2)
    for fn in (npu_liger.geglu, npu_liger.swiglu):
        check_sharded(env, fn, (a, b), [layout(pl, pl, out=(pl,)) for pl in (S(0), S(1), S(2), R)]
                      + [layout(S(0), R, no_comm=False)], grads=(0, 1))
        # a as a Partial sum of per-rank pieces: the op must see the reduced value
        got = fn(_from_local(env, a / env.world, P), _from_local(env, b, R))
        torch.testing.assert_close(got.full_tensor(), fn(a, b))
        # the backward op itself: grad_c Partial with a, b replicated stays Partial (linear in grad_c)
        backward_op = getattr(torch.ops.npu_liger, fn.__name__ + "_backward")
        g = env.randn(5, 6, 8, seed=3)
        grads = backward_op(_from_local(env, g / env.world, P), _from_local(env, a, R), _from_local(env, b, R))
        for got, ref in zip(grads, backward_op(g, a, b), strict=True):
            assert got.placements == (P,), got.placements
            torch.testing.assert_close(got.full_tensor(), ref)


@case
def distillation_and_rl_losses(env):
    """kl_div as tvd (rows or vocab, per reduction); jsd vocab-sharded (its terms are elementwise, the divisor
    global) -> Partial; fused_linear_jsd and grpo_loss replicated (sharded inputs are gathered first)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    y_pred = torch.log_softmax(env.randn(6, 10, seed=21), -1)
    y_true = torch.softmax(env.randn(6, 10, seed=22), -1)
    exact = {"none": {"rows": S(0), "vocab": S(1)}, "sum": {"rows": P, "vocab": P}, "batchmean": {"vocab": P},
             "mean": {}}
    for reduction, exact_layouts in exact.items():
        layouts = []
        for name, pl in {"rows": S(0), "vocab": S(1), "replicated": R}.items():
            expected = exact_layouts.get(name, R if name == "replicated" else None)
            layouts.append(layout(pl, pl, out=None if expected is None else (expected,), no_comm=expected is not None))
        check_sharded(env, lambda x, t: npu_liger.kl_div(x, t, reduction), (y_pred, y_true), layouts, grads=(0, 1))
    target = torch.log_softmax(env.randn(6, 10, seed=23), -1)
    labels = torch.tensor([1, -100, 3, 4, -100, 0], device=env.device)
    for lab in (None, labels):
        lab_pl = None if lab is None else R
        check_sharded(env, lambda x, t, lab_: npu_liger.jsd(x, t, lab_, 0.3), (y_pred, target, lab), [
            layout(S(1), S(1), lab_pl, out=(P,)), layout(R, R, lab_pl, out=(R,)),
            layout(S(0), S(0), None if lab is None else S(0), no_comm=False)], grads=(0,))
    x, w = env.randn(6, 8, seed=24), env.randn(10, 8, seed=25)
    tx, tw = env.randn(6, 5, seed=26), env.randn(10, 5, seed=27)
    check_sharded(env, lambda a, b, c, d, lab_: npu_liger.fused_linear_jsd(a, b, c, d, lab_, 0.5, -100, 2.0),
                  (x, w, tx, tw, labels), [layout(R, R, R, R, R, out=(R,)),
                                           layout(S(0), R, S(0), R, S(0), no_comm=False)], grads=(0, 1))
    logits = env.randn(2, 4, 11, seed=28)
    ids = torch.tensor([[1, 5, 10], [0, 3, 3]], device=env.device)
    adv, ref = env.randn(2, seed=29), env.randn(2, 3, seed=30) * 0.1 - 2.4
    grpo = lambda lg, i, a, r: npu_liger.grpo_loss(lg, i, a, None, None, r, 0.9, 0.04, 0.2, 0.28, "bnpo")  # noqa: E731
    check_sharded(env, grpo, (logits, ids, adv, ref), [layout(R, R, R, R, out=(R, R, R, R)),
                                                       layout(S(0), S(0), S(0), S(0), no_comm=False)], grads=(0,))


@case
def embedding_op(env):
    """Replicated weight with replicated or token-sharded indices; weight sharded on the embedding dim;
    vocab-sharded weight is gathered first (exact, not communication-free)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    weight = env.randn(11, 8, seed=4)
    indices = torch.tensor([[2, 0, 5, 2, 10], [3, 2, 2, 7, 1], [9, 4, 2, 0, 6]], device=env.device)
    for pad in (None, 2):
        check_sharded(env, lambda w, i: npu_liger.embedding(w, i, pad), (weight, indices), [
            layout(R, R, out=(R,)), layout(R, S(0), out=(S(0),)), layout(R, S(1), out=(S(1),)),
            layout(S(1), R, out=(S(2),)), layout(S(0), R, no_comm=False)], grads=(0,))
    # the backward op with a Partial gradient and replicated indices stays Partial
    g = env.randn(3, 5, 8, seed=5)
    got = torch.ops.npu_liger.embedding_backward(_from_local(env, g / env.world, P), _from_local(env, indices, R),
                                                 11, 2)
    assert got.placements == (P,), got.placements
    torch.testing.assert_close(got.full_tensor(), torch.ops.npu_liger.embedding_backward(g, indices, 11, 2))


@case
def tvd_op(env):
    """Rows or vocab sharded, every reduction, with and without ignored rows: exact everywhere, communication-
    free exactly where the rule says so (mean/batchmean over row shards need global counts: redistributed)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    p = torch.softmax(env.randn(6, 10, seed=6), -1)
    q = torch.softmax(env.randn(6, 10, seed=7), -1)
    labels = torch.tensor([1, -100, 3, 4, -100, 0], device=env.device)
    exact = {"none": {"rows": S(0), "vocab": S(1)}, "sum": {"rows": P, "vocab": P}, "batchmean": {"vocab": P},
             "mean": {}}
    for reduction, exact_layouts in exact.items():
        for lab in (None, labels):
            layouts = []
            for name, pls in {"rows": (S(0), S(0), S(0)), "vocab": (S(1), S(1), R), "replicated": (R, R, R)}.items():
                expected = exact_layouts.get(name, R if name == "replicated" else None)
                layouts.append(layout(*pls[:2], None if lab is None else pls[2],
                                      out=None if expected is None else (expected,), no_comm=expected is not None))
            check_sharded(env, lambda p_, q_, lab_: npu_liger.tvd(p_, q_, lab_, reduction), (p, q, lab), layouts,
                          grads=(0, 1))
    # the documented exact row-sharded batchmean: the "sum" (Partial) over the global count of valid rows; only
    # scalars are communicated, never the (BT, V) rows
    row_batchmean = lambda p_, q_, lab_: npu_liger.tvd(p_, q_, lab_, "sum") / (lab_ != -100).sum()  # noqa: E731
    check_sharded(env, row_batchmean, (p, q, labels), [layout(S(0), S(0), S(0), no_comm=False)], grads=(0, 1))
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    sharded = [distribute_tensor(t, env.mesh, [S(0)]) for t in (p, q, labels)]
    with CommDebugMode() as comm:
        row_batchmean(*sharded).full_tensor()
    assert {str(op) for op in comm.get_comm_counts()} <= {"c10d_functional.all_reduce"}, comm.get_comm_counts()
    torch.testing.assert_close(npu_liger.tvd(p, q, labels, "sum") / (labels != -100).sum(),
                               npu_liger.tvd(p, q, labels, "batchmean"))


@case
def norm_ops(env):
    """rms_norm, fused_add_rms_norm, layer_norm: rows (any leading dim) sharded or replicated without
    communication, parameter gradients Partial; a sharded normalised dim is gathered first (exact)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    x, r = env.randn(4, 6, 16, seed=20), env.randn(4, 6, 16, seed=21)
    w, b = env.randn(16, seed=22), env.randn(16, seed=23)
    rows = [layout(R, R, out=(R,)), layout(S(0), R, out=(S(0),)), layout(S(1), R, out=(S(1),)),
            layout(S(2), R, no_comm=False)]
    for mode, offset in (("llama", 0.0), ("gemma", 1.0)):
        check_sharded(env, lambda x_, w_: npu_liger.rms_norm(x_, w_, 1e-6, offset, mode), (x, w), rows,
                      grads=(0, 1))
    fused = [layout(*pl[:1] * 2, pl[1], out=None if out is None else out * 2, no_comm=nc) for pl, out, nc in rows]
    check_sharded(env, lambda x_, r_, w_: npu_liger.fused_add_rms_norm(x_, r_, w_), (x, r, w), fused,
                  grads=(0, 1, 2))
    with_bias = [layout(pl[0], pl[1], pl[1], out=out, no_comm=nc) for pl, out, nc in rows]
    check_sharded(env, lambda x_, w_, b_: npu_liger.layer_norm(x_, w_, b_), (x, w, b), with_bias, grads=(0, 1, 2))
    check_sharded(env, lambda x_: npu_liger.layer_norm(x_), (x,), [layout(S(0), out=(S(0),))], grads=(0,))
    # no weight (elementwise_affine=False): rows sharded or replicated, the backward ops have no weight gradient
    check_sharded(env, lambda x_: npu_liger.rms_norm(x_, None), (x,),
                  [layout(pl, out=(pl,)) for pl in (R, S(0), S(1))] + [layout(S(2), no_comm=False)], grads=(0,))
    check_sharded(env, lambda x_, r_: npu_liger.fused_add_rms_norm(x_, r_, None, 1e-6, 1.0, "gemma"), (x, r),
                  [layout(pl, pl, out=(pl, pl)) for pl in (R, S(1))], grads=(0, 1))
    g = env.randn(4, 6, 16, seed=24)
    got = torch.ops.npu_liger.rms_norm_backward(_from_local(env, g, S(0)), _from_local(env, x, S(0)), None, 1e-6,
                                                0.0, "llama")
    assert got[0].placements == (S(0),) and got[1] is None, got
    # the backward op with a Partial incoming gradient stays Partial
    got = torch.ops.npu_liger.rms_norm_backward(_from_local(env, g / env.world, P), _from_local(env, x, R),
                                                _from_local(env, w, R), 1e-6, 0.0, "llama")
    assert [t.placements for t in got] == [(P,), (P,)], [t.placements for t in got]
    for a, e in zip(got, torch.ops.npu_liger.rms_norm_backward(g, x, w, 1e-6, 0.0, "llama")):
        torch.testing.assert_close(a.full_tensor(), e)


@case
def softmax_ops(env):
    """softmax (last dim) and sparsemax (any dim): every dim but the reduced one sharded, or replicated, without
    communication; a sharded reduced dim is gathered first (exact); the backward ops keep a Partial gradient."""
    import torch

    import npu_liger

    R, P, S = _placements()
    x = env.randn(4, 6, 16, seed=25)
    for fn, reduced in ((npu_liger.softmax, 2), (lambda x_: npu_liger.sparsemax(x_, 1), 1),
                        (lambda x_: npu_liger.sparsemax(x_, -3), 0)):
        layouts = [layout(R, out=(R,))] + [layout(S(d), out=(S(d),)) if d != reduced else
                                            layout(S(d), no_comm=False) for d in range(3)]
        check_sharded(env, fn, (x * 3.0,), layouts, grads=(0,))
    g = env.randn(4, 6, 16, seed=26)
    for backward_op, y, extra in ((torch.ops.npu_liger.softmax_backward, npu_liger.softmax(x), ()),
                                  (torch.ops.npu_liger.sparsemax_backward, npu_liger.sparsemax(x * 3.0, 1), (1,))):
        got = backward_op(_from_local(env, g / env.world, P), _from_local(env, y, R), *extra)
        assert got.placements == (P,), got.placements
        torch.testing.assert_close(got.full_tensor(), backward_op(g, y, *extra))


def _flce_chunks_of(rows):
    """fused_linear_cross_entropy runs chunks of ``rows`` rows, so tiny inputs still turn its chunk loop."""
    from unittest import mock

    import npu_liger.npu_ops.fused_linear_cross_entropy as flce_kernels

    return mock.patch.object(flce_kernels, "chunk_rows", lambda n_rows, hidden, vocab: rows)


@case
def dyt_poly_group_norm_ops(env):
    """dyt and poly_norm: rows (any leading dim) sharded or replicated without communication, every parameter
    gradient Partial; a sharded last dim is gathered first. group_norm: the batch sharded or replicated; sharded
    channels or positions are gathered first (exact)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    x = env.randn(4, 6, 16, seed=30)
    alpha, gamma, beta = env.randn(1, seed=31), env.randn(16, seed=32), env.randn(16, seed=33)
    rows = [(R, (R,), True), (S(0), (S(0),), True), (S(1), (S(1),), True), (S(2), None, False)]
    check_sharded(env, lambda x_, a_, g_, b_: npu_liger.dyt(x_, a_, g_, b_), (x, alpha, gamma, beta),
                  [layout(pl, R, R, R, out=out, no_comm=nc) for pl, out, nc in rows], grads=(0, 1, 2, 3))
    check_sharded(env, lambda x_, a_, g_: npu_liger.dyt(x_, a_, g_), (x, alpha, gamma),
                  [layout(S(0), R, R, out=(S(0),))], grads=(0, 1, 2))
    weight, bias = env.randn(3, seed=34), env.randn(1, seed=35)
    check_sharded(env, lambda x_, w_, b_: npu_liger.poly_norm(x_, w_, b_), (x, weight, bias),
                  [layout(pl, R, R, out=out, no_comm=nc) for pl, out, nc in rows], grads=(0, 1, 2))
    xg, wg, bg = env.randn(4, 6, 5, 3, seed=36), env.randn(6, seed=37), env.randn(6, seed=38)
    check_sharded(env, lambda x_, w_, b_: npu_liger.group_norm(x_, w_, b_, 3), (xg, wg, bg), [
        layout(R, R, R, out=(R,)), layout(S(0), R, R, out=(S(0),)), layout(S(1), R, R, no_comm=False),
        layout(S(2), R, R, no_comm=False)], grads=(0, 1, 2))
    check_sharded(env, lambda x_: npu_liger.group_norm(x_, None, None, 2), (xg,), [layout(S(0), out=(S(0),))],
                  grads=(0,))
    # the backward ops with a Partial incoming gradient stay Partial
    g, gg = env.randn(4, 6, 16, seed=39), env.randn(4, 6, 5, 3, seed=40)
    for op, grad, args in ((torch.ops.npu_liger.dyt_backward, g, (x, alpha, gamma, beta)),
                           (torch.ops.npu_liger.poly_norm_backward, g, (x, weight, bias, 1e-6)),
                           (torch.ops.npu_liger.group_norm_backward, gg, (xg, wg, bg, 3, 1e-5))):
        got = op(_from_local(env, grad / env.world, P),
                 *[_from_local(env, a, R) if isinstance(a, torch.Tensor) else a for a in args])
        assert all(t.placements == (P,) for t in got), [t.placements for t in got]
        for a, e in zip(got, op(grad, *args), strict=True):
            torch.testing.assert_close(a.full_tensor(), e)


@case
def loss_ops(env):
    """cross_entropy and fused_linear_cross_entropy with ignored rows on both shards: tokens sharded (S(0)) run
    without communication for ``none`` (-> S(0)) and ``sum`` (-> P, weight/bias grads P); ``mean`` needs the
    global count of valid rows and vocab sharding has no rule (vocab-parallel CE is not implemented): DTensor
    gathers first, and the result is exact."""
    import torch

    import npu_liger

    R, P, S = _placements()
    rows, vocab, hidden = 8, 64, 16
    target = torch.randint(vocab, (rows,), generator=torch.Generator().manual_seed(30)).to(env.device)
    target[[1, 5, 6]] = -100  # ignored rows on both ranks' shards (rows 0-3 and 4-7)
    logits, x = env.randn(rows, vocab, seed=31), env.randn(rows, hidden, seed=32)
    weight, bias = env.randn(vocab, hidden, seed=33) / 4, env.randn(vocab, seed=34)  # logits of about unit scale
    for reduction in ("none", "sum", "mean"):
        tokens = {"none": (S(0),), "sum": (P,)}.get(reduction)  # the loss of token-sharded inputs; None: gathered
        ce = lambda logits_, target_: npu_liger.cross_entropy(logits_, target_, reduction=reduction)  # noqa: E731
        check_sharded(env, ce, (logits, target), [
            layout(R, R, out=(R,)), layout(S(0), S(0), out=tokens, no_comm=tokens is not None),
            layout(S(1), R, no_comm=False)], grads=(0,))
        flce = lambda x_, w, t, b: npu_liger.fused_linear_cross_entropy(x_, w, t, b, reduction=reduction)  # noqa: E731
        with _flce_chunks_of(2):  # 2 chunks per rank's 4 rows, 4 over the full 8
            check_sharded(env, flce, (x, weight, target, bias), [
                layout(R, R, R, R, out=(R,)), layout(S(0), R, S(0), R, out=tokens, no_comm=tokens is not None),
                layout(R, S(0), R, S(0), no_comm=False)],  # a vocab-parallel lm_head (ColwiseParallel): gathered
                grads=(0, 1, 3))


@case
def loss_options_ops(env):
    """cross_entropy / fused_linear_cross_entropy with class weights, label smoothing, softcap, z-loss and token
    scaling, and the *_with_stats variants: tokens sharded run without communication for ``none`` (loss, z-loss
    and per-row accuracy S(0)) and, without statistics, ``sum`` (P); a scalar reduction with statistics and
    ``mean`` are gathered first (exact)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    rows, vocab, hidden = 8, 24, 8
    target = torch.randint(vocab, (rows,), generator=torch.Generator().manual_seed(80)).to(env.device)
    target[[2, 5]] = -100
    logits, x = env.randn(rows, vocab, seed=81), env.randn(rows, hidden, seed=82)
    weight, class_weight = env.randn(vocab, hidden, seed=83) / 3, env.randn(vocab, seed=84).abs() + 0.5
    opts = dict(label_smoothing=0.1, softcap=20.0, lse_square_scale=1e-3, use_token_scaling=True)
    for reduction, stats in (("none", False), ("sum", False), ("mean", False), ("none", True), ("sum", True)):
        tokens = None if stats and reduction != "none" else {"none": (S(0),), "sum": (P,)}.get(reduction)
        n_out = 3 if stats else 1
        pick = (lambda o: (o.loss, o.z_loss, o.token_accuracy)) if stats else (lambda o: o)  # noqa: E731
        flags = dict(return_z_loss=True, return_token_accuracy=True) if stats else {}
        ce = lambda lg, t, cw: pick(npu_liger.cross_entropy(lg, t, cw, reduction=reduction, **opts, **flags))  # noqa: E731
        check_sharded(env, ce, (logits, target, class_weight), [
            layout(R, R, R, out=(R,) * n_out), layout(S(0), S(0), R, out=None if tokens is None else tokens * n_out,
                                                      no_comm=tokens is not None)], grads=(0,))
        flce = lambda x_, w, t, cw: pick(npu_liger.fused_linear_cross_entropy(  # noqa: E731
            x_, w, t, None, cw, reduction=reduction, **opts, **flags))
        with _flce_chunks_of(2):
            check_sharded(env, flce, (x, weight, target, class_weight), [
                layout(S(0), R, S(0), R, out=None if tokens is None else tokens * n_out, no_comm=tokens is not None)],
                grads=(0, 1))


@case
def fused_moe_op(env):
    """Tokens sharded (x, index and weights S(0): data or sequence parallel) run without communication (expert
    gradients P); tensor parallel on the intermediate dim and expert parallel on E have no exact local rule, so
    DTensor gathers first and the result is exact (docs/DISTRIBUTED.md)."""
    import torch

    import npu_liger

    R, P, S = _placements()
    tokens, hidden, experts, inter, top_k = 8, 16, 3, 8, 2
    x = env.randn(tokens, hidden, seed=40)
    gate_up, down = env.randn(experts, 2 * inter, hidden, seed=41) / 4, env.randn(experts, hidden, inter, seed=42) / 4
    index = torch.randint(experts + 1, (tokens, top_k), generator=torch.Generator().manual_seed(43)).to(env.device)
    weights = env.randn(tokens, top_k, seed=44).softmax(-1)
    check_sharded(env, npu_liger.fused_moe, (x, gate_up, down, index, weights), [
        layout(R, R, R, R, R, out=(R,)), layout(S(0), R, R, S(0), S(0), out=(S(0),)),
        layout(R, S(1), S(2), R, R, no_comm=False), layout(R, S(0), S(0), R, R, no_comm=False)],
        grads=(0, 1, 2, 4))


@case
def fused_moe_expert_parallel(env):
    """Expert parallel by hand: each rank holds E/world experts (Shard(0) on E), routing indices remapped to local
    ids with HF's convention (index == E_local: served elsewhere), partial outputs all-reduced: the output and
    every gradient equal the single-process op's (x and routing-weight grads summed, expert grads per shard)."""
    import torch
    import torch.distributed as dist

    import npu_liger

    tokens, hidden, inter, top_k = 6, 8, 4, 2
    experts = 2 * env.world  # E_local = 2
    local = experts // env.world
    x = env.randn(tokens, hidden, seed=50)
    gate_up, down = env.randn(experts, 2 * inter, hidden, seed=51) / 4, env.randn(experts, hidden, inter, seed=52) / 4
    index = torch.randint(experts, (tokens, top_k), generator=torch.Generator().manual_seed(53)).to(env.device)
    weights = env.randn(tokens, top_k, seed=54).softmax(-1)
    cot = env.randn(tokens, hidden, seed=55)
    ref = [t.clone().requires_grad_(t.is_floating_point()) for t in (x, gate_up, down, index, weights)]
    ref_out = npu_liger.fused_moe(*ref)
    (ref_out * cot).sum().backward()

    first = env.rank * local
    mine = slice(first, first + local)
    local_index = torch.where((index >= first) & (index < first + local), index - first, local)
    args = [x.clone().requires_grad_(), gate_up[mine].clone().requires_grad_(), down[mine].clone().requires_grad_(),
            local_index, weights.clone().requires_grad_()]
    partial = npu_liger.fused_moe(*args)
    (partial * cot).sum().backward()  # d(sum of partials)/d(local args): each rank's share of the gradient
    out = partial.detach().clone()
    for t in (out, args[0].grad, args[4].grad):
        dist.all_reduce(t)
    torch.testing.assert_close(out, ref_out.detach())
    torch.testing.assert_close(args[0].grad, ref[0].grad)
    torch.testing.assert_close(args[4].grad, ref[4].grad)
    torch.testing.assert_close(args[1].grad, ref[1].grad[mine])
    torch.testing.assert_close(args[2].grad, ref[2].grad[mine])


@case
def compiled_new_ops(env):
    """torch.compile(fullgraph=True) over DTensor inputs for the ops added since the first distributed rounds:
    rows sharded (S(0)) through softmax, dyt, poly_norm, kl_div, cross_entropy with class weights, fused_moe."""
    import torch

    import npu_liger

    R, P, S = _placements()
    rows, width, experts, inter = 4, 8, 3, 4
    x = env.randn(rows, width, seed=60)
    alpha, gamma, beta, pw = env.randn(1, seed=61), env.randn(width, seed=62), env.randn(width, seed=63), \
        env.randn(3, seed=64)
    target = torch.softmax(env.randn(rows, width, seed=65), -1)
    labels = torch.tensor([1, -100, 3, 0], device=env.device)
    class_weight = env.randn(width, seed=66).abs() + 0.5
    gate_up, down = env.randn(experts, 2 * inter, width, seed=67) / 4, env.randn(experts, width, inter, seed=68) / 4
    index = torch.tensor([[0, 3], [2, 1], [1, 1], [3, 0]], device=env.device)
    weights = env.randn(rows, 2, seed=69).softmax(-1)

    pb = env.randn(1, seed=70)

    def block(x_, a_, g_, b_, pw_, pb_, t_, lab, cw, gu, dn, idx, wts):
        h = npu_liger.dyt(x_, a_, g_, b_)
        s = npu_liger.softmax(npu_liger.poly_norm(h, pw_, pb_))
        kl = npu_liger.kl_div(torch.log(s), t_, "none")
        ce = npu_liger.cross_entropy(h, lab, weight=cw, reduction="none")
        return kl, ce, npu_liger.fused_moe(h, gu, dn, idx, wts)

    compiled = torch.compile(block, fullgraph=True, backend=_compile_backend())
    check_sharded(env, compiled, (x, alpha, gamma, beta, pw, pb, target, labels, class_weight, gate_up, down, index,
                                  weights),
                  [layout(S(0), R, R, R, R, R, S(0), S(0), R, R, R, S(0), S(0), out=(S(0), S(0), S(0)),
                          no_comm=False)],
                  grads=(0, 1, 2, 3, 4, 5, 9, 10, 12))


def _rope_inputs(env, seq=6):
    q, k = env.randn(2, 4, seq, 8, seed=8), env.randn(2, 2, seq, 8, seed=9)  # GQA: 4 query heads, 2 kv heads
    return q, k


@case
def rope_op(env):
    """Batch, heads or sequence sharding (the tables follow the batch/sequence or replicate), never head_dim."""
    import torch

    import npu_liger

    R, P, S = _placements()
    q, k = _rope_inputs(env)
    angles = env.randn(2, 6, 4, seed=10)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (bsz, seq, head_dim)
    check_sharded(env, npu_liger.rope, (q, k, cos, sin), [
        layout(R, R, R, R, out=(R, R)), layout(S(0), S(0), S(0), S(0), out=(S(0), S(0))),
        layout(S(1), S(1), R, R, out=(S(1), S(1))), layout(S(2), S(2), S(1), S(1), out=(S(2), S(2))),
        layout(S(2), S(2), R, R, out=(S(2), S(2)), no_comm=False),  # replicated tables: sliced to the positions
        layout(S(3), S(3), R, R, no_comm=False),  # head_dim sharded: gathered first
    ], grads=(0, 1))
    shared = (cos[:1], sin[:1])  # (1, seq, head_dim): replicated under batch sharding
    check_sharded(env, npu_liger.rope, (q, k, *shared), [layout(S(0), S(0), R, R, out=(S(0), S(0)))], grads=(0, 1))
    flat = (cos[0, :, :6].contiguous(), sin[0, :, :6].contiguous())  # (seq, rotary_dim 6 < head_dim 8)
    check_sharded(env, npu_liger.rope, (q, k, *flat), [
        layout(S(2), S(2), S(0), S(0), out=(S(2), S(2))), layout(S(0), S(0), R, R, out=(S(0), S(0)))], grads=(0, 1))


@case
def qwen2vl_mrope_op(env):
    import torch

    import npu_liger

    R, P, S = _placements()
    q, k = _rope_inputs(env)
    angles = env.randn(3, 2, 6, 4, seed=11)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (3, bsz, seq, head_dim)
    for section in ([2, 1, 1], [1, 1, 2]):  # the same layouts with another section: it must not hit the cache
        layouts = [layout(S(2), S(2), S(2), S(2), out=(S(2), S(2)))]
        if section == [2, 1, 1]:
            layouts += [layout(R, R, R, R, out=(R, R)), layout(S(0), S(0), S(1), S(1), out=(S(0), S(0))),
                        layout(S(1), S(1), R, R, out=(S(1), S(1))), layout(S(3), S(3), R, R, no_comm=False)]
        check_sharded(env, lambda q_, k_, c, s: npu_liger.qwen2vl_mrope(q_, k_, c, s, section), (q, k, cos, sin),
                      layouts, grads=(0, 1))
    check_sharded(env, lambda q_, k_, c, s: npu_liger.qwen2vl_mrope(q_, k_, c, s, [2, 1, 1]),
                  (q, k, cos[:, :1], sin[:, :1]), [layout(S(0), S(0), R, R, out=(S(0), S(0)))], grads=(0, 1))


@case
def llama4_rope_op(env):
    import torch

    import npu_liger

    R, P, S = _placements()
    q, k = env.randn(2, 6, 4, 8, seed=12), env.randn(2, 6, 2, 8, seed=13)  # (bsz, seq, heads, head_dim)
    freqs = torch.polar(torch.ones(2, 6, 4, device=env.device), env.randn(2, 6, 4, seed=14))  # complex
    check_sharded(env, npu_liger.llama4_rope, (q, k, freqs), [
        layout(R, R, R, out=(R, R)), layout(S(0), S(0), S(0), out=(S(0), S(0))),
        layout(S(1), S(1), S(1), out=(S(1), S(1))), layout(S(2), S(2), R, out=(S(2), S(2))),
        layout(S(3), S(3), R, no_comm=False)], grads=(0, 1))
    check_sharded(env, npu_liger.llama4_rope, (q, k, freqs[:1]), [layout(S(0), S(0), R, out=(S(0), S(0)))],
                  grads=(0, 1))
    check_sharded(env, npu_liger.llama4_rope, (q, k, freqs[0]), [layout(S(1), S(1), S(0), out=(S(1), S(1)))],
                  grads=(0, 1))


@case
def two_dim_mesh(env):
    """A (1, 2) mesh ("dp", "tp"): the one-mesh-dim rules expand to nested placements (batch on dp, heads or
    the hidden dim on tp), as in FSDP2 + tensor parallel."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import npu_liger

    R, P, S = _placements()
    mesh = init_device_mesh(env.device.type, (1, env.world), mesh_dim_names=("dp", "tp"))
    q, k = _rope_inputs(env)
    angles = env.randn(2, 6, 4, seed=23)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    check_sharded(env, npu_liger.rope, (q, k, cos, sin), [
        layout((S(0), S(1)), (S(0), S(1)), (S(0), R), (S(0), R), out=((S(0), S(1)),) * 2),
        layout((S(0), S(2)), (S(0), S(2)), (S(0), S(1)), (S(0), S(1)), out=((S(0), S(2)),) * 2)],
        grads=(0, 1), mesh=mesh)
    a, b = env.randn(4, 6, 8, seed=24), env.randn(4, 6, 8, seed=25)
    check_sharded(env, npu_liger.swiglu, (a, b), [layout((S(0), S(2)), (S(0), S(2)), out=((S(0), S(2)),))],
                  grads=(0, 1), mesh=mesh)
    p = torch.softmax(env.randn(6, 10, seed=26), -1)
    t = torch.softmax(env.randn(6, 10, seed=27), -1)
    check_sharded(env, lambda p_, t_: npu_liger.tvd(p_, t_, None, "batchmean"), (p, t), [
        layout((R, S(1)), (R, S(1)), out=((R, P),)), layout((S(0), S(1)), (S(0), S(1)), no_comm=False)],
        grads=(0, 1), mesh=mesh)


@case
def eager_entry_with_dtensors(env):
    """npu_liger.<op> in plain eager mode (no dispatch mode active): the eager bypass must hand DTensor
    arguments to the real op, forward and backward."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    import npu_liger

    R, P, S = _placements()
    a, b = (distribute_tensor(env.randn(4, 6, seed=s), env.mesh, [S(0)]).requires_grad_() for s in (21, 22))
    out = npu_liger.geglu(a, b)
    assert isinstance(out, DTensor) and out.placements == (S(0),), type(out)
    out.sum().backward()
    ref_a = a.full_tensor().detach().requires_grad_()
    npu_liger.geglu(ref_a, b.full_tensor().detach()).sum().backward()
    torch.testing.assert_close(a.grad.full_tensor(), ref_a.grad)


@case
def eager_entry_with_dtensor_parameters(env):
    """The same with DTensor nn.Parameters as every tensor argument (a tensor-parallel module's own weights):
    isinstance(p, nn.Parameter) is True for them, so the bypass must not take them for plain tensors."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    import npu_liger

    R, P, S = _placements()
    a, b = (torch.nn.Parameter(distribute_tensor(env.randn(4, 6, seed=s), env.mesh, [S(0)])) for s in (21, 22))
    out = npu_liger.geglu(a, b)
    assert isinstance(out, DTensor), type(out)
    torch.testing.assert_close(out.full_tensor(), npu_liger.geglu(a.full_tensor(), b.full_tensor()))


@case
def compiled_dtensor_ops(env):
    """torch.compile(fullgraph=True) over DTensor inputs: the sharding rules and fakes work under tracing."""
    import torch

    import npu_liger

    R, P, S = _placements()

    def block(x, w_gate, w_up, q, k, cos, sin, p, t):
        h = npu_liger.swiglu(x @ w_gate, x @ w_up)
        q2, k2 = npu_liger.rope(q, k, cos, sin)
        return h, q2, k2, npu_liger.tvd(p, t, None, "sum")

    x, w_gate, w_up = env.randn(4, 8, seed=15), env.randn(8, 6, seed=16), env.randn(8, 6, seed=17)
    q, k = _rope_inputs(env)
    angles = env.randn(2, 6, 4, seed=18)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    p, t = torch.softmax(env.randn(6, 10, seed=19), -1), torch.softmax(env.randn(6, 10, seed=20), -1)
    compiled = torch.compile(block, fullgraph=True, backend=_compile_backend())
    # (no CommDebugMode here: a dispatch mode around a compiled call changes what gets traced)
    check_sharded(env, compiled, (x, w_gate, w_up, q, k, cos, sin, p, t),
                  [layout(R, S(1), S(1), S(1), S(1), R, R, S(0), S(0), out=(S(1), S(1), S(1), P), no_comm=False)],
                  grads=(1, 2, 3, 4, 7))


def _compile_backend():
    # Inductor on GPUs; on CPU aot_eager keeps the same Dynamo + AOTAutograd + DTensor tracing without spending
    # CI minutes compiling C++ for a 2-core runner (override: NPU_LIGER_DIST_COMPILE_BACKEND=inductor).
    return os.environ.get("NPU_LIGER_DIST_COMPILE_BACKEND", "aot_eager" if DEVICE == "cpu" else "inductor")


# ---------------------------------------------------------------------------------------------------------------
# Model cases: a tiny Llama-style model on npu_liger ops, trained under FSDP2 / TP / DDP vs one process

VOCAB, DIM, HEADS, HEAD_DIM, HIDDEN, LAYERS, SEQ, BATCH, STEPS, LR = 32, 16, 4, 4, 24, 2, 8, 4, 3, 0.5


def _model_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    import npu_liger

    class Embedding(nn.Embedding):  # an nn.Embedding, so ColwiseParallel knows how to shard it
        def forward(self, ids):
            return npu_liger.embedding(self.weight, ids)

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(DIM), RMSNorm(DIM)
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(DIM, HEADS * HEAD_DIM, bias=False) for _ in range(3))
            self.o_proj = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
            self.gate_proj, self.up_proj = (nn.Linear(DIM, HIDDEN, bias=False) for _ in range(2))
            self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)

        def forward(self, x, cos, sin):
            from torch.distributed.tensor import DTensor, Replicate

            bsz, seq, _ = x.shape
            h = self.attn_norm(x)
            q, k, v = (proj(h).view(bsz, seq, -1, HEAD_DIM).transpose(1, 2)
                       for proj in (self.q_proj, self.k_proj, self.v_proj))
            tensor_parallel = isinstance(q, DTensor)
            if tensor_parallel:  # heads are sharded, the rotary tables replicated
                cos, sin = (DTensor.from_local(t, q.device_mesh, [Replicate()], run_check=False) for t in (cos, sin))
            q, k = npu_liger.rope(q, k, cos, sin)
            if tensor_parallel:
                # Attention mixes nothing across heads, so each rank attends over its own heads on plain tensors
                # (Megatron's layout; o_proj, row-parallel, reads its input as Shard(-1)). Kept off DTensor on
                # purpose: the 4-D matmul reshapes (batch, heads) into one bmm batch dim, and torch 2.11's
                # DTensor refuses to flatten a Shard(1) dim that is not the first of the group ("Attempted to
                # flatten multiple dimensions, with dimension 1 being sharded"; 2.13 makes it _StridedShard).
                q, k, v = (t.to_local() for t in (q, k, v))
            # attention by hand: DTensor has no rule for the CPU flash-attention kernel behind F.sdpa
            causal = torch.full((seq, seq), float("-inf"), device=x.device).triu(1)
            attn = torch.softmax(q @ k.transpose(-2, -1) * HEAD_DIM**-0.5 + causal, dim=-1) @ v
            x = x + self.o_proj(attn.transpose(1, 2).reshape(bsz, seq, -1))
            h = self.mlp_norm(x)
            return x + self.down_proj(npu_liger.swiglu(self.gate_proj(h), self.up_proj(h)))

    class TinyLlama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = Embedding(VOCAB, DIM)
            self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = RMSNorm(DIM)
            self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
            inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
            angles = torch.outer(torch.arange(SEQ).float(), inv_freq)
            emb = torch.cat([angles, angles], -1)
            self.register_buffer("cos", emb.cos()[None], persistent=False)
            self.register_buffer("sin", emb.sin()[None], persistent=False)
            self.fused_loss = False  # True: the loss patch (lm_head and cross entropy without the logits)

        def forward(self, ids, labels):
            x = self.embed(ids)
            cos, sin = self.cos[:, : ids.shape[1]], self.sin[:, : ids.shape[1]]
            for layer in self.layers:
                x = layer(x, cos, sin)
            h = self.norm(x).reshape(-1, DIM)
            if self.fused_loss:
                return npu_liger.fused_linear_cross_entropy(h, self.lm_head.weight, labels.reshape(-1))
            return F.cross_entropy(self.lm_head(h).float(), labels.reshape(-1))

    return TinyLlama


def _train(model, batches, steps=STEPS):
    """SGD steps; the optimizer is per-parameter (foreach=False) so plain and DTensor parameters can mix."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    losses = []
    for step in range(steps):
        ids, labels = batches[step]
        loss = model(ids, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def _batches(env):
    import torch

    g = torch.Generator().manual_seed(21)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(env.device)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g).to(env.device)
        out.append((ids, labels))
    return out


_REFERENCE = {}


def _reference(env):
    """A fresh copy of the initial model, and the single-process run on the full batch (every rank computes it,
    identically; once per worker)."""
    import copy

    import torch

    if not _REFERENCE:
        torch.manual_seed(0)
        model = _model_classes()().to(env.device)
        _REFERENCE["start"] = copy.deepcopy(model)
        _REFERENCE["losses"] = _train(model, _batches(env))
        _REFERENCE["trained"] = model
    return copy.deepcopy(_REFERENCE["start"]), _REFERENCE["trained"], _REFERENCE["losses"]


def _assert_same_model(model, ref_model, what):
    import torch
    from torch.distributed.tensor import DTensor

    for (name, p), (_, ref) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        torch.testing.assert_close(full.detach(), ref.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{what}: parameter {name} after {STEPS} steps: {m}")


def _data_parallel_batches(env):
    """Each rank's half of the global batch: mean losses over equal halves average to the full-batch mean."""
    per_rank = BATCH // env.world
    return [(ids[env.rank * per_rank:(env.rank + 1) * per_rank], labels[env.rank * per_rank:(env.rank + 1) * per_rank])
            for ids, labels in _batches(env)]


def _assert_data_parallel_losses(losses, ref_losses, what):
    import torch
    import torch.distributed as dist

    for step, (loss, ref) in enumerate(zip(losses, ref_losses, strict=True)):
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        torch.testing.assert_close(mean / dist.get_world_size(), ref, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{what}: loss at step {step}: {m}")


def _train_data_parallel(env, model, module):
    """Each rank trains on its half of the batch with the loss patch on (``module``: the model inside ``model``'s
    wrapper): fused_linear_cross_entropy of the final norm's output and lm_head's weight, as the parallel wrapper
    hands them over, in chunks of 4 of the rank's 16 tokens (so its chunk loop turns), against the reference's
    unfused loss. The first step runs under a dispatch mode, so through the registered op; the others through
    the eager path."""
    module.fused_loss = True
    seen = _NpuLigerOpsSeen()
    with _flce_chunks_of(4):
        losses = _train_with(model, model, _data_parallel_batches(env), first_step_mode=seen)
    assert "fused_linear_cross_entropy_with_grad" in seen.ran, f"the fused loss did not run: {seen.ran}"
    assert not seen.with_dtensor, f"npu_liger ops that got DTensor arguments: {seen.with_dtensor}"
    return losses


@case
def fsdp2_training(env):
    from torch.distributed.fsdp import fully_shard

    start, ref_model, ref_losses = _reference(env)
    model = start
    for layer in model.layers:
        fully_shard(layer, mesh=env.mesh)
    fully_shard(model, mesh=env.mesh)
    losses = _train_data_parallel(env, model, model)
    _assert_data_parallel_losses(losses, ref_losses, "FSDP2")
    _assert_same_model(model, ref_model, "FSDP2")


@case
def ddp_training(env):
    from torch.nn.parallel import DistributedDataParallel

    start, ref_model, ref_losses = _reference(env)
    model = DistributedDataParallel(start, device_ids=[env.rank] if env.device.type == "cuda" else None)
    losses = _train_data_parallel(env, model, model.module)
    _assert_data_parallel_losses(losses, ref_losses, "DDP")
    _assert_same_model(model.module, ref_model, "DDP")


def _tensor_parallel(model, mesh):
    """Megatron-style: q/k/v and gate/up column-parallel (their DTensor outputs, sharded on heads / the hidden
    dim, feed npu_liger.rope and npu_liger.swiglu), o/down row-parallel, the embedding sharded on its
    embedding dim (npu_liger.embedding on a Shard(1) weight) and gathered."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh, {"embed": ColwiseParallel(output_layouts=Replicate())})
    for layer in model.layers:
        parallelize_module(layer, mesh, {
            "q_proj": ColwiseParallel(use_local_output=False), "k_proj": ColwiseParallel(use_local_output=False),
            "v_proj": ColwiseParallel(use_local_output=False), "o_proj": RowwiseParallel(),
            "gate_proj": ColwiseParallel(use_local_output=False), "up_proj": ColwiseParallel(use_local_output=False),
            "down_proj": RowwiseParallel(),
        })
    return model


def _tensor_parallel_case(env, compiled):
    import torch

    start, ref_model, ref_losses = _reference(env)
    model = _tensor_parallel(start, env.mesh)
    run = torch.compile(model, backend=_compile_backend(), fullgraph=True) if compiled else model
    seen = _NpuLigerOpsSeen() if not compiled else None  # (a dispatch mode would change what compile traces)
    losses = _train_with(model, run, _batches(env), first_step_mode=seen)
    if seen is not None:
        want = {"embedding", "rope", "swiglu", "embedding_backward", "rope_backward", "swiglu_backward"}
        assert seen.with_dtensor == want, f"npu_liger ops that got DTensor arguments: {seen.with_dtensor}"
    for step, (loss, ref) in enumerate(zip(losses, ref_losses, strict=True)):
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"TP loss at step {step}: {m}")
    _assert_same_model(model, ref_model, "tensor parallel" + (" (compiled)" if compiled else ""))


def _train_with(model, run, batches, first_step_mode=None):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    losses = []
    for step, (ids, labels) in enumerate(batches):
        with first_step_mode if step == 0 and first_step_mode is not None else contextlib.nullcontext():
            loss = run(ids, labels)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def _NpuLigerOpsSeen():
    """A dispatch mode recording which npu_liger ops ran, and which of them with DTensor arguments (i.e. through
    their rules)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class OpsSeen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ran, self.with_dtensor = set(), set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "npu_liger":
                name = func._schema.name.split("::")[1]
                self.ran.add(name)
                if any(isinstance(a, DTensor) for a in tree_leaves((args, kwargs))):
                    self.with_dtensor.add(name)
            return func(*args, **(kwargs or {}))

    return OpsSeen()


@case
def tensor_parallel_training(env):
    _tensor_parallel_case(env, compiled=False)


@case
def tensor_parallel_training_compiled(env):
    _tensor_parallel_case(env, compiled=True)


# ---------------------------------------------------------------------------------------------------------------
# pytest side

if __name__ != "__main__":
    import pytest

    _RESULTS: dict = {}

    @pytest.fixture(scope="module")
    def distributed_results(request):
        """Launch the worker pair once for every selected case of this module."""
        selected = [item.callspec.params["name"] for item in request.session.items
                    if item.module is request.module and hasattr(item, "callspec")
                    and "name" in item.callspec.params]
        if DEVICE == "cuda":
            import torch

            if torch.cuda.device_count() < WORLD_SIZE:
                pytest.skip(f"needs {WORLD_SIZE} CUDA devices")
        import torch.distributed as dist

        if not dist.is_available():
            pytest.skip("torch.distributed is not available")
        return _launch_once(list(dict.fromkeys(selected)) or list(CASES))

    def _launch_once(names):
        """One worker pair per test run, also under pytest-xdist (CI runs ``pytest -n 2``): the first xdist
        worker to get here launches every selected case, the others wait for its results."""
        run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        try:
            import fcntl
        except ImportError:
            fcntl = None
        if run_id is None or fcntl is None:
            return launch(names)
        shared = os.path.join(tempfile.gettempdir(), f"npu_liger_dist_{run_id}")
        os.makedirs(shared, exist_ok=True)
        with open(os.path.join(shared, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = os.path.join(shared, "results.json")
            if not os.path.exists(path):
                with open(path + ".tmp", "w") as f:
                    json.dump(launch(names), f)
                os.replace(path + ".tmp", path)
            with open(path) as f:
                return json.load(f)

    @pytest.mark.parametrize("name", CASES)
    def test_distributed(name, distributed_results):
        assert distributed_results[name] == "ok", distributed_results[name]

    def test_every_op_has_a_sharding_rule():
        """A new op needs a rule beside it (``@sharding_rule`` in its registration file), or DTensor raises for it in
        tensor parallel."""
        import torch.distributed as dist

        if not dist.is_available():
            pytest.skip("torch.distributed is not available")
        from npu_liger.registrations import _op, _sharding

        defined = {name.split("::", 1)[1] for name in _op.LIBRARY._op_defs}
        assert defined - set(_sharding.REGISTERED) == set(), "ops without a DTensor sharding rule"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2:])
    else:  # by hand: launch both ranks
        results = launch(sys.argv[1:] or list(CASES))
        for name, status in results.items():
            print(f"{name}: {status}")
        sys.exit(0 if all(s == "ok" for s in results.values()) else 1)
