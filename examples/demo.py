"""npu-liger demo: a small gated-MLP language model trained with npu_liger's GEGLU, compiled with
fullgraph=True, next to the same model in plain eager PyTorch.

Runs on the best device present: an Ascend NPU (torch_npu), a CUDA GPU, else the CPU through the Triton
interpreter with the launch geometry of an emulated Ascend chip.
"""

import os
import sys
import time

import torch

if len(sys.argv) > 1 and sys.argv[1] in ("cpu", "cuda", "npu"):
    DEVICE = sys.argv[1]
else:
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported
if DEVICE == "npu":
    import torch_npu  # noqa: F401

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import npu_liger  # noqa: E402
from npu_liger.npu_ops import geglu as geglu_kernels  # noqa: E402

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, SEQ, BATCH, STEPS = 256, 64, 176, 2, 32, 8, 30


class EagerGEGLUMLP(nn.Module):
    """The reference: Gemma's MLP written with PyTorch ops."""

    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class TinyLM(nn.Module):
    def __init__(self, mlp_factory):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.norms = nn.ModuleList(nn.LayerNorm(HIDDEN) for _ in range(LAYERS))
        self.mlps = nn.ModuleList(mlp_factory() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.head(x)


def train(model, step_fn, data):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for tokens in data:
        logits = step_fn(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    reference = TinyLM(EagerGEGLUMLP).to(DEVICE)
    ours = TinyLM(lambda: npu_liger.nn.GEGLUMLP(HIDDEN, INTERMEDIATE)).to(DEVICE)
    ours.load_state_dict(reference.state_dict())
    # Synthetic data with structure to learn: each sequence counts up from a random start.
    starts = torch.randint(0, VOCAB, (STEPS, BATCH, 1), device=DEVICE)
    data = (starts + torch.arange(SEQ + 1, device=DEVICE)) % VOCAB

    compiled = torch.compile(ours, fullgraph=True, dynamic=True)
    t0 = time.perf_counter()
    ours_losses = train(ours, compiled, data)
    t1 = time.perf_counter()
    ref_losses = train(reference, reference, data)

    plan_f = npu_liger.tiling.plan_launch(DEVICE, geglu_kernels._request(BATCH * SEQ * INTERMEDIATE,
                                                                         geglu_kernels.FORWARD_MEMORY_MULTIPLIER))
    plan_b = npu_liger.tiling.plan_launch(DEVICE, geglu_kernels._request(BATCH * SEQ * INTERMEDIATE,
                                                                         geglu_kernels.BACKWARD_MEMORY_MULTIPLIER))
    where = f"emulated {plan_f.chip} ({plan_f.ub_bytes} B UB, {plan_f.max_programs} vector cores)" \
        if plan_f.backend == "cpu" else plan_f.backend
    print(f"device: {DEVICE}   backend: {plan_f.backend}   kernels: Triton {'interpreter' if DEVICE == 'cpu' else 'compiled'} on {where}")
    print(f"op: torch.ops.npu_liger.geglu / geglu_backward inside torch.compile(fullgraph=True, dynamic=True)")
    print(f"UB tiles for {BATCH * SEQ * INTERMEDIATE} elements: forward BLOCK={plan_f.block} grid={plan_f.grid(-(-BATCH * SEQ * INTERMEDIATE // plan_f.block))}, "
          f"backward BLOCK={plan_b.block} grid={plan_b.grid(-(-BATCH * SEQ * INTERMEDIATE // plan_b.block))}")
    print(f"{'step':>4}  {'npu_liger (compiled)':>20}  {'eager PyTorch':>14}  {'diff':>9}")
    for step, (a, b) in enumerate(zip(ours_losses, ref_losses)):
        if step % 5 == 0 or step == len(ours_losses) - 1:
            print(f"{step:4d}  {a:20.5f}  {b:14.5f}  {abs(a - b):9.2e}")
    worst = max(abs(a - b) for a, b in zip(ours_losses, ref_losses))
    print(f"trained {STEPS} steps in {t1 - t0:.1f}s; largest loss difference vs eager: {worst:.2e}")
    if worst > 1e-3 or not ours_losses[-1] < ours_losses[0]:
        raise SystemExit("FAILED: npu_liger training diverged from the eager reference")
    print("OK: the compiled npu_liger model trains like the eager PyTorch model")


if __name__ == "__main__":
    main()
