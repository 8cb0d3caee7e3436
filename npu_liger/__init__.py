"""npu-liger: Liger-Kernel's Ascend-NPU Triton kernels as first-class PyTorch operators.

Importing the package defines ``torch.ops.npu_liger.*`` (eager, autograd, ``torch.compile(fullgraph=True)``)
and exposes the functional API (``npu_liger.geglu(a, b)``, ...). Nothing here touches a device driver.
"""

from . import nn, registrations, tiling
from .registrations.embedding import embedding
from .registrations.geglu import geglu
from .registrations.llama4_rope import llama4_rope
from .registrations.qwen2vl_mrope import qwen2vl_mrope
from .registrations.rope import rope
from .registrations.swiglu import swiglu
from .registrations.tvd import tvd

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "embedding",
    "geglu",
    "llama4_rope",
    "nn",
    "qwen2vl_mrope",
    "registrations",
    "rope",
    "swiglu",
    "tiling",
    "tvd",
]
