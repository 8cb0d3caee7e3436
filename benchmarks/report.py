"""Results: the console table, CSV, JSON, a markdown snippet for BENCHMARKS.md and a matplotlib plot.

Everything here works from plain dicts (the JSON's content), so ``run.py --merge`` can rebuild all outputs
from several runs' ``results.json`` without a GPU.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Dict, Iterable, List, Optional

VARIANT_ORDER = ("npu_liger", "liger", "torch.compile", "eager")
NPU = "npu_liger"
CSV_FIELDS = ("op", "kind", "shape", "tokens", "dtype", "variant", "fwd_ms", "fwd_gbps", "fwd_frac", "fb_ms",
              "fb_gbps", "fb_frac", "speedup_fwd", "best_other_fwd", "speedup_fb", "best_other_fb", "fwd_err",
              "fb_err", "fb_peak_gib", "fwd_kernel_ms", "fwd_kernel_frac", "fb_kernel_ms", "fb_kernel_frac", "check",
              "note", "error", "bytes_fwd", "bytes_fb", "copy_gbps", "pool")


def finish_rows(rows: List[Dict]) -> None:
    """Fill in GB/s, fraction of copy bandwidth, and npu_liger's speed-up over the best other variant."""
    for r in rows:
        for mode, nbytes in (("fwd", r["bytes_fwd"]), ("fb", r["bytes_fb"])):
            ms = r.get(f"{mode}_ms")
            r[f"{mode}_gbps"] = nbytes / ms / 1e6 if ms else None
            r[f"{mode}_frac"] = r[f"{mode}_gbps"] / r["copy_gbps"] if ms and r.get("copy_gbps") else None
            kernel_ms = r.get(f"{mode}_kernel_ms")  # the kernels alone (CUDA runs): the row's floor without the host
            r[f"{mode}_kernel_frac"] = (nbytes / kernel_ms / 1e6 / r["copy_gbps"]
                                        if kernel_ms and r.get("copy_gbps") else None)
    groups: Dict[tuple, List[Dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["shape"]), []).append(r)
    for group in groups.values():
        npu = [r for r in group if r["variant"] == NPU]
        others = [r for r in group if r["variant"] != NPU]
        for r in npu:
            for mode in ("fwd", "fb"):
                timed = [o for o in others if o.get(f"{mode}_ms")]
                best = min(timed, key=lambda o: o[f"{mode}_ms"], default=None)
                ok = best is not None and r.get(f"{mode}_ms")
                r[f"speedup_{mode}"] = best[f"{mode}_ms"] / r[f"{mode}_ms"] if ok else None
                r[f"best_other_{mode}"] = best["variant"] if ok else None


def sort_rows(rows: List[Dict]) -> List[Dict]:
    kind_rank = {"main": 0, "smoke": 0, "sweep": 1}
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return sorted(rows, key=lambda r: (r.get("op_rank", 0), kind_rank.get(r["kind"], 2), r["tokens"], r["shape"],
                                       order.get(r["variant"], 9)))


def _f(x, fmt):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _gbps(x) -> str:
    return _f(x, ".0f" if x is None or x >= 10 else ".3g")


def _speedup(r) -> str:
    if r["variant"] != NPU:
        return ""
    parts = []
    for mode in ("fwd", "fb"):
        s = r.get(f"speedup_{mode}")
        parts.append("-" if s is None else f"{s:.2f}x {r.get(f'best_other_{mode}')}")
    return " | ".join(parts)


def _kernels_alone(r) -> str:
    if r.get("fwd_kernel_frac") is None and r.get("fb_kernel_frac") is None:
        return ""
    return f"{_f(r.get('fwd_kernel_frac'), '.2f')} | {_f(r.get('fb_kernel_frac'), '.2f')}"


def _check(r) -> str:
    text = r.get("check") or ""
    if r.get("error"):
        text += f" ({r['error']})"
    if r.get("note"):
        text += f" [{r['note']}]"
    if text.startswith("ok") and r.get("fb_err") is not None:
        errs = [e for e in (r.get("fwd_err"), r.get("fb_err")) if e is not None and not math.isnan(e)]
        if errs:
            text = text.replace("ok", f"ok {max(errs):.0e}", 1)
    return text


HEADER = ("op", "shape", "variant", "fwd ms", "fwd GB/s", "fwd/copy", "f+b ms", "f+b GB/s", "f+b/copy",
          "kernels alone/copy fwd | f+b", "f+b peak GiB",
          "npu_liger speed-up fwd | f+b", "check")


def table_cells(r: Dict) -> List[str]:
    return [r["op"], r["shape"], r["variant"], _f(r.get("fwd_ms"), ".4f"), _gbps(r.get("fwd_gbps")),
            _f(r.get("fwd_frac"), ".2f"), _f(r.get("fb_ms"), ".4f"), _gbps(r.get("fb_gbps")),
            _f(r.get("fb_frac"), ".2f"), _kernels_alone(r), _f(r.get("fb_peak_gib"), ".2f"), _speedup(r), _check(r)]


