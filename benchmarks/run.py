#!/usr/bin/env python
"""npu-liger GPU benchmark harness: one command times every op against eager PyTorch, torch.compile and
Liger-Kernel, next to the GPU's own copy bandwidth.

    python benchmarks/run.py [--ops geglu,swiglu,...] [--quick] [--out DIR | --publish]

Sections, in order: device-to-device copy bandwidth; Triton compiled variants per op across 16 sequence
lengths; eager dispatch overhead on tiny tensors; forward and forward+backward timings (checked against eager
first) at the issue's shapes plus a token sweep (``--quick`` skips the sweep); a CUDA-graphs check of a small
compiled model. Outputs: results.csv, results.json, results.png, BENCHMARKS_snippet.md, written after every op
so an interrupted run keeps what it measured, into ``benchmarks/output/`` (untracked) unless ``--out DIR`` says
otherwise; ``--publish`` writes them into ``benchmarks/results/``, the tracked folder BENCHMARKS.md cites.
``--merge DIR...`` rebuilds them from several runs' results.json (no GPU needed).

CPU smoke test (Triton interpreter, tiny shapes, wall-clock timer, no torch.compile/Liger, no CUDA graphs):

    TRITON_INTERPRET=1 python benchmarks/run.py --device cpu --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("compile-count", "dispatch", "timing", "cudagraphs")  # the copy bandwidth always runs: the roofline
DEFAULT_OUT = os.path.join(REPO, "benchmarks", "output")  # in .gitignore: a run never touches tracked files
PUBLISHED_OUT = os.path.join(REPO, "benchmarks", "results")  # what BENCHMARKS.md cites; only with --publish


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
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: benchmarks/output, untracked)")
    where.add_argument("--publish", action="store_true",
                       help="write into benchmarks/results (tracked; what BENCHMARKS.md cites)")
    p.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variant")
    p.add_argument("--no-liger", action="store_true", help="leave out Liger-Kernel even when importable")
    p.add_argument("--npu-entry", default="functional", choices=("functional", "op"),
                   help="npu_liger variant: the functional API npu_liger.<op> (default; eager bypass) or "
                        "torch.ops.npu_liger.<op>.default")
    p.add_argument("--warmup-ms", type=float, default=25.0, help="do_bench warmup (ms)")
    p.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time (ms)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timing rounds per case (default 3 on CUDA, 1 for --smoke and on CPU): each round times "
                        "every variant once, in turn; a row reports the median of its rounds")
    p.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (MiB; default 1024 on "
                   "cuda, 16 on cpu)")
    p.add_argument("--loss-grad", type=float, default=1.0,
                   help="the incoming gradient of every scalar loss's row (default 1, loss.backward(); e.g. 0.25 for "
                        "a loss divided by 4 gradient-accumulation steps)")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="combine results.json of these folders into the output")
    args = p.parse_args(argv)
    if args.smoke:
        args.quick = True
    if args.publish:
        if args.smoke:
            p.error("--publish is for real runs: a smoke run's numbers are not results")
        args.out = PUBLISHED_OUT
    args.skip = {s for s in args.skip.split(",") if s}
    unknown = args.skip - set(SECTIONS)
    if unknown:
        p.error(f"unknown --skip sections {sorted(unknown)}; choose from {SECTIONS}")
    return args


def _say(msg: str = "") -> None:
    print(msg, flush=True)


# ---- the run's state and its rows ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowKey:
    """What a timing row measured (the measurements themselves come from ``measure.check_and_time``)."""

    op: str
    op_rank: int  # the op's place in specs.SPECS: the order of the tables
    kind: str  # "main", "sweep" or "smoke"
    shape: str
    tokens: int
    dtype: str
    bytes_fwd: int
    bytes_fb: int
    copy_gbps: float

    @classmethod
    def of(cls, case, rank: int, copy_gbps: float) -> "RowKey":
        from benchmarks import specs

        return cls(case.op, rank, case.kind, case.label, case.tokens, specs.DTYPE_NAMES[case.dtype],
                   case.bytes(False), case.bytes(True), copy_gbps)


@dataclass
class Session:
    """Everything the steps share: the options, the timer, and the data written to the output folder."""

    args: argparse.Namespace
    names: List[str]  # the ops to run, in specs.SPECS order
    timer: object
    use_compile: bool
    use_liger: bool
    meta: Dict
    started: float = field(default_factory=time.time)
    data: Dict = field(default_factory=dict)
    mismatches: List[str] = field(default_factory=list)
    out_paths: Dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self.data = {"meta": self.meta, "rows": [], "dispatch": [], "compile_counts": [], "cudagraphs": None}

    @property
    def device(self) -> str:
        return self.args.device

    @property
    def cpu(self) -> bool:
        return self.args.device == "cpu"

    @property
    def rounds(self) -> int:
        if self.args.rounds is not None:
            return max(1, self.args.rounds)
        return 1 if self.cpu or self.args.smoke else 3

    def save(self) -> None:
        """Rewrite every output from what was measured so far."""
        from benchmarks import liger, report

        self.data["rows"] = report.sort_rows(self.data["rows"])
        report.finish_rows(self.data["rows"])
        self.meta["liger_resolved"] = liger.resolved()
        self.meta["elapsed_s"] = round(time.time() - self.started, 1)
        self.out_paths = report.write_all(self.data, self.args.out)


# ---- steps -----------------------------------------------------------------------------------------------------

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


def start(args, argv) -> Optional[Session]:
    """Checks the device and the op names, configures Dynamo, and describes the run; None (after saying why)
    when it cannot run."""
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("TRITON_INTERPRET=1 is set: unset it for --device cuda", file=sys.stderr)
        return None

    import torch
    import torch._dynamo

    from benchmarks import liger, measure, reference, specs

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --smoke for the CPU smoke test", file=sys.stderr)
        return None
    names = specs.op_names() if args.ops == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [n for n in names if n not in specs.SPECS]
    if bad:
        print(f"unknown ops {bad}; known: {specs.op_names()}", file=sys.stderr)
        return None
    for attr in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, attr):
            setattr(torch._dynamo.config, attr, 64)

    eager_sources = reference.sources()  # resolve the HF formulas before anything (Liger) can patch transformers
    cpu = args.device == "cpu"
    timer = measure.Timer(args.device, args.warmup_ms, args.rep_ms, cpu_reps=3 if args.smoke else 10)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device,
        "command": "python benchmarks/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "timer": timer.name,
        "npu_entry": "npu_liger.<op> (functional API)" if args.npu_entry == "functional"
        else "torch.ops.npu_liger.<op>.default",
        **_versions(args.device),
        "eager_sources": eager_sources,
    }
    meta["commands"] = [meta["command"]]
    specs.LOSS_GRAD = meta["loss_grad"] = args.loss_grad
    session = Session(args, [n for n in specs.op_names() if n in names], timer,
                      use_compile=not (cpu or args.no_compile),
                      use_liger=not (cpu or args.no_liger) and liger.available(), meta=meta)
    _say(f"npu-liger benchmarks on {meta['device_name']}: torch {meta['torch']}, triton {meta['triton']}, "
         f"transformers {meta['transformers']}, liger-kernel {meta['liger_kernel'] or 'not used'}")
    session.meta["timing_rounds"] = session.rounds
    _say(f"timer: {timer.name}, median of {session.rounds} round(s) per row; "
         f"variants: npu_liger ({meta['npu_entry']}), eager"
         f"{', torch.compile' if session.use_compile else ''}{', liger' if session.use_liger else ''}")
    return session


def measure_copy_bandwidth(session: Session) -> None:
    from benchmarks import measure

    copy_mib = session.args.copy_mib or (16 if session.cpu else 1024)
    session.meta["copy_gbps"] = measure.copy_bandwidth_gbps(session.device, session.timer, copy_mib << 20)
    session.meta["copy_buffer_mib"] = copy_mib
    _say(f"copy bandwidth: {session.meta['copy_gbps']:.0f} GB/s (read + write, {copy_mib} MiB buffer)")


def count_compiles(session: Session) -> None:
    from benchmarks import measure, report, specs

    _say(f"\nTriton compiled variants across {len(specs.COMPILE_SEQ_LENS)} sequence lengths "
         f"(forward + backward; target <= 2 per kernel):")
    for name in session.names:
        if session.cpu or session.args.smoke:
            item = {"op": name, "status": "n/a on the CPU interpreter / smoke run (no compiled kernels)"}
        else:
            try:
                item = measure.compile_counts(specs.SPECS[name], session.device, specs.COMPILE_SEQ_LENS,
                                              session.args.npu_entry)
            except Exception as exc:
                item = {"op": name, "status": f"ERROR {type(exc).__name__}: {exc}"[:300]}
        session.data["compile_counts"].append(item)
        _say(report.format_compile([item]))


def measure_dispatch(session: Session) -> None:
    from benchmarks import measure, report, specs

    iters, repeats = (3, 1) if session.cpu else (20 if session.args.smoke else 1000, 5)
    _say("\nEager dispatch overhead on tiny tensors (µs per call, over the raw launcher):")
    for name in session.names:
        try:
            item = measure.dispatch_overhead(specs.SPECS[name], session.device, iters, repeats)
        except Exception as exc:
            item = {"op": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
        session.data["dispatch"].append(item)
    _say(report.format_dispatch(session.data["dispatch"]))


def _tuple_out(fn: Callable) -> Callable:
    def run(*args):
        out = fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return run


def variants(session: Session, spec) -> List[Tuple[str, Callable]]:
    """(name, fn) of every variant timed for ``spec``: npu_liger, eager, and torch.compile / Liger when used."""
    from benchmarks import liger

    found = [("npu_liger", spec.npu_variant(session.args.npu_entry)), ("eager", spec.eager_variant())]
    if session.use_compile:
        found.append(("torch.compile", spec.compiled_variant()))
    found.extend((name, _tuple_out(fn)) for name, fn in spec.peers.items())
    if session.use_liger:
        try:
            found.append(("liger", liger.variant(spec.name)))
        except Exception as exc:
            _say(f"  liger: {spec.name} not available ({str(exc)[:200]})")
    return found


def time_case(session: Session, spec, rank: int, case, timed: List[Tuple[str, Callable]]) -> None:
    """Every variant on one case: checked against eager on fresh inputs, then timed; one row each."""
    from benchmarks import measure, report

    try:
        ref = measure.Reference(spec.eager_variant(), case, session.device)
    except Exception as exc:
        _say(f"  {spec.name} {case.label}: eager reference failed ({type(exc).__name__}: {exc}); skipped")
        return
    key = dataclasses.asdict(RowKey.of(case, rank, session.meta["copy_gbps"]))
    rows = [{**measure.check_and_time(variant, fn, case, session.device, ref, session.timer, session.args.smoke),
             **key} for variant, fn in timed]
    for _ in range(session.rounds - 1):  # every variant once per round, in turn (measure.retime)
        for row, (_, fn) in zip(rows, timed):
            if row["error"]:
                continue
            try:
                measure.retime(row, fn, case, session.device, session.timer, session.args.smoke)
            except Exception as exc:  # keep the rounds already timed
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"a timing round failed: {exc}"[:200]
    for row in rows:
        report.finish_rows([row])
        session.data["rows"].append(row)
        spread = "" if len(row.get("fb_ms_rounds", ())) < 2 else (
            f"  rounds f+b {min(row['fb_ms_rounds']):.4f}-{max(row['fb_ms_rounds']):.4f} ms")
        _say(f"  {spec.name:<13} {case.label:<38} {row['variant']:<13} fwd {report._f(row['fwd_ms'], '.4f')} ms "
             f"({report._f(row['fwd_frac'], '.2f')} of copy)  f+b {report._f(row['fb_ms'], '.4f')} ms "
             f"({report._f(row['fb_frac'], '.2f')}){spread}  {report._check(row)}")
        if row.get("check", "ok") != "ok":
            session.mismatches.append(f"{spec.name} {case.label} {row['variant']}: {report._check(row)}")


def time_ops(session: Session) -> None:
    from benchmarks import specs

    args = session.args
    kinds = ["smoke"] if args.smoke else ["main"] if args.quick else ["sweep"] if args.sweep_only else ["main", "sweep"]
    _say("\nTimings (fresh identical inputs per variant; checked against eager first):")
    for rank, name in enumerate(specs.op_names()):
        if name not in session.names:
            continue
        spec = specs.SPECS[name]
        timed = variants(session, spec)
        for case in [c for kind in kinds for c in spec.cases(kind)]:
            time_case(session, spec, rank, case, timed)
        session.save()
        _say(f"  ({name} done at {time.time() - session.started:.0f} s)")
    try:
        from torch._dynamo.utils import counters

        session.meta["dynamo_graph_breaks"] = sum(counters["graph_break"].values())
    except Exception:
        pass


def check_cudagraphs(session: Session) -> None:
    from benchmarks import cudagraphs, report

    try:
        session.data["cudagraphs"] = cudagraphs.cudagraph_check(session.device, session.names,
                                                                session.args.npu_entry)
    except Exception as exc:
        session.data["cudagraphs"] = {"status": "ERROR", "error": f"{type(exc).__name__}: {exc}"[:300]}
    _say("\nCUDA graphs check:\n" + report.format_cudagraphs(session.data["cudagraphs"]))


def finish(session: Session) -> None:
    from benchmarks import report

    session.save()
    if session.data["rows"]:
        _say("\n" + report.format_table(session.data["rows"]))
    if session.mismatches:
        _say("\n!! MISMATCHES / ERRORS:\n" + "\n".join(f"!!   {m}" for m in session.mismatches))
    _say("\n" + "\n".join(f"wrote {k}: {v}" for k, v in session.out_paths.items()))
    _say(f"done in {time.time() - session.started:.0f} s")


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
    session = start(args, argv)
    if session is None:
        return 2
    measure_copy_bandwidth(session)
    steps = {"compile-count": count_compiles, "dispatch": measure_dispatch, "timing": time_ops,
             "cudagraphs": check_cudagraphs}
    for section, step in steps.items():
        if section not in args.skip:
            step(session)
    finish(session)
    return 0


if __name__ == "__main__":
    sys.exit(main())
