"""Causal attention without a mask tensor under torch.compile.

In eager mode, a training batch without padding (``attention_mask=None``) and without explicit ``position_ids``
reaches SDPA as ``attn_mask=None, is_causal=True``: its causal flash kernel. While torch.compile traces, transformers
builds a dense (B, 1, S, S) boolean mask instead, for two reasons, and SDPA then runs its masked kernel over the
whole square. On one H200 (BENCHMARKS round twelve) the attention kernels of a Llama-style step took 14 ms
compiled against 5 ms eager.

1. ``masking_utils.find_packed_sequence_indices`` looks for several sequences packed into one row (positions that
   restart). Its test reads tensor values, so while tracing it assumes packing and returns the sequence ids: a mask
   is needed. When the decoder model was called without ``position_ids`` it made them itself as one ``arange`` per
   row: nothing is packed. ``patch_default_positions`` marks those calls (a per-instance wrapper of the decoder
   model's forward), and inside them the wrapped function answers "not packed", as it would in eager mode (and
   without eager mode's host synchronisation on ``.all()``).
2. ``masking_utils._ignore_causal_mask_sdpa`` refuses the skip whenever Dynamo traces in transformers 5.17, and on
   torch < 2.14 in later versions (their compile-vs-export test needs pytorch#176499). The wrapper gives the eager
   answer while torch.compile (not torch.export) traces with no padding mask and an int ``q_offset``.

The refusal exists for ``torch.export``: an exported graph would keep ``is_causal=True`` for every later input, so
under export both wrappers defer to transformers. Explicit ``position_ids``, padding masks and sliding windows also
keep transformers' answer. The mask that is skipped is the is_causal square itself, so only the kernel changes, not
the result. The two function wrappers are process-wide (``masking_utils`` serves every model), like the rotary patch.
"""

from __future__ import annotations

import functools
import inspect

import torch

from . import _patching, report

_NAME = "_ignore_causal_mask_sdpa"
_PACKED = "find_packed_sequence_indices"
_WHAT = f"transformers.masking_utils.{_NAME}"
# the mask builders a decoder model's forward calls; a module whose forward calls one gets the default-positions mark
_MASK_BUILDERS = {"create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask",
                  "create_masks_for_generate"}


class _DefaultPositions:
    """How many decoder-model calls without ``position_ids`` are running (a plain object: Dynamo traces its
    attribute updates)."""

    depth = 0


_DEFAULT_POSITIONS = _DefaultPositions()


def _masking_utils():
    try:
        from transformers import masking_utils
    except ImportError:  # transformers < 4.53 builds its masks elsewhere
        return None
    return masking_utils if callable(getattr(masking_utils, _NAME, None)) else None


def _exporting() -> bool:
    """torch.export is running. ``torch.compiler.is_exporting()`` reads as True under Dynamo before torch 2.14,
    so the flag it returns is read directly; a torch without it counts as exporting (transformers' answer)."""
    return getattr(torch.compiler, "_is_exporting_flag", True)


def _compiling_skip(original):
    """transformers' ``_ignore_causal_mask_sdpa`` with the eager answer while torch.compile traces."""
    names = list(inspect.signature(original).parameters)
    q_length_name = "q_length" if "q_length" in names else "query_length"

    @functools.wraps(original)
    def ignore_causal_mask_sdpa(*args, **kwargs):
        given = dict(zip(names, args), **kwargs)
        q_offset = given.get("q_offset", 0)
        if (given.get("padding_mask") is None and isinstance(q_offset, int) and torch.compiler.is_compiling()
                and not _exporting()):
            q_length, kv_length = given[q_length_name], given["kv_length"]
            local = given.get("local_attention_size")
            if local is not None and kv_length >= local:  # a sliding window needs its mask
                return False
            return q_length == 1 or kv_length == q_length or q_offset == 0
        return original(*args, **kwargs)

    ignore_causal_mask_sdpa._npu_liger_wraps = original
    return ignore_causal_mask_sdpa


def _unpacked_with_default_positions(original):
    """transformers' ``find_packed_sequence_indices``, answering "not packed" (None) inside a decoder-model call
    that made its own positions."""

    @functools.wraps(original)
    def find_packed_sequence_indices(*args, **kwargs):
        if _DEFAULT_POSITIONS.depth > 0:
            return None
        return original(*args, **kwargs)

    find_packed_sequence_indices._npu_liger_wraps = original
    return find_packed_sequence_indices


def _wrap_once(module, name: str, wrapper) -> None:
    current = getattr(module, name)
    if not hasattr(current, "_npu_liger_wraps"):
        _patching.set_attr(module, name, wrapper(current))


def patch_causal_mask() -> bool:
    """Install the wrapper (once); returns whether it is in place. Not installed (and reported as left) when
    transformers has no ``masking_utils`` of the form above."""
    module = _masking_utils()
    if module is None:
        report.leave("attention", _WHAT, "not found (transformers without masking_utils)", warn=False)
        return False
    names = inspect.signature(inspect.unwrap(getattr(module, _NAME))).parameters
    if "padding_mask" not in names or "kv_length" not in names:
        report.leave("attention", _WHAT, "its signature is not the one npu_liger knows", warn=False)
        return False
    _wrap_once(module, _NAME, _compiling_skip)
    report.patched("attention", _WHAT, "is_causal under torch.compile")
    if callable(getattr(module, _PACKED, None)):
        _wrap_once(module, _PACKED, _unpacked_with_default_positions)
        report.patched("attention", f"transformers.masking_utils.{_PACKED}", "not packed with default positions")
    return True


def restore_causal_mask() -> None:
    module = _masking_utils()
    if module is not None:
        _patching.restore_attr(module, _NAME)
        _patching.restore_attr(module, _PACKED)


def _builds_masks(module) -> bool:
    forward = inspect.unwrap(getattr(type(module), "forward", None) or (lambda: None))
    code = getattr(forward, "__code__", None)
    return code is not None and not _MASK_BUILDERS.isdisjoint(code.co_names)


def _forward_marking_default_positions(module, position_slot: int, *args, **kwargs):
    """The decoder model's own forward (its class's), inside the default-positions mark when the call gives no
    ``position_ids`` (by keyword or at its place ``position_slot`` among the positional arguments)."""
    forward = type(module).forward
    if kwargs.get("position_ids") is not None or len(args) > position_slot:
        return forward(module, *args, **kwargs)
    _DEFAULT_POSITIONS.depth += 1
    try:
        return forward(module, *args, **kwargs)
    finally:
        _DEFAULT_POSITIONS.depth -= 1


def patch_default_positions(root) -> int:
    """Mark the calls without ``position_ids`` of every decoder model in ``root`` (modules whose forward builds
    a causal mask and takes ``position_ids``); returns how many were marked. The instance's forward is a
    ``functools.partial`` of a module-level function, so the model still pickles and deep-copies (a copy's
    forward runs the copy)."""
    count = 0
    for module in root.modules():
        if "forward" in _patching.instance_patches(module) or not _builds_masks(module):
            continue
        names = list(inspect.signature(module.forward).parameters)
        if "position_ids" not in names:
            continue
        forward = functools.partial(_forward_marking_default_positions, module, names.index("position_ids"))
        _patching.set_instance_attr(module, "forward", forward)
        report.patched("attention", type(module).__name__, "default positions: not packed")
        count += 1
    return count


def causal_mask_patched() -> bool:
    module = _masking_utils()
    return module is not None and hasattr(getattr(module, _NAME), "_npu_liger_wraps")
