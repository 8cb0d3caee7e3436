"""The bookkeeping behind every patch: originals are remembered the first time something is replaced, so
patching twice is harmless and every change can be undone.

Two kinds of change:
- attributes of modules and classes (a modeling file's ``apply_rotary_pos_emb``, a model class's
  ``__init__``): ``set_attr`` / ``restore_attr``, originals kept in ``_ORIGINALS``;
- attributes of one ``nn.Module`` instance (its ``forward``): ``set_instance_attr`` /
  ``restore_instance``, originals kept on the instance itself, patched instances tracked in a WeakSet so
  that ``restore_everything`` can find them without keeping models alive.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Optional, Tuple


class _Missing:
    """"There was no such attribute". Pickled by reference (patched models pickle, save/load and deepcopy with
    their originals), so ``is _MISSING`` still holds after a round trip."""

    def __reduce__(self):
        return "_MISSING"

    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()
_INSTANCE_ORIGINALS = "_npu_liger_originals"

# (id of owner, attribute name) -> (owner, original value or _MISSING)
_ORIGINALS: Dict[Tuple[int, str], Tuple[Any, Any]] = {}
_PATCHED_INSTANCES: "weakref.WeakSet" = weakref.WeakSet()


def set_attr(owner: Any, name: str, value: Any) -> None:
    """``setattr(owner, name, value)``, remembering the original on the first call only."""
    key = (id(owner), name)
    if key not in _ORIGINALS:
        _ORIGINALS[key] = (owner, vars(owner).get(name, _MISSING))
    setattr(owner, name, value)


def original_attr(owner: Any, name: str) -> Any:
    """The value ``owner.name`` had before npu_liger patched it (the current value if never patched)."""
    entry = _ORIGINALS.get((id(owner), name))
    return getattr(owner, name) if entry is None else entry[1]


def is_attr_patched(owner: Any, name: str) -> bool:
    return (id(owner), name) in _ORIGINALS


def restore_attr(owner: Any, name: str) -> bool:
    """Put back the original of ``owner.name``; returns whether anything was patched."""
    entry = _ORIGINALS.pop((id(owner), name), None)
    if entry is None:
        return False
    _, original = entry
    if original is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, original)
    return True


def set_instance_attr(module: Any, name: str, value: Any) -> None:
    """Set an attribute on one module instance (shadowing its class's), remembering the original."""
    originals = module.__dict__.setdefault(_INSTANCE_ORIGINALS, {})
    if name not in originals:
        originals[name] = module.__dict__.get(name, _MISSING)
    module.__dict__[name] = value
    _PATCHED_INSTANCES.add(module)


def instance_patches(module: Any) -> Dict[str, Any]:
    return module.__dict__.get(_INSTANCE_ORIGINALS, {})


def restore_instance(module: Any) -> bool:
    """Undo every ``set_instance_attr`` on ``module``; returns whether anything was patched."""
    originals = module.__dict__.pop(_INSTANCE_ORIGINALS, None)
    if not originals:
        return False
    for name, original in originals.items():
        if original is _MISSING:
            module.__dict__.pop(name, None)
        else:
            module.__dict__[name] = original
    _PATCHED_INSTANCES.discard(module)
    return True


def restore_everything() -> int:
    """Undo every patch this package made, globally and on every live instance; returns how many."""
    count = 0
    for module in list(_PATCHED_INSTANCES):
        count += restore_instance(module)
    for owner_id, name in list(_ORIGINALS):
        owner = _ORIGINALS[(owner_id, name)][0]
        count += restore_attr(owner, name)
    return count


# With the ``kernels`` package installed (a dependency of transformers from 5.25 on; before, only where a user
# installed it), transformers' ``@use_kernel_forward_from_hub`` turns a modeling module's function into an instance
# of a ``kernels`` ``Func`` module (an ``nn.Module`` calling the function), and ``@use_kernelized_func`` gives each
# attention layer its own copy, which unpickles as ``type(<modeling module>.<name>)()``. That object must stay where
# it is (a plain function in its place breaks unpickling and ``torch.load`` of every such model): its ``forward`` is
# patched instead, on the instance, as ``kernels.kernelize`` does.
def is_hub_function(value: Any) -> bool:
    """``value`` is a function made a ``kernels`` ``Func`` module (a module instance whose class names a hub
    kernel layer)."""
    import torch.nn

    return isinstance(value, torch.nn.Module) and hasattr(type(value), "kernel_layer_name")


def wrapped_function(value: Any) -> Optional[Any]:
    """The plain function a ``kernels`` ``Func`` module calls (the ``func`` its class's ``forward`` closes over);
    None where it cannot be found."""
    import inspect

    try:
        function = inspect.getclosurevars(type(value).forward).nonlocals.get("func")
    except (TypeError, AttributeError):
        return None
    return function if inspect.isfunction(function) else None


def set_function(module: Any, name: str, function: Any) -> None:
    """Make calls of ``module.name`` run ``function``: ``set_attr``, or for a hub ``Func`` module its ``forward``."""
    current = getattr(module, name)
    if is_hub_function(current):
        set_instance_attr(current, "forward", function)
    else:
        set_attr(module, name, function)


def called_function(module: Any, name: str) -> Any:
    """What a call of ``module.name`` runs now: the attribute, or a hub ``Func`` module's own ``forward`` (itself
    where that is not patched)."""
    current = getattr(module, name, None)
    return current.__dict__.get("forward", current) if is_hub_function(current) else current


def is_function_patched(module: Any, name: str) -> bool:
    current = getattr(module, name, None)
    if is_hub_function(current):
        return "forward" in instance_patches(current)
    return is_attr_patched(module, name)


def restore_function(module: Any, name: str) -> bool:
    """Undo ``set_function``; returns whether anything was patched."""
    current = getattr(module, name, None)
    if is_hub_function(current):
        return restore_instance(current)
    return restore_attr(module, name)
