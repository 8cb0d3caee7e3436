"""DTensor sharding rules: how an op's registration file declares them (``@sharding_rule(op, ...)``, beside the
op it describes) and how they reach DTensor.

A rule lists, for one mesh dimension, the placements under which running the op on the local shards gives
exactly the global result; DTensor expands them over every mesh dimension, picks the cheapest for the inputs it
gets and redistributes the inputs when none matches (so an unlisted layout is still correct, it just moves data
first). Rules go through the public ``torch.distributed.tensor.experimental.register_sharding``.

A rule is ``rule(p, *args)``: ``args`` are the op's arguments (DTensorSpecs for tensors, with ``.ndim`` and
``.shape``), ``p`` gives the placements (``p.R``, ``p.P``, ``p.S(d)``) and builds each case from the tensor
arguments by name, ``p.case(outputs, x=p.S(0), ...)``: tensor arguments not named are replicated, absent optional
tensors and non-tensor arguments get the ``None`` DTensor wants, so a rule never counts the schema's arguments.
What each op accepts is written beside its rule; docs/DISTRIBUTED.md has the whole table. FSDP2 and DDP need no
rules: FSDP2 all-gathers parameters into plain tensors before the ops run.

Version gates live in ``_dtensor_api`` only. The one thing the public API gets wrong for these ops:
``register_sharding`` keys DTensor's sharding cache on non-tensor arguments only from the first ``int``
argument on, so ``tvd``'s ``reduction`` (a str) would not be part of the key and a cached ``"none"`` layout
would be reused for ``"sum"``. ``_register`` widens the key to every non-tensor argument; where that is
impossible the ops whose result depends on such an argument get no rule (DTensor then raises
NotImplementedError instead of silently reusing a wrong layout).
"""

from __future__ import annotations

import functools
import warnings
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence

import torch

# op name -> the rule registered for it, filled only where DTensor is available (tests assert every op has one)
REGISTERED: Dict[str, Callable] = {}


@functools.lru_cache(maxsize=None)
def _dtensor_api() -> Optional[SimpleNamespace]:
    """The one version/availability gate: DTensor's placements and ``register_sharding`` (torch >= 2.6, the
    project's floor; the API and the None-for-non-tensor-argument convention are unchanged through 2.13), or None
    when torch.distributed is not built in (importing npu_liger must still work there)."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:  # torch without the public DTensor API
        return None
    try:  # private: used only to widen the cache key (see the module docstring)
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        schema_infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
        if not isinstance(schema_infos, dict):
            raise TypeError("op_to_schema_info is not a dict")
    except (ImportError, AttributeError, TypeError):
        RuntimeSchemaInfo, schema_infos = None, None
    return SimpleNamespace(register_sharding=register_sharding, Shard=Shard, Replicate=Replicate,
                           Partial=Partial, RuntimeSchemaInfo=RuntimeSchemaInfo, schema_infos=schema_infos)


def _is_tensor_argument(argument) -> bool:
    kind = argument.type.getElementType() if isinstance(argument.type, torch.OptionalType) else argument.type
    return isinstance(kind, torch.TensorType)


class Placements:
    """What a rule builds its cases with, for one call of one op (see the module docstring)."""

    def __init__(self, api, op, args: Sequence):
        self.R, self.P, self.S = api.Replicate(), api.Partial(), api.Shard
        self.op_name = op._schema.name.split("::")[-1]  # for a rule shared by several ops
        self._schema = op._schema.arguments
        self._args = list(args) + [a.default_value for a in self._schema[len(args):]]

    def arg(self, name: str):
        """The call's value of the argument ``name`` (its schema default when the call left it out)."""
        return self._args[[a.name for a in self._schema].index(name)]

    def case(self, outputs, **inputs) -> tuple:
        """(output placements, one placement per schema argument): the named tensor arguments as given, the
        other present tensors replicated, absent optional tensors and non-tensor arguments None."""
        placements = []
        for argument, value in zip(self._schema, self._args):
            if not _is_tensor_argument(argument) or value is None:
                placements.append(None)
                inputs.pop(argument.name, None)
            else:
                placements.append(inputs.pop(argument.name, self.R))
        if inputs:
            raise TypeError(f"sharding rule names arguments the schema does not have: {sorted(inputs)}")
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs], placements


def _scalar_argnums(op):
    """(index of the op's first non-tensor argument, index of its first int argument): DTensor keys its sharding
    cache on the arguments from ``register_sharding``'s choice, the first int, on; 100 means none."""
    first_scalar = first_int = 100
    for i, arg in enumerate(op._schema.arguments):
        t = arg.type.getElementType() if isinstance(arg.type, torch.OptionalType) else arg.type
        if not isinstance(t, torch.TensorType):
            first_scalar = min(first_scalar, i)
        if isinstance(t, torch.IntType):
            first_int = min(first_int, i)
    return first_scalar, first_int


def _register(op, rule: Callable[..., List[tuple]]) -> None:
    api = _dtensor_api()
    name = op._schema.name.split("::")[-1]
    if api is None or name in REGISTERED:
        return
    first_scalar, first_int = _scalar_argnums(op)
    widen = first_scalar < first_int  # e.g. tvd's reduction (a str) sits before its first int
    if widen and api.RuntimeSchemaInfo is None:
        warnings.warn(f"npu_liger: no DTensor sharding rule for {name} on this torch version "
                      "(its non-tensor arguments cannot be made part of DTensor's sharding cache key)", stacklevel=2)
        return

    def dtensor_rule(*args):
        return rule(Placements(api, op, args), *args)

    api.register_sharding(op)(dtensor_rule)
    if widen:
        api.schema_infos[op] = api.RuntimeSchemaInfo(static_argnum=first_scalar, needs_pytree=True)
    REGISTERED[name] = dtensor_rule


def sharding_rule(*ops) -> Callable:
    """Decorator: ``rule(p, *args)`` is the DTensor sharding rule of each of ``ops`` (registered at once)."""

    def decorate(rule):
        for op in ops:
            _register(op, rule)
        return rule

    return decorate


__all__ = ["Placements", "REGISTERED", "sharding_rule"]
