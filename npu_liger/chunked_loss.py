"""Liger-Kernel's ``liger_kernel.chunked_loss`` preference-loss names, so TRL code switches by changing an import::

    from npu_liger.chunked_loss import LigerFusedLinearDPOLoss   # was: from liger_kernel.chunked_loss import ...

Each name is the npu_liger.nn module itself (``LigerFusedLinearDPOLoss is npu_liger.nn.FusedLinearDPOLoss``), with
Liger's constructor arguments, forward signature and ``(loss, metrics)`` return (docs/SWITCHING.md lists the
differences: DPO's loss_type is "sigmoid" only, ORPO's nll_target is not supported, GRPO computes the loss types
grpo, bnpo, dr_grpo and dapo at token level only, chunk_size and compiled are accepted and ignored)."""

from .nn.preference import FusedLinearCPOLoss as LigerFusedLinearCPOLoss
from .nn.preference import FusedLinearDPOLoss as LigerFusedLinearDPOLoss
from .nn.preference import FusedLinearGRPOLoss as LigerFusedLinearGRPOLoss
from .nn.preference import FusedLinearKTOLoss as LigerFusedLinearKTOLoss
from .nn.preference import FusedLinearORPOLoss as LigerFusedLinearORPOLoss
from .nn.preference import FusedLinearSimPOLoss as LigerFusedLinearSimPOLoss

__all__ = ["LigerFusedLinearCPOLoss", "LigerFusedLinearDPOLoss", "LigerFusedLinearGRPOLoss",
           "LigerFusedLinearKTOLoss", "LigerFusedLinearORPOLoss", "LigerFusedLinearSimPOLoss"]
