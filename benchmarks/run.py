#!/usr/bin/env python
"""npu-liger GPU benchmark harness: one command times every op against eager PyTorch, torch.compile and
Liger-Kernel, next to the GPU's own copy bandwidth.

    python benchmarks/run.py [--ops geglu,swiglu,...] [--quick] [--out DIR | --publish]

Sections, in order: device-to-device copy bandwidth; Triton compiled variants per op across 16 sequence
lengths; eager dispatch overhead on tiny tensors; forward and forward+backward timings (checked against eager
first) at the issue's shapes plus a token sweep (``--quick`` skips the sweep); a CUDA-graphs check of a small
compiled model. Outputs: results.csv, results.json, results.png, BENCHMARKS_snippet.md, written after every
op so an interrupted run keeps what it measured, in ``--out`` (default ``benchmarks/output/``, untracked);
``--publish`` writes them to ``benchmarks/results/`` instead, the committed results BENCHMARKS.md shows.
``--merge DIR...`` rebuilds them from several runs' results.json (no GPU needed).

CPU smoke test (Triton interpreter, tiny shapes, wall-clock timer, no torch.compile/Liger):

    TRITON_INTERPRET=1 python benchmarks/run.py --device cpu --smoke
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "benchmarks", "output")  # untracked (.gitignore): runs never touch git's files
PUBLISHED_OUT = os.path.join(REPO, "benchmarks", "results")  # committed; written only with --publish
SECTIONS = ("copy", "compile-count", "dispatch", "timing", "cudagraphs")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="all", help="comma-separated ops (default: all): geglu,swiglu,embedding,tvd,"
                   "rope,qwen2vl_mrope,llama4_rope")
    p.add_argument("--quick", action="store_true", help="only the issue's shapes (skip the token sweep)")
    p.add_argument("--sweep-only", action="store_true", help="only the token sweep (to split a long run; see --merge)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, few repetitions (implies --quick)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cuda (default) or cpu (Triton interpreter; wall-clock timer; no torch.compile/Liger)")
    p.add_argument("--out", default=None, help=f"output folder (default {os.path.relpath(DEFAULT_OUT, REPO)}/, untracked)")
    p.add_argument("--publish", action="store_true",
                   help=f"write to {os.path.relpath(PUBLISHED_OUT, REPO)}/, the committed results BENCHMARKS.md links to")
    p.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variant")
    p.add_argument("--no-liger", action="store_true", help="leave out Liger-Kernel even when importable")
    p.add_argument("--include-missing", action="store_true",
                   help="still time eager/compile/Liger for ops npu_liger does not provide yet")
    p.add_argument("--npu-entry", default="functional", choices=("functional", "op"),
                   help="npu_liger variant: the functional API npu_liger.<op> (default; eager bypass) or "
                        "torch.ops.npu_liger.<op>.default")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warmup (ms)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time (ms)")
    p.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (MiB; default 1024 on "
                   "cuda, 16 on cpu)")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="combine results.json of these folders into --out (or --publish)")
    args = p.parse_args(argv)
    if args.publish and args.out is not None:
        p.error("--publish writes to benchmarks/results; leave out --out")
    if args.publish and args.smoke:
        p.error("--publish is for full GPU runs, not --smoke")
    args.out = PUBLISHED_OUT if args.publish else args.out or DEFAULT_OUT
    if args.smoke:
        args.quick = True
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = args.skip - set(SECTIONS)
    if unknown:
        p.error(f"unknown --skip sections {sorted(unknown)}; choose from {SECTIONS}")
    return args


def _versions(device: str) -> dict:
    import torch

    from benchmarks import liger

    info = {"torch": torch.__version__, "python": sys.version.split()[0]}
    for name, module in (("triton", "triton"), ("transformers", "transformers"), ("npu_liger", "npu_liger")):
        try:
            info[name] = getattr(__import__(module), "__version__", "unknown")
        except Exception:
            info[name] = None
    info["liger_kernel"] = liger.version() if device == "cuda" else None
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["l2_mib"] = round(getattr(props, "L2_cache_size", 0) / 2**20, 1)
    else:
        import platform

        info["device_name"] = f"CPU ({platform.processor() or platform.machine()}, Triton interpreter)"
    return info


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def merge_main(args) -> int:
    import json

    from benchmarks import report

    datas = []
    for folder in args.merge:
        with open(os.path.join(folder, "results.json")) as fh:
            datas.append(json.load(fh))
    data = report.merge(datas)
    paths = report.write_all(data, args.out)
    _say(report.format_table(data["rows"]))
    _say("\n".join(f"wrote {k}: {v}" for k, v in paths.items()))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    if args.merge:
        return merge_main(args)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set: unset it for --device cuda", file=sys.stderr)
        return 2

    import torch

    from benchmarks import cudagraphs, liger, measure, reference, report, specs

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --smoke for the CPU smoke test", file=sys.stderr)
        return 2
    device = args.device
    cpu = device == "cpu"
    names = specs.op_names() if args.ops == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [n for n in names if n not in specs.SPECS]
    if bad:
        print(f"unknown ops {bad}; known: {specs.op_names()}", file=sys.stderr)
        return 2
    import torch._dynamo

    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 64)

    started = time.time()
    eager_sources = reference.sources()  # resolve the HF formulas before anything (Liger) can patch transformers
    timer = measure.Timer(device, args.warmup_ms, args.rep_ms, cpu_reps=3 if args.smoke else 10)
    use_compile = not (cpu or args.no_compile)
    use_liger = not (cpu or args.no_liger) and liger.available()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "command": "python benchmarks/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "timer": timer.name,
        "npu_entry": "npu_liger.<op> (functional API)" if args.npu_entry == "functional"
        else "torch.ops.npu_liger.<op>.default",
        **_versions(device),
    }
    meta["commands"] = [meta["command"]]
    data = {"meta": meta, "rows": [], "dispatch": [], "compile_counts": [], "cudagraphs": None}
    _say(f"npu-liger benchmarks on {meta['device_name']}: torch {meta['torch']}, triton {meta['triton']}, "
         f"transformers {meta['transformers']}, liger-kernel {meta['liger_kernel'] or 'not used'}")
    _say(f"timer: {timer.name}; variants: npu_liger ({meta['npu_entry']}), eager"
         f"{', torch.compile' if use_compile else ''}{', liger' if use_liger else ''}")

    # -- copy bandwidth ----------------------------------------------------------------------------------
    copy_mib = args.copy_mib or (16 if cpu else 1024)
    meta["copy_gbps"] = measure.copy_bandwidth_gbps(device, timer, copy_mib << 20)
    meta["copy_buffer_mib"] = copy_mib
    _say(f"copy bandwidth: {meta['copy_gbps']:.0f} GB/s (read + write, {copy_mib} MiB buffer)")

    # -- availability ------------------------------------------------------------------------------------
    available = []
    for name in specs.op_names():
        why = specs.SPECS[name].available()
        if why is None:
            available.append(name)
        elif name in names:
            _say(f"npu_liger.{name}: not available ({why})" + (
                "; timing the other variants only" if args.include_missing else "; skipped"))
    meta["npu_liger_ops"] = available
    meta["eager_sources"] = eager_sources
    out_paths = {}

    def save():
        nonlocal out_paths
        data["rows"] = report.sort_rows(data["rows"])
        report.finish_rows(data["rows"])
        meta["liger_resolved"] = liger.resolved()
        meta["elapsed_s"] = round(time.time() - started, 1)
        out_paths = report.write_all(data, args.out)

    # -- compile count -----------------------------------------------------------------------------------
    if "compile-count" not in args.skip:
        _say(f"\nTriton compiled variants across {len(specs.COMPILE_SEQ_LENS)} sequence lengths "
             f"(forward + backward; target <= 2 per kernel):")
        for name in names:
            if name not in available:
                continue
            if cpu or args.smoke:
                item = {"op": name, "status": "n/a on the CPU interpreter / smoke run (no compiled kernels)"}
            else:
                try:
                    item = measure.compile_counts(specs.SPECS[name], device, specs.COMPILE_SEQ_LENS, args.npu_entry)
                except Exception as exc:
                    item = {"op": name, "status": f"ERROR {type(exc).__name__}: {exc}"[:300]}
            data["compile_counts"].append(item)
            _say(report.format_compile([item]))

    # -- dispatch overhead -------------------------------------------------------------------------------
    if "dispatch" not in args.skip:
        iters, repeats = (3, 1) if cpu else (20 if args.smoke else 1000, 5)
        _say("\nEager dispatch overhead on tiny tensors (µs per call, over the raw launcher):")
        for name in names:
            if name not in available:
                continue
            try:
                item = measure.dispatch_overhead(specs.SPECS[name], device, iters, repeats)
            except Exception as exc:
                item = {"op": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
            data["dispatch"].append(item)
        _say(report.format_dispatch(data["dispatch"]))

    # -- timings -----------------------------------------------------------------------------------------
    mismatches = []
    if "timing" not in args.skip:
        _say("\nTimings (fresh identical inputs per variant; checked against eager first):")
        for rank, name in enumerate(specs.op_names()):
            if name not in names or (name not in available and not args.include_missing):
                continue
            spec = specs.SPECS[name]
            variants = []
            if name in available:
                variants.append(("npu_liger", spec.npu_variant(args.npu_entry)))
            eager = spec.eager_variant()
            variants.append(("eager", eager))
            if use_compile:
                variants.append(("torch.compile", spec.compiled_variant()))
            if use_liger:
                try:
                    variants.append(("liger", liger.variant(name)))
                except Exception as exc:
                    _say(f"  liger: {name} not available ({str(exc)[:200]})")
            kinds = ["smoke"] if args.smoke else ["main"] if args.quick else ["sweep"] if args.sweep_only \
                else ["main", "sweep"]
            for case in [c for kind in kinds for c in spec.cases(kind)]:
                try:
                    ref = measure.Reference(eager, case, device)
                except Exception as exc:
                    _say(f"  {name} {case.label}: eager reference failed ({type(exc).__name__}: {exc}); skipped")
                    continue
                for variant, fn in variants:
                    row = measure.check_and_time(variant, fn, case, device, ref, timer, args.smoke)
                    row.update(op=name, op_rank=rank, kind=case.kind, shape=case.label, tokens=case.tokens,
                               dtype=specs.DTYPE_NAMES[case.dtype], bytes_fwd=case.bytes(False),
                               bytes_fb=case.bytes(True), copy_gbps=meta["copy_gbps"])
                    report.finish_rows([row])
                    data["rows"].append(row)
                    _say(f"  {name:<13} {case.label:<38} {variant:<13} fwd {report._f(row['fwd_ms'], '.4f')} ms "
                         f"({report._f(row['fwd_frac'], '.2f')} of copy)  f+b {report._f(row['fb_ms'], '.4f')} ms "
                         f"({report._f(row['fb_frac'], '.2f')})  {report._check(row)}")
                    if row.get("check", "ok") != "ok":
                        mismatches.append(f"{name} {case.label} {variant}: {report._check(row)}")
                del ref
            save()
            _say(f"  ({name} done at {time.time() - started:.0f} s)")
        try:
            from torch._dynamo.utils import counters

            meta["dynamo_graph_breaks"] = sum(counters["graph_break"].values())
        except Exception:
            pass

    # -- CUDA graphs -------------------------------------------------------------------------------------
    if "cudagraphs" not in args.skip:
        try:
            model_ops = [n for n in available if n in names]
            data["cudagraphs"] = cudagraphs.cudagraph_check(device, model_ops, args.npu_entry, compile_model=not cpu)
        except Exception as exc:
            data["cudagraphs"] = {"status": "ERROR", "error": f"{type(exc).__name__}: {exc}"[:300]}
        _say("\nCUDA graphs check:\n" + report.format_cudagraphs(data["cudagraphs"]))

    save()
    if data["rows"]:
        _say("\n" + report.format_table(data["rows"]))
    if mismatches:
        _say("\n!! MISMATCHES / ERRORS:\n" + "\n".join(f"!!   {m}" for m in mismatches))
    _say("\n" + "\n".join(f"wrote {k}: {v}" for k, v in out_paths.items()))
    _say(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
