"""FSDP2 training-step throughput of a small Llama-style model, with and without the npu_liger ops.

    torchrun --nproc-per-node 2 benchmarks/fsdp_throughput.py                 # 2 GPUs, NCCL, bf16
    torchrun --nproc-per-node 2 benchmarks/fsdp_throughput.py --compile       # both variants under torch.compile
    torchrun --nproc-per-node 2 benchmarks/fsdp_throughput.py --device cpu --tiny   # smoke test (gloo)

Both variants are the same model (embedding -> [RMSNorm -> attention with rotary embeddings -> RMSNorm -> gated
MLP] x layers -> RMSNorm -> lm_head -> cross entropy), built from the same seed, each block and the root wrapped
with ``fully_shard`` (bf16 parameters, fp32 gradient reduction). "torch" uses ``nn.Embedding``, HF's
``rotate_half`` rotary formula and ``F.silu(gate) * up``; "npu_liger" uses ``npu_liger.embedding``,
``npu_liger.rope`` and ``npu_liger.swiglu``. Each rank trains on its own batch; tokens/s counts the tokens of
every rank. Rank 0 prints one line per variant and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu", "npu"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--compile", action="store_true", help="torch.compile each block (both variants)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--tiny", action="store_true", help="a toy size for a CPU smoke test")
    args = p.parse_args()
    if args.tiny:
        args.layers, args.dim, args.heads, args.kv_heads, args.hidden = 2, 32, 4, 2, 48
        args.vocab, args.seq, args.batch, args.steps, args.warmup = 64, 16, 2, 2, 1
        args.dtype = "float32"
    return args


def setup(args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (through npu_liger)
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
    if args.device == "npu":
        import torch_npu  # noqa: F401

        torch.npu.set_device(local_rank)
    dist.init_process_group({"cuda": "nccl", "cpu": "gloo", "npu": "hccl"}[args.device])
    device = torch.device(args.device, local_rank) if args.device != "cpu" else torch.device("cpu")
    return device


def build_model(args, use_npu_liger: bool, device):
    import torch
    import torch.nn.functional as F
    from torch import nn

    import npu_liger

    head_dim = args.dim // args.heads

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def rope(q, k, cos, sin):
        if use_npu_liger:
            return npu_liger.rope(q, k, cos, sin)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(args.dim), RMSNorm(args.dim)
            self.q_proj = nn.Linear(args.dim, args.heads * head_dim, bias=False)
            self.k_proj = nn.Linear(args.dim, args.kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(args.dim, args.kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(args.heads * head_dim, args.dim, bias=False)
            self.gate_proj = nn.Linear(args.dim, args.hidden, bias=False)
            self.up_proj = nn.Linear(args.dim, args.hidden, bias=False)
            self.down_proj = nn.Linear(args.hidden, args.dim, bias=False)

        def forward(self, x, cos, sin):
            bsz, seq, _ = x.shape
            h = self.attn_norm(x)
            q = self.q_proj(h).view(bsz, seq, -1, head_dim).transpose(1, 2)
            k = self.k_proj(h).view(bsz, seq, -1, head_dim).transpose(1, 2)
            v = self.v_proj(h).view(bsz, seq, -1, head_dim).transpose(1, 2)
            q, k = rope(q, k, cos, sin)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o_proj(attn.transpose(1, 2).reshape(bsz, seq, -1))
            h = self.mlp_norm(x)
            gate, up = self.gate_proj(h), self.up_proj(h)
            act = npu_liger.swiglu(gate, up) if use_npu_liger else F.silu(gate) * up
            return x + self.down_proj(act)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.dim)
            self.layers = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = RMSNorm(args.dim)
            self.lm_head = nn.Linear(args.dim, args.vocab, bias=False)

        def forward(self, ids, cos, sin, labels):
            x = npu_liger.embedding(self.embed.weight, ids) if use_npu_liger else self.embed(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.view(-1, args.vocab).float(), labels.view(-1))

    torch.manual_seed(0)
    with torch.device(device):
        return Model()


def shard(model, args):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = getattr(torch, args.dtype)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model.layers:
        if args.compile:
            layer.compile(backend=args.compile_backend)  # in place: fully_shard wraps the module itself
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def rotary_tables(args, device):
    import torch

    head_dim = args.dim // args.heads
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(args.seq, device=device).float(), inv_freq)
    emb = torch.cat([angles, angles], -1)[None]
    dtype = getattr(torch, args.dtype)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def run(args, use_npu_liger: bool, device):
    import torch
    import torch.distributed as dist

    model = shard(build_model(args, use_npu_liger, device), args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.device == "cuda")
    cos, sin = rotary_tables(args, device)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "npu":
            torch.npu.synchronize()

    def step():
        loss = model(ids, cos, sin, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    dist.barrier()
    elapsed = time.perf_counter() - start
    tokens = args.steps * args.batch * args.seq * dist.get_world_size()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return tokens / elapsed, elapsed / args.steps, loss.item(), peak


def main():
    args = parse_args()
    device = setup(args)
    import torch.distributed as dist

    results = {}
    for name, flag in (("torch", False), ("npu_liger", True)):
        results[name] = run(args, flag, device)
        if dist.get_rank() == 0:
            tps, step_s, loss, peak = results[name]
            print(f"{name:>10}: {tps:12,.0f} tokens/s  {step_s * 1e3:9.2f} ms/step  loss {loss:.4f}  "
                  f"peak mem {peak:.2f} GiB/rank", flush=True)
    if dist.get_rank() == 0:
        print(f"npu_liger / torch throughput: {results['npu_liger'][0] / results['torch'][0]:.3f}x  "
              f"({dist.get_world_size()} ranks, {args.layers} layers, dim {args.dim}, seq {args.seq}, "
              f"batch {args.batch}/rank, {args.dtype}{', compiled' if args.compile else ''})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
