"""npu-liger: Liger-Kernel's Ascend-NPU Triton kernels as first-class PyTorch operators.

Importing the package defines ``torch.ops.npu_liger.*`` (eager, autograd, ``torch.compile(fullgraph=True)``)
and exposes the functional API (``npu_liger.geglu(a, b)``, ...). Nothing here touches a device driver.
"""

from ._install import require_triton

require_triton()  # before any kernel file: a missing triton gets an ImportError naming the extra to install

from . import nn, registrations, tiling  # noqa: E402
# The public functions, one line per op (registrations.PUBLIC lists them; a test checks the two agree).
from .registrations.cross_entropy import cross_entropy  # noqa: E402
from .registrations.dyt import dyt  # noqa: E402
from .registrations.embedding import embedding  # noqa: E402
from .registrations.fused_linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402
from .registrations.fused_linear_jsd import fused_linear_jsd  # noqa: E402
from .registrations.fused_linear_cpo import fused_linear_cpo  # noqa: E402
from .registrations.fused_linear_dpo import fused_linear_dpo  # noqa: E402
from .registrations.fused_linear_kto import fused_linear_kto  # noqa: E402
from .registrations.fused_linear_grpo import fused_linear_grpo  # noqa: E402
from .registrations.fused_linear_orpo import fused_linear_orpo  # noqa: E402
from .registrations.fused_linear_simpo import fused_linear_simpo  # noqa: E402
from .registrations.fused_moe import fused_moe  # noqa: E402
from .registrations.geglu import geglu  # noqa: E402
from .registrations.grpo_loss import grpo_loss  # noqa: E402
from .registrations.group_norm import group_norm  # noqa: E402
from .registrations.jsd import jsd  # noqa: E402
from .registrations.kl_div import kl_div  # noqa: E402
from .registrations.layer_norm import layer_norm  # noqa: E402
from .registrations.llama4_rope import llama4_rope  # noqa: E402
from .registrations.poly_norm import poly_norm  # noqa: E402
from .registrations.qwen2vl_mrope import qwen2vl_mrope  # noqa: E402
from .registrations.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from .registrations.rope import rope  # noqa: E402
from .registrations.softmax import softmax  # noqa: E402
from .registrations.sparsemax import sparsemax  # noqa: E402
from .registrations.swiglu import swiglu  # noqa: E402
from .registrations.tvd import tvd  # noqa: E402
from .registrations._loss import CrossEntropyOutput  # noqa: E402  (the losses' result with statistics)

__version__ = "0.1.0"
# Each public function once (one line per op above); the list is the registrations' own.
__all__ = ["__version__", "CrossEntropyOutput", "nn", "registrations", "tiling", *sorted(registrations.PUBLIC)]
