"""CUDA-graphs check: a small model that uses every available op, compiled with ``mode="reduce-overhead"``
(fullgraph), trained for a few steps, must match the eager-formula model and log no cudagraph skips.

Skips are read from Inductor's counter ``counters["inductor"]["cudagraph_skips"]`` and from the
``perf_hints`` log records that mention cudagraphs. Ops npu_liger does not provide yet run as their eager
formula (listed in the result). On CPU the compile step is skipped and only the eager model check runs.
"""

from __future__ import annotations

import logging
from typing import Dict, List

import torch

from .measure import rel_err, sync
from .specs import SPECS, _angles


class TinyModel(torch.nn.Module):
    """embedding -> q/k projections -> rope -> qwen2vl_mrope -> llama4_rope -> geglu + swiglu MLP -> tvd loss."""

    def __init__(self, impl: Dict, vocab=64, dim=32, heads=2, ffn=48):
        super().__init__()
        self.impl, self.vocab, self.dim, self.heads = impl, vocab, dim, heads
        self.weight = torch.nn.Parameter(torch.randn(vocab, dim) * 0.5)
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wk = torch.nn.Linear(dim, dim, bias=False)
        self.up = torch.nn.Linear(dim, 2 * ffn, bias=False)
        self.down = torch.nn.Linear(ffn, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, cos, sin, cos3, sin3, freqs, target):
        impl = self.impl
        bsz, seq = idx.shape
        hd = self.dim // self.heads
        (x,) = impl["embedding"](self.weight, idx.reshape(-1))
        x = x.view(bsz, seq, self.dim)
        q = self.wq(x).view(bsz, seq, self.heads, hd)
        k = self.wk(x).view(bsz, seq, self.heads, hd)
        q, k = impl["rope"](q, k, cos, sin)  # -> (bsz, heads, seq, hd)
        q, k = impl["qwen2vl_mrope"](q.transpose(1, 2), k.transpose(1, 2), cos3, sin3)
        q, k = impl["llama4_rope"](q.transpose(1, 2), k.transpose(1, 2), freqs)  # (bsz, seq, heads, hd)
        x = x + (q * k).reshape(bsz, seq, self.dim)
        g, u = self.up(x).chunk(2, dim=-1)
        (a,) = impl["geglu"](g, u)
        (b,) = impl["swiglu"](g, u)
        x = x + self.down(a + b)
        p = torch.softmax(self.head(x), dim=-1).reshape(bsz * seq, self.vocab)
        (loss,) = impl["tvd"](p, target)
        return loss


def _inputs(device, bsz=2, seq=8, vocab=64, dim=32, heads=2):
    gen = torch.Generator(device="cpu").manual_seed(0)
    hd = dim // heads
    idx = torch.randint(0, vocab, (bsz, seq), generator=gen)
    ang = _angles(torch.arange(seq), hd)
    emb = torch.cat((ang, ang), dim=-1)[None]
    base = torch.arange(seq)
    pos3 = torch.stack((base, base // 2, base % 3)).unsqueeze(1).expand(3, bsz, seq)
    ang3 = _angles(pos3, hd)
    emb3 = torch.cat((ang3, ang3), dim=-1).contiguous()
    freqs = torch.polar(torch.ones_like(ang), ang)[None]
    target = torch.softmax(torch.randn(bsz * seq, vocab, generator=gen), dim=-1)
    tensors = (idx, emb.cos(), emb.sin(), emb3.cos(), emb3.sin(), freqs, target)
    return tuple(t.to(device) for t in tensors)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:
            return
        if "cudagraph" in msg.lower():
            self.messages.append(msg.splitlines()[0][:300])


def _grads(model) -> Dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def cudagraph_check(device: str, available: List[str], entry: str, compile_model: bool, steps: int = 3) -> Dict:
    npu_ops = [op for op in SPECS if op in available]
    impl_npu = {op: (SPECS[op].npu_variant(entry) if op in npu_ops else SPECS[op].eager_variant()) for op in SPECS}
    impl_eager = {op: SPECS[op].eager_variant() for op in SPECS}
    torch.manual_seed(0)
    ref_model = TinyModel(impl_eager).to(device)
    model = TinyModel(impl_npu).to(device)
    model.load_state_dict(ref_model.state_dict())
    inputs = _inputs(device)
    result: Dict = {"npu_liger_ops": npu_ops, "eager_fallback_ops": [op for op in SPECS if op not in npu_ops]}

    ref_loss = ref_model(*inputs)
    ref_loss.backward()
    ref_grads = _grads(ref_model)

    if not compile_model:
        loss = model(*inputs)
        loss.backward()
        result["mode"] = "no CUDA graphs on this device; the model ran eagerly and was compared with the eager formulas"
    else:
        from torch._dynamo.utils import counters

        counters.clear()
        capture = _Capture()
        torch_logger = logging.getLogger("torch")
        torch_logger.addHandler(capture)
        try:
            torch._logging.set_logs(perf_hints=True)
        except Exception:
            pass
        try:
            compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
            for _ in range(steps):
                torch.compiler.cudagraph_mark_step_begin()
                model.zero_grad(set_to_none=True)
                loss = compiled(*inputs)
                loss.backward()
                loss = loss.detach().clone()
            sync(device)
        except Exception as exc:
            result.update(status="ERROR", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            return result
        finally:
            torch_logger.removeHandler(capture)
            try:
                torch._logging.set_logs()
            except Exception:
                pass
        result["mode"] = f'torch.compile(mode="reduce-overhead", fullgraph=True), {steps} training steps'
        result["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
        result["skip_messages"] = capture.messages
        try:
            from torch._inductor import cudagraph_trees

            manager = cudagraph_trees.get_manager(torch.device(device).index or 0, create_if_none_exists=False)
            result["cudagraph_functions"] = None if manager is None else len(manager.ids_to_funcs)
        except Exception:
            result["cudagraph_functions"] = "unknown"

    result["loss_err"] = rel_err(loss, ref_loss)
    grads = _grads(model)
    result["grad_err"] = max((rel_err(grads.get(n), g) for n, g in ref_grads.items()), default=0.0)
    matches = result["loss_err"] <= 1e-4 and result["grad_err"] <= 1e-3
    if not compile_model:  # nothing was captured: say so, and report the eager model comparison on its own
        result.update(status="not run", eager_model_check="ok" if matches else "MISMATCH")
        return result
    skips = result.get("cudagraph_skips", 0) or sum("skipping" in m.lower() for m in result.get("skip_messages", []))
    result["status"] = "ok" if matches and not skips else ("MISMATCH" if not matches else "SKIPPED CUDAGRAPHS")
    return result
