"""``nn.Module`` wrappers around the ops (MLPs, losses, embedding). One file per op; each file's ``__all__``
is re-exported here."""

import importlib
import pkgutil

__all__ = []
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    _loaded = importlib.import_module(f"{__name__}.{_module}")
    for _name in getattr(_loaded, "__all__", ()):
        globals()[_name] = getattr(_loaded, _name)
        __all__.append(_name)
