"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding, norms, softmax, sparsemax), one file per op."""

from .cross_entropy import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .dyt import DyT
from .embedding import Embedding
from .geglu import GEGLUMLP
from .group_norm import GroupNorm
from .grpo_loss import GRPOLoss
from .jsd import JSD, FusedLinearJSD
from .kl_div import KLDivLoss
from .moe import Experts
from .norm import LayerNorm, RMSNorm
from .poly_norm import PolyNorm
from .preference import FusedLinearCPOLoss, FusedLinearDPOLoss, FusedLinearGRPOLoss, FusedLinearKTOLoss, \
    FusedLinearORPOLoss, FusedLinearSimPOLoss
from .softmax import Softmax
from .sparsemax import Sparsemax
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["CrossEntropyLoss", "DyT", "Embedding", "Experts", "FusedLinearCPOLoss", "FusedLinearCrossEntropyLoss",
           "FusedLinearDPOLoss", "FusedLinearGRPOLoss", "FusedLinearJSD", "FusedLinearKTOLoss", "FusedLinearORPOLoss",
           "FusedLinearSimPOLoss", "GEGLUMLP", "GRPOLoss", "GroupNorm", "JSD", "KLDivLoss", "LayerNorm", "PolyNorm",
           "RMSNorm", "Softmax", "Sparsemax", "SwiGLUMLP", "TVDLoss"]
