"""Causal attention without a mask tensor under torch.compile.

In eager mode transformers asks ``masking_utils._ignore_causal_mask_sdpa`` whether a causal mask may be left out.
With no padding mask (``attention_mask=None``: packed or unpadded training batches) and q_len == kv_len the answer
is yes: SDPA then gets ``attn_mask=None, is_causal=True`` and runs its causal flash kernel. While torch.compile
traces, transformers 5.17 answers no (``is_tracing(None)`` is True under Dynamo), and later versions answer no
on torch < 2.14 as well (their compile-vs-export test needs pytorch#176499). The compiled model then builds a
dense (B, 1, S, S) mask and SDPA runs its masked kernel over the whole square: on one H200 (benchmarks round
twelve) the attention kernels of a Llama-style step took 14 ms compiled against 4.8 ms eager.

The refusal exists for ``torch.export``: an exported graph would keep ``is_causal=True`` for every later input.
``patch_causal_mask`` wraps the function so that while torch.compile (not export) traces, with no padding mask
and an int ``q_offset``, it answers as transformers does in eager mode; every other call goes to transformers'
function unchanged. The results are the same mask either way (the is_causal square), so this changes only which
kernel computes them. It is process-wide, like the rotary patch: ``masking_utils`` serves every model.
"""

from __future__ import annotations

import functools
import inspect

import torch

from . import _patching, report

_NAME = "_ignore_causal_mask_sdpa"
_WHAT = f"transformers.masking_utils.{_NAME}"


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


def patch_causal_mask() -> bool:
    """Install the wrapper (once); returns whether it is in place. Not installed (and reported as left) when
    transformers has no ``masking_utils`` of the form above."""
    module = _masking_utils()
    if module is None:
        report.leave("attention", _WHAT, "not found (transformers without masking_utils)", warn=False)
        return False
    current = getattr(module, _NAME)
    if not hasattr(current, "_npu_liger_wraps"):
        names = inspect.signature(current).parameters
        if "padding_mask" not in names or "kv_length" not in names:
            report.leave("attention", _WHAT, "its signature is not the one npu_liger knows", warn=False)
            return False
        _patching.set_attr(module, _NAME, _compiling_skip(current))
    report.patched("attention", _WHAT, "is_causal under torch.compile")
    return True


def restore_causal_mask() -> None:
    module = _masking_utils()
    if module is not None:
        _patching.restore_attr(module, _NAME)


def causal_mask_patched() -> bool:
    module = _masking_utils()
    return module is not None and hasattr(getattr(module, _NAME), "_npu_liger_wraps")
