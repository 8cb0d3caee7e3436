"""``GroupNorm``: ``torch.nn.GroupNorm`` through ``npu_liger.group_norm`` (same constructor, same state dict)."""

from __future__ import annotations

import torch
from torch import nn

from ..registrations.group_norm import group_norm

__all__ = ["GroupNorm"]


class GroupNorm(nn.GroupNorm):
    """A drop-in ``torch.nn.GroupNorm`` (a subclass: same constructor ``(num_groups, num_channels, eps=1e-5,
    affine=True, device=None, dtype=None)``, parameters, state-dict keys and ``reset_parameters``) whose forward runs
    ``npu_liger.group_norm``. ``GroupNorm.from_torch(module)`` builds one from an existing ``nn.GroupNorm``, sharing
    its parameters. (Liger-Kernel's ``LigerGroupNorm`` takes ``(num_channels, num_groups, eps=1e-6, bias=False,
    init_fn="ones")`` and always holds a bias; torch's signature is the one models are written against.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.weight, self.bias, self.num_groups, self.eps)

    @classmethod
    def from_torch(cls, module: nn.GroupNorm) -> "GroupNorm":
        """A ``GroupNorm`` with ``module``'s settings and the very same parameter tensors (no copy)."""
        if not isinstance(module, nn.GroupNorm):
            raise TypeError(f"from_torch takes a torch.nn.GroupNorm, got {type(module).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.num_groups, new.num_channels, new.eps, new.affine = (module.num_groups, module.num_channels, module.eps,
                                                                 module.affine)
        new.register_parameter("weight", module.weight)
        new.register_parameter("bias", module.bias)
        new.train(module.training)
        return new