def format_table(rows: List[Dict]) -> str:
    cells = [list(HEADER)] + [table_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER) - 1)]
    lines = []
    for c in cells:
        lines.append("  ".join(x.ljust(w) for x, w in zip(c[:-1], widths, strict=True)) + "  " + c[-1])
        if c is cells[0]:
            lines.append("-" * min(200, sum(widths) + 2 * len(widths) + 10))
    return "\n".join(lines)


def markdown_table(rows: List[Dict]) -> str:
    out = ["| " + " | ".join(h.replace("|", "/") for h in HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = table_cells(r)
        if r["variant"] == NPU:
            cells[2] = f"**{cells[2]}**"
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)


def format_dispatch(items: List[Dict]) -> str:
    lines = ["op            raw launcher  torch.ops (overhead)   functional (overhead)  torch.ops+autograd  "
             "functional+autograd   [µs per call; target: overhead <= 5]"]
    for d in items:
        if "error" in d:
            lines.append(f"{d['op']:<13} {d['error']}")
            continue
        lines.append(
            f"{d['op']:<13} {d['launcher_us']:>10.1f}  {d['op_us']:>9.1f} ({d['op_overhead_us']:>+6.1f})   "
            f"{d['functional_us']:>9.1f} ({d['functional_overhead_us']:>+6.1f})  {d['op_autograd_us']:>17.1f}  "
            f"{d['functional_autograd_us']:>19.1f}   {_verdict(d)}")
    return "\n".join(lines)


def _verdict(d: Dict) -> str:
    if d.get("device") != "cuda":
        return "n/a (interpreter timings)"
    return "ok" if d["functional_overhead_us"] <= 5 else "OVER"


def format_compile(items: List[Dict]) -> str:
    lines = []
    for c in items:
        if "kernels" not in c:
            lines.append(f"{c['op']:<13} {c.get('status', '')}")
            continue
        kernels = ", ".join(f"{k}: {n}" for k, n in sorted(c["kernels"].items()))
        lines.append(f"{c['op']:<13} max {c['max_per_kernel']} per kernel, {c['total']} total  {c['status']}  "
                     f"({kernels})")
    return "\n".join(lines)


def format_cudagraphs(cg: Optional[Dict]) -> str:
    if not cg:
        return "not run"
    parts = [f"status: {cg.get('status')}", f"mode: {cg.get('mode', '-')}"]
    if "error" in cg:
        parts.append(f"error: {cg['error']}")
    for key in ("eager_model_check", "cudagraph_skips", "cudagraph_functions", "loss_err", "grad_err"):
        if key in cg:
            v = cg[key]
            parts.append(f"{key}: {v:.1e}" if isinstance(v, float) else f"{key}: {v}")
    parts.append("ops through npu_liger: " + (", ".join(cg.get("npu_liger_ops", [])) or "none"))
    if cg.get("eager_fallback_ops"):
        parts.append("as eager formula (not in --ops): " + ", ".join(cg["eager_fallback_ops"]))
    for m in cg.get("skip_messages", [])[:10]:
        parts.append(f"log: {m}")
    return "\n".join(parts)


def write_csv(rows: List[Dict], path: str) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k) for k in CSV_FIELDS})


def write_json(data: Dict, path: str) -> None:
    def clean(x):
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None  # JSON has no nan/inf; the row's "check" text keeps the verdict
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    with open(path, "w") as fh:
        json.dump(clean(data), fh, indent=1)


