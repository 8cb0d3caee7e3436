"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding), one file per op."""

from .cross_entropy import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .embedding import Embedding
from .geglu import GEGLUMLP
from .moe import Experts
from .norm import LayerNorm, RMSNorm
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "Embedding", "Experts", "FusedLinearCrossEntropyLoss", "GEGLUMLP", "LayerNorm",
           "RMSNorm",
           "SwiGLUMLP", "TVDLoss"]
