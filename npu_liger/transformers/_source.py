"""Reading transformers' source, to decide whether a patch computes what the original does.

Two checks, used throughout ``npu_liger.transformers``:
- ``squeezed(obj)``: the source with all whitespace removed, for the fragment checks of the classes and functions
  the family table names (``"(q*cos)+(rotate_half(q)*sin)" in squeezed(fn)``);
- ``canonical(obj)``: the code itself, for recognising a module or function of a family the table does not know
  (a copy of a known one under another name): the abstract syntax tree of its body, without docstring,
  decorators, annotations or comments, its parameters renamed by position. Two functions with the same canonical
  form compute the same thing from the same attributes (``self.weight``, ``self.variance_epsilon``, ...), so a
  patch verified on one applies to the other.

Both read a function that transformers made a ``kernels`` ``Func`` module (``_patching.is_hub_function``) as the
function it wraps.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Optional

from ._patching import is_hub_function, wrapped_function


def _text(obj) -> Optional[str]:
    if is_hub_function(obj):  # a function transformers made a kernels Func module: its code is the function's
        obj = wrapped_function(obj)
        if obj is None:
            return ""  # not found: code of no known form (no fragment matches, no canonical form), not "no source"
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None  # no source to check (e.g. a frozen install)


def squeezed(obj) -> Optional[str]:
    text = _text(obj)
    return None if text is None else "".join(text.split())


class _Rename(ast.NodeTransformer):
    def __init__(self, params):
        self.params = {name: f"_p{i}" for i, name in enumerate(params)}

    def visit_Name(self, node):
        node.id = self.params.get(node.id, node.id)
        return node

    def visit_arg(self, node):  # a lambda's or nested function's parameters
        node.annotation = None
        return node


def _canonical(obj) -> Optional[str]:
    text = _text(getattr(obj, "__func__", obj))
    if text is None:
        return None
    try:
        node = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    args = node.args
    params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    rename = _Rename(params)
    return ast.dump(ast.Module(body=[rename.visit(statement) for statement in body], type_ignores=[]))


@functools.lru_cache(maxsize=None)
def _canonical_cached(obj) -> Optional[str]:
    return _canonical(obj)


def canonical(obj) -> Optional[str]:
    """The canonical form of a function's (or method's) code; None without source."""
    try:
        return _canonical_cached(obj)
    except TypeError:  # unhashable
        return _canonical(obj)


def canonical_forward(cls: type, *helpers: str) -> Optional[str]:
    """``cls.forward``'s canonical form, with those of the named helper methods (``_norm``) it calls."""
    parts = [canonical(cls.forward)]
    parts += [canonical(getattr(cls, name)) if hasattr(cls, name) else "-" for name in helpers]
    return None if parts[0] is None else "|".join(map(str, parts))


__all__ = ["canonical", "canonical_forward", "squeezed"]


def exemplar_class(family: str, name: str):
    """transformers' class ``name`` from ``family``'s modeling module, or None where this release lacks it."""
    import importlib

    try:
        return getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), name)
    except (ImportError, AttributeError):
        return None
