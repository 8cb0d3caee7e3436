"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding, norms, softmax, sparsemax), one file per op."""

from .cross_entropy import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .embedding import Embedding
from .geglu import GEGLUMLP
from .moe import Experts
from .norm import LayerNorm, RMSNorm
from .softmax import Softmax
from .sparsemax import Sparsemax
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "Embedding", "Experts", "FusedLinearCrossEntropyLoss", "GEGLUMLP", "LayerNorm",
           "RMSNorm", "Softmax", "Sparsemax", "SwiGLUMLP", "TVDLoss"]
