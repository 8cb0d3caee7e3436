"""How PyTorch sees the kernels: one file per op, each defining ``torch.ops.npu_liger.<op>`` (and its
``<op>_backward``) and its public function (named in the file's ``__all__``, re-exported by ``npu_liger``).

Adding an op: add its file and one import line here (and its public function to ``npu_liger/__init__.py``).
The public functions are not bound here, where they would shadow their modules.
"""

from . import (cross_entropy, embedding, fused_linear_cross_entropy, geglu, layer_norm,  # noqa: F401  (defines the ops)
               llama4_rope, qwen2vl_mrope, rms_norm, rope, swiglu, tvd)
from . import fused_linear_jsd, grpo_loss, jsd, kl_div  # noqa: F401,E402  (the distillation and RL losses)
from . import _sharding  # noqa: F401,E402  (DTensor sharding rules, once every op above is defined)