def plot(rows: List[Dict], path: str, title: str) -> Optional[str]:
    """Fraction of copy bandwidth against tokens, one row of panels per op (forward | forward+backward)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"no plot: matplotlib unavailable ({exc})"
    ops = []
    for r in rows:
        if r["op"] not in ops:
            ops.append(r["op"])
    if not ops:
        return "no plot: no rows"
    fig, axes = plt.subplots(len(ops), 2, figsize=(11, 2.6 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, (mode, name) in enumerate((("fwd", "forward"), ("fb", "forward+backward"))):
            ax = axes[i][j]
            for variant in VARIANT_ORDER:
                pts = sorted((r["tokens"], r[f"{mode}_frac"]) for r in rows
                             if r["op"] == op and r["variant"] == variant and r.get(f"{mode}_frac") is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=variant,
                            lw=2.2 if variant == NPU else 1.2)
            ax.axhline(0.9, color="grey", ls="--", lw=0.8)
            ax.set_xscale("log", base=2)
            top = max([1.1] + [r[f"{mode}_frac"] * 1.05 for r in rows if r["op"] == op and r.get(f"{mode}_frac")])
            ax.set_ylim(0, top)
            ax.set_title(f"{op} {name}", fontsize=9)
            ax.set_ylabel("fraction of copy BW", fontsize=8)
            ax.tick_params(labelsize=7)
            if i == len(ops) - 1:
                ax.set_xlabel("tokens", fontsize=8)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / len(ops)))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def markdown_snippet(data: Dict, plot_name: Optional[str]) -> str:
    meta = data["meta"]
    rows = data["rows"]
    main = [r for r in rows if r["kind"] in ("main", "smoke")]
    sweep = [r for r in rows if r["kind"] == "sweep"]
    lines = [f"## {meta.get('date', '')}: {meta.get('device_name', meta.get('device'))}", ""]
    lines += [f"- command: `{c}`" for c in meta.get("commands", [meta.get("command", "")])]
    lines += [
        f"- torch {meta.get('torch')}, triton {meta.get('triton')}, transformers {meta.get('transformers')}, "
        f"liger-kernel {meta.get('liger_kernel') or 'not installed'}, npu-liger {meta.get('npu_liger')}",
        f"- copy bandwidth (device-to-device, read + write): {_f(meta.get('copy_gbps'), '.0f')} GB/s; "
        f"timer: {meta.get('timer')}; npu_liger entry: {meta.get('npu_entry')}",
        "- bytes: geglu/swiglu 3 tensors fwd, 8 f+b; rope family q,k read+write fwd, + dq,dk read+write f+b; "
        "embedding 2·T·D fwd, + T·D grad read + V·D dW f+b; tvd p,q read fwd, + grad_p written f+b "
        "(q, the teacher, needs no grad)",
        "- kernels alone (CUDA): the same bytes over the summed durations of the kernels one call launches "
        "(torch.profiler, 10 calls), gaps left out; a row far below its kernels-alone figure is bound by the host",
        "",
        markdown_table(main),
    ]
    if sweep:
        lines += ["", "<details><summary>token sweep</summary>", "", markdown_table(sweep), "", "</details>"]
    if plot_name:
        lines += ["", f"![fraction of copy bandwidth]({plot_name})"]
    if data.get("dispatch"):
        lines += ["", "Eager dispatch overhead (tiny tensors, µs per call):", "", "```",
                  format_dispatch(data["dispatch"]), "```"]
    if data.get("compile_counts"):
        lines += ["", "Triton compiled variants across 16 sequence lengths (forward + backward):", "", "```",
                  format_compile(data["compile_counts"]), "```"]
    if data.get("cudagraphs"):
        lines += ["", "CUDA graphs (`mode=\"reduce-overhead\"`):", "", "```", format_cudagraphs(data["cudagraphs"]),
                  "```"]
    return "\n".join(lines) + "\n"


def write_all(data: Dict, out_dir: str) -> Dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    rows = data["rows"]
    paths = {"csv": os.path.join(out_dir, "results.csv"), "json": os.path.join(out_dir, "results.json"),
             "png": os.path.join(out_dir, "results.png"), "md": os.path.join(out_dir, "BENCHMARKS_snippet.md")}
    write_csv(rows, paths["csv"])
    write_json(data, paths["json"])
    meta = data["meta"]
    problem = plot(rows, paths["png"], f"{meta.get('device_name', meta.get('device'))}: fraction of copy bandwidth "
                   f"({_f(meta.get('copy_gbps'), '.0f')} GB/s)")
    if problem:
        paths.pop("png")
        paths["plot"] = problem
    with open(paths["md"], "w") as fh:
        fh.write(markdown_snippet(data, os.path.basename(paths["png"]) if "png" in paths else None))
    return paths


def merge(datas: Iterable[Dict]) -> Dict:
    """Combine several runs' results: later runs replace earlier rows for the same (op, shape, variant)."""
    merged: Dict = {"meta": {}, "rows": [], "dispatch": [], "compile_counts": [], "cudagraphs": None}
    rows: Dict[tuple, Dict] = {}
    dispatch: Dict[str, Dict] = {}
    counts: Dict[str, Dict] = {}
    commands: List[str] = []
    for data in datas:
        meta = data.get("meta", {})
        merged["meta"].update(meta)
        commands += meta.get("commands", [meta.get("command")] if meta.get("command") else [])
        for r in data.get("rows", []):
            rows[(r["op"], r["shape"], r["variant"])] = r
        dispatch.update({d["op"]: d for d in data.get("dispatch", [])})
        counts.update({c["op"]: c for c in data.get("compile_counts", [])})
        if data.get("cudagraphs"):
            merged["cudagraphs"] = data["cudagraphs"]
    merged["meta"]["commands"] = commands
    merged["rows"] = sort_rows(list(rows.values()))
    merged["dispatch"] = list(dispatch.values())
    merged["compile_counts"] = list(counts.values())
    return merged
