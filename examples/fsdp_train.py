"""Train a small Llama-style (or, with ``--family qwen3_moe``, Qwen3-MoE-style) Hugging Face model with FSDP2 on
several processes, its MLPs (experts) and rotary embeddings running npu_liger's ops.

    torchrun --nproc-per-node 2 examples/fsdp_train.py --device cpu   # CPU: gloo + the Triton interpreter
    torchrun --nproc-per-node 2 examples/fsdp_train.py                # GPUs (NCCL) or Ascend NPUs (HCCL)

Every rank builds the same model (same seed), patches it with ``npu_liger.transformers.apply_to_model``, then
shards it with ``fully_shard`` (each decoder layer, then the whole model). Each rank trains on its own
synthetic sequences (tokens counting up from a random start, so there is something to learn); rank 0 prints the
loss averaged over ranks after every step. Exits non-zero if the loss did not go down.
"""

import argparse
import gc
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), default=None,
                   help="default: an NPU if torch_npu is installed, else a GPU if present, else the CPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--family", choices=("llama", "qwen3_moe"), default="llama",
                   help="qwen3_moe: a Qwen3-MoE-style model (every layer 4 experts, top-2: npu_liger.fused_moe)")
    return p.parse_args()


def pick_device(requested):
    if requested is not None:
        return requested
    try:
        import torch_npu  # noqa: F401

        return "npu"
    except ImportError:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def main():
    args = parse_args()
    device_type = pick_device(args.device)
    if device_type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (by npu_liger)
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    import npu_liger.transformers as nlt

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    elif device_type == "npu":
        torch.npu.set_device(local_rank)
    dist.init_process_group({"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[device_type])
    device = torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")

    # A model small enough for the CPU interpreter: 2 layers, 4 query / 2 key-value heads of 16, vocab 32.
    shape = dict(vocab_size=32, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=64, use_cache=False)
    if args.family == "qwen3_moe":  # the same, its MLPs 4 experts of 48 (2 per token)
        config, model_cls = Qwen3MoeConfig(**shape, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                                           decoder_sparse_step=1, norm_topk_prob=True), Qwen3MoeForCausalLM
    else:
        config, model_cls = LlamaConfig(**shape), LlamaForCausalLM
    torch.manual_seed(0)  # the same initial weights on every rank
    with torch.device(device):
        model = model_cls(config)
    nlt.apply_to_model(model)  # gated MLPs -> npu_liger.swiglu (experts: fused_moe), rotary -> npu_liger.rope
    if rank == 0:
        print(f"{dist.get_world_size()} ranks on {device_type}; npu_liger patches: {nlt.patch_summary(model)}")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    batch, seq, vocab = 4, 16, config.vocab_size
    losses = []
    for step in range(args.steps):
        starts = torch.randint(0, vocab, (batch, 1), generator=g)
        ids = ((starts + torch.arange(seq)) % vocab).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
        if rank == 0:
            print(f"step {step + 1:3d}  loss {losses[-1]:.4f}", flush=True)
    # Free what holds the process group (FSDP2's state on the model, the optimizer's sharded tensors) while it
    # is alive: left to interpreter exit, their teardown aborted gloo ranks now and then ("terminate called
    # without an active exception" after the last step, 4 of 10 CPU runs).
    del model, opt, loss
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if len(losses) > 1 and not losses[-1] < losses[0]:
        if rank == 0:
            print(f"the loss did not go down: {losses[0]:.4f} -> {losses[-1]:.4f}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
