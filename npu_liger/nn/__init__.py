"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding, norms, softmax, sparsemax), one file per op."""

from .cross_entropy import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .dyt import DyT
from .embedding import Embedding
from .geglu import GEGLUMLP
from .group_norm import GroupNorm
from .moe import Experts
from .norm import LayerNorm, RMSNorm
from .poly_norm import PolyNorm
from .softmax import Softmax
from .sparsemax import Sparsemax
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "DyT", "Embedding", "Experts", "FusedLinearCrossEntropyLoss", "GEGLUMLP", "GroupNorm",
           "LayerNorm", "PolyNorm", "RMSNorm", "Softmax", "Sparsemax", "SwiGLUMLP", "TVDLoss"]
