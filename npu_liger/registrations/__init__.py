"""How PyTorch sees the kernels: one file per op, each defining ``torch.ops.npu_liger.<op>`` (and its
``<op>_backward``) and the functional wrappers listed in its ``__all__``.

Every module in this package is imported here, so adding an op means adding a file. The functional
wrappers are collected in ``FUNCTIONAL_API`` (not bound here, where they would shadow their modules).
"""

import importlib
import pkgutil

FUNCTIONAL_API = {}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    _loaded = importlib.import_module(f"{__name__}.{_module}")
    FUNCTIONAL_API.update({name: getattr(_loaded, name) for name in getattr(_loaded, "__all__", ())})
