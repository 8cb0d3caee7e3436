"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding), one file per op."""

from .embedding import Embedding
from .geglu import GEGLUMLP
from .swiglu import SwiGLUMLP
from .tvd import TVDLoss

__all__ = ["Embedding", "GEGLUMLP", "SwiGLUMLP", "TVDLoss"]
