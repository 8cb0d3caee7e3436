"""How PyTorch sees the kernels: one file per op (or per family of ops), each defining ``torch.ops.npu_liger.<op>``
(and its ``<op>_backward``), its DTensor sharding rule and its public function (named in the file's ``__all__``,
re-exported by ``npu_liger``).

Every module here whose name does not start with ``_`` is imported (and so its ops defined) when the package is,
in name order: adding an op's file is all it takes here. ``PUBLIC`` maps each public function's name to it.
The public functions are not bound as attributes here, where they would shadow their modules.
"""

import importlib
import pkgutil

OP_MODULES = tuple(importlib.import_module(f"{__name__}.{info.name}")
                   for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
                   if not info.name.startswith("_"))
PUBLIC = {name: getattr(module, name) for module in OP_MODULES for name in module.__all__}
