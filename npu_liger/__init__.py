"""npu-liger: Liger-Kernel's Ascend-NPU Triton kernels as first-class PyTorch operators.

Importing the package defines ``torch.ops.npu_liger.*`` (eager, autograd, ``torch.compile(fullgraph=True)``)
and exposes the functional API (``npu_liger.geglu(a, b)``, ...). Nothing here touches a device driver.
"""

from ._install import require_triton

require_triton()  # before any kernel file: a missing triton gets an ImportError naming the extra to install

from . import nn, registrations, tiling  # noqa: E402
from .registrations import _sharding  # noqa: E402,F401  (DTensor sharding rules, once every op is defined)

globals().update(registrations.FUNCTIONAL_API)

__version__ = "0.1.0"
__all__ = ["nn", "tiling", "__version__", *sorted(registrations.FUNCTIONAL_API)]
