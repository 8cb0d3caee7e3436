"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding), one file per op."""

from .cross_entropy import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .embedding import Embedding
from .geglu import GEGLUMLP
from .grpo_loss import GRPOLoss
from .jsd import JSD, FusedLinearJSD
from .kl_div import KLDivLoss
from .norm import LayerNorm, RMSNorm
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "Embedding", "FusedLinearCrossEntropyLoss", "FusedLinearJSD", "GEGLUMLP", "GRPOLoss",
           "JSD", "KLDivLoss", "LayerNorm", "RMSNorm", "SwiGLUMLP", "TVDLoss"]
