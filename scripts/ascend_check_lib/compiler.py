"""The two compile stages that run without Ascend hardware or CANN, and the chips they target.

Stage 1: ``triton.compile(ASTSource(...), target=GPUTarget("npu", chip, 0))`` with triton-ascend. Without CANN it
  stops at stage ``ConvertLinalgRToBinary`` ("ASCEND_HOME_PATH is not set") after writing ``<kernel>.ttadapter``
  (Linalg/HIVM IR) to the Triton cache. Any earlier error is a real incompatibility of the kernel.
  The signature, constants, specialisation (divisibility / equal-to-1) and options are computed by
  triton-ascend's own binder from the recorded launch arguments, exactly as ``JITFunction.run`` does on an NPU.
Stage 2: ``bishengir-compile`` (PyPI ``ascendnpu-ir``) on that IR, with the flags triton-ascend's
  ``linalg_to_bin_enable_npu_compile_*`` passes for the same options. It plans the Unified Buffer and prints
  ``ub overflow, requires N bits while M bits available!`` when the tiles do not fit; otherwise it only lacks
  CANN's ``hivmc``, which a stub answers (so fitting kernels exit 0).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Tuple

HIVMC_STUB_VERSIONS = {
    "hivmc": "hivmc 1.2.0 (8796a8ac1508 2026-07-29)",  # the A2/A3 bishengir-compile's build
    "hivmc-a5": "hivmc 1.2.0 (f9d978b14443 2026-07-29)",  # the A5 (Ascend950) bishengir-compile-a5's build
}


@dataclass(frozen=True)
class ChipProfile:
    """``name``: the package's chip (``NPU_LIGER_EMULATED_CHIP``, tiling/chips.py); ``target``: the arch given to
    triton-ascend and ``bishengir-compile --target``; ``npu_options``: NPUOptions defaults a triton-ascend build for
    that chip uses (the PyPI 3.2.0 wheel is an A2/A3 build: ``is_compile_on_910_95 = False``)."""

    name: str
    target: str
    compiler: str
    hivm_compile: bool
    npu_options: Tuple[Tuple[str, object], ...] = ()


CHIPS: Dict[str, ChipProfile] = {
    c.name: c
    for c in (
        ChipProfile("Ascend910B3", "Ascend910B3", "bishengir-compile", True),  # A2
        ChipProfile("Ascend910_9392", "Ascend910_9392", "bishengir-compile", True),  # A3
        # A5: bishengir accepts no plain "Ascend950"; its Ascend950PR_*/Ascend950DT_* targets share one UB size.
        # triton-ascend's 910_95 path: no auto multi-buffer / sub-block binding, select analysis on.
        ChipProfile("Ascend950", "Ascend950PR_9599", "bishengir-compile-a5", False,
                    (("compile_on_910_95", True), ("multibuffer", False), ("enable_auto_bind_sub_block", False),
                     ("enable_select_analysis", True))),
    )
}

# NPUOptions field -> bishengir-compile flag, in the order linalg_to_bin_enable_npu_compile_A2_A3 adds them
# (only options that are not None are passed).
_OPTION_FLAGS = (
    ("multibuffer", "--enable-auto-multi-buffer"),
    ("enable_auto_bind_sub_block", "--enable-auto-bind-sub-block"),
    ("enable_hivm_auto_cv_balance", "--enable-hivm-auto-cv-balance"),
    ("sync_solver", "--enable-hivm-graph-sync-solver"),
    ("unit_flag", "--enable-hivm-unit-flag-sync"),
    ("inject_barrier_all", "--enable-hivm-inject-barrier-all-sync"),
    ("inject_block_all", "--enable-hivm-inject-block-all-sync"),
    ("limit_auto_multi_buffer_only_for_local_buffer", "--limit-auto-multi-buffer-only-for-local-buffer"),
    ("set_workspace_multibuffer", "--set-workspace-multibuffer"),
    ("tile_mix_vector_loop", "--tile-mix-vector-loop"),
    ("tile_mix_cube_loop", "--tile-mix-cube-loop"),
    ("limit_auto_multi_buffer_of_local_buffer", "--limit-auto-multi-buffer-of-local-buffer"),
    ("disable_auto_inject_block_sync", "--disable-auto-inject-block-sync"),
)
_A5_SKIPPED_OPTIONS = {"sync_solver", "inject_block_all", "disable_auto_inject_block_sync"}

_OVERFLOW_RE = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
_FALLBACK_RE = re.compile(r"Ub overflow detected")
_CACHE_RE = re.compile(r"The compiled kernel cache is in (\S+)")
_MIX_MODE_RE = re.compile(r', mix_mode\s*=\s*"[^"]*"')
_LLVM_CRASH = "PLEASE submit a bug report"


@dataclass
class CompileResult:
    stage1: str  # "ok" or "FAIL"
    stage2: str  # "fits", "fits*" (only after bishengir turned multi-buffer off), "UB OVERFLOW", "FAIL", "-"
    bits_required: Optional[int] = None
    bits_available: Optional[int] = None
    detail: str = ""
    crashed_once: bool = False  # stage 1's compiler crashed, and the same compile passed when run again
    signature: Dict[str, str] = field(default_factory=dict)
    constants: Dict[str, object] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.stage1 != "ok" or self.stage2 not in ("fits", "fits*")

    @property
    def clean(self) -> bool:
        return self.stage1 == "ok" and self.stage2 == "fits"

    @property
    def fits(self) -> bool:
        return self.stage1 == "ok" and self.stage2 in ("fits", "fits*")


def _first_error_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "[ERROR][Triton]" not in ln and "encounters error" not in ln]
    for ln in lines:
        if "error" in ln.lower() or "assert" in ln.lower():
            return ln[:limit]
    return (lines[0] if lines else "").strip()[:limit]


class Compiler:
    """Compiles recorded launches for one chip at a time; results are memoised by the full compile key."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.stub_dir = self.workdir / "stub-bin"
        self.out_dir = self.workdir / "bishengir-out"
        self.stub_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, version in HIVMC_STUB_VERSIONS.items():
            stub = self.stub_dir / name
            stub.write_text("#!/bin/sh\n# stub: CANN's hivmc is not needed to plan the UB\n"
                            f'for a in "$@"; do [ "$a" = "--version" ] && {{ echo "{version}"; exit 0; }}; done\n'
                            "exit 0\n")
            stub.chmod(0o755)
        import ascendnpuir

        self.bin_dir = Path(ascendnpuir.__file__).parent / "bin"
        self._memo: Dict[tuple, CompileResult] = {}
        self._count = 0

    def tool_versions(self) -> Dict[str, str]:
        out = {}
        for tool in ("bishengir-compile", "bishengir-compile-a5"):
            res = subprocess.run([str(self.bin_dir / tool), "--version"], capture_output=True, text=True)
            out[tool] = (res.stdout.strip().splitlines() or ["?"])[0]
        return out

    # ---- stage 1 -------------------------------------------------------------------------------------------
    def _bind(self, fn, args, kwargs, chip: ChipProfile):
        """What JITFunction.run computes before compiling: signature, constants, attrs and options."""
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend

        target = GPUTarget("npu", chip.target, 0)
        backend = make_backend(target)
        fn.create_binder(backend)
        kwargs = {**dict(chip.npu_options), **kwargs}
        kwargs["debug"] = kwargs.get("debug", False)
        if getattr(fn, "bishengir_option", None):
            kwargs.update(fn.bishengir_option)
        bound_args, sig_and_spec, _constexpr_vals, _non_constexpr_vals, excess_kwargs = fn.binder(*args, **kwargs)
        options = backend.parse_options(kwargs)
        for k in excess_kwargs:
            if k not in options.__dict__:
                raise KeyError(f"Keyword argument {k} was specified but unrecognised")
        bound_vals = tuple(bound_args.values())
        sigkeys = [fn.params[i].name for i in fn.non_constexpr_indices]
        sigvals = sig_and_spec[: len(sigkeys)]
        signature = {k: ("*i8" if v == "none" else v) for k, v in zip(sigkeys, sigvals, strict=True)}
        attrs = backend.get_attrs_descriptor(fn.params, bound_vals)
        constant_params = attrs.get_constants()
        constants = {
            p.name: v
            for v, p in zip(bound_vals, fn.params, strict=True)
            if p.is_constexpr or (p.num in constant_params) or v is None
        }
        src = ASTSource(fn, signature, constants, attrs)
        return src, target, options, signature, constants, bound_args

    def compile(self, fn, args, kwargs, chip: ChipProfile, overrides: Optional[dict] = None) -> CompileResult:
        """Both stages for one launch; ``overrides`` replaces constexpr values (the headroom probe)."""
        import triton

        kwargs = dict(kwargs)
        if overrides:
            kwargs.update(overrides)
        try:
            src, target, options, signature, constants, _ = self._bind(fn, args, kwargs, chip)
        except Exception as exc:  # binding the launch failed: as on a device, the launch itself is wrong
            return CompileResult("FAIL", "-", detail=f"bind: {type(exc).__name__}: {exc}"[:300])
        key = (fn.cache_key, chip.target, repr(sorted(signature.items())), repr(sorted(constants.items())),
               src.attrs.hash(), options.hash())
        if key in self._memo:
            return self._memo[key]
        display_constants = {p.name: constants[p.name] for p in fn.params if p.name in constants}
        result = self._stage1(triton, src, target, options, fn.__name__)
        crashed_once = isinstance(result, CompileResult) and _LLVM_CRASH in result.detail
        if crashed_once:
            # triton-ascend's Linalg conversion has crashed (an LLVM abort, not a diagnostic) on one CI run for a
            # kernel that compiles on every rerun; a crash that repeats stays a failure
            result = self._stage1(triton, src, target, options, fn.__name__)
        if isinstance(result, CompileResult):
            result.signature, result.constants = signature, display_constants
            self._memo[key] = result
            return result
        result = self._stage2(result, chip, options)
        result.crashed_once = crashed_once
        result.signature, result.constants = signature, display_constants
        self._memo[key] = result
        return result

    def _stage1(self, triton, src, target, options, name):
        noise = io.StringIO()
        try:
            with contextlib.redirect_stdout(noise):  # triton-ascend prints "Invalid bishengir path" notes
                triton.compile(src, target=target, options=options.__dict__)
        except Exception as exc:
            text = str(exc)
            # A2/A3 path: CANN's arch lookup (ASCEND_HOME_PATH); 910_95 path: the compiler call itself ("npuc",
            # as bishengir-compile is deliberately not on PATH here). Either way the Linalg IR was complete.
            reached_binary = "ASCEND_HOME_PATH" in text or "No such file or directory: 'npuc'" in text
            if "[ConvertLinalgRToBinary]" in text and reached_binary:
                match = _CACHE_RE.search(text)
                path = Path(match.group(1)) / f"{name[:150]}.ttadapter" if match else None
                if path is None or not path.is_file():
                    return CompileResult("FAIL", "-",
                                         detail=f"stage 1 stopped as expected but left no {name}.ttadapter")
                return path
            stage = re.search(r"\[(\w+)\] encounters error", text)
            where = stage.group(1) if stage else type(exc).__name__
            return CompileResult("FAIL", "-", detail=f"{where}: {_first_error_line(text)}")
        return CompileResult("FAIL", "-", detail="stage 1 unexpectedly produced a binary (is CANN installed?)")

    # ---- stage 2 -------------------------------------------------------------------------------------------
    def stage2_command(self, ttadapter: Path, out: Path, chip: ChipProfile, options) -> list:
        cmd = [str(self.bin_dir / chip.compiler), str(ttadapter), f"--target={chip.target}"]
        for opt_name, flag in _OPTION_FLAGS:
            if chip.compiler.endswith("-a5") and opt_name in _A5_SKIPPED_OPTIONS:
                continue
            value = getattr(options, opt_name, None)
            if value is not None:
                cmd.append(f"{flag}={value}")
        cmd.append("--enable-hfusion-compile=true")
        if chip.hivm_compile:
            cmd.append("--enable-hivm-compile=true")
        cmd += ["--enable-triton-kernel-compile=true", "-o", str(out)]
        return cmd

    def _stage2(self, ttadapter: Path, chip: ChipProfile, options) -> CompileResult:
        self._count += 1
        src = self.out_dir / f"k{self._count}.ttadapter.mlir"
        # triton-ascend strips the mix_mode attribute before handing the IR to bishengir-compile
        src.write_text(_MIX_MODE_RE.sub("", ttadapter.read_text()))
        out = self.out_dir / f"k{self._count}"
        env = dict(os.environ, PATH=f"{self.stub_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        proc = subprocess.run(self.stage2_command(src, out, chip, options), capture_output=True, text=True, env=env)
        text = proc.stdout + proc.stderr
        for leftover in self.out_dir.glob(f"k{self._count}*"):
            if leftover.is_file():
                leftover.unlink()
        match = _OVERFLOW_RE.search(text)
        if proc.returncode == 0:
            return CompileResult("ok", "fits*" if _FALLBACK_RE.search(text) else "fits")
        if match:
            return CompileResult("ok", "UB OVERFLOW", int(match.group(1)), int(match.group(2)))
        return CompileResult("ok", "FAIL", detail=f"bishengir rc={proc.returncode}: {_first_error_line(text)}")


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="npu-liger-ascend-check-"))


def remove_workdir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def check_environment() -> None:
    """Refuse to run where the answers would be wrong: community triton, or the interpreter selected."""
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("ascend_check: unset TRITON_INTERPRET (the check compiles, it never interprets)")
    try:
        import triton.backends.ascend.compiler  # noqa: F401
        import ascendnpuir  # noqa: F401
    except ImportError as exc:
        sys.exit(f"ascend_check: run inside the check venv (bash scripts/ascend_check.sh): {exc}")
