"""The training loss of causal-LM models through ``npu_liger.fused_linear_cross_entropy``: the (tokens x vocab)
logits are never built.

A patched ``*ForCausalLM`` (per instance) runs, in training mode with ``labels``::

    outputs = self.model(...)                                  # exactly the arguments the original passes
    hidden  = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
    loss    = fused_linear_cross_entropy(hidden, lm_head.weight, shifted labels, lm_head.bias,
                                         softcap=config.final_logit_softcapping (Gemma-2/3), reduction=...)

which is HF's ``ForCausalLMLoss``: labels padded with ignore_index and shifted by one (or ``shift_labels`` as
given), ``mean`` over valid tokens, or ``sum / num_items_in_batch`` when the Trainer passes that count (gradient
accumulation). The output is the class the original returns, with ``logits=None``: a training step with labels
never needs them (Liger's ``skip_logits``). ``skip_logits=False`` in the call asks for them: the original
forward then runs unchanged. Eval mode, calls without labels, and models whose ``loss_function`` is not
``ForCausalLMLoss`` also run the original forward.

Reading ``lm_head.weight`` is ``lm_head(hidden)`` only for a plain ``nn.Linear`` that no hook observes
(``nn._gated_mlp.plain_linear``), decided at every call: an lm_head wrapped after patching (PEFT's LoRA, a
subclass, a forward hook, an ``nn.Sequential``) is called instead, its logits (softcapped as HF does) go to
``npu_liger.cross_entropy`` in float32 with the same reduction, and the output carries them.

``return_dict``: as transformers' ``can_return_tuple`` decides (the call's ``return_dict``, else
``config.return_dict``). A tuple runs the original forward: without logits, ``to_tuple()`` would move every later
field up one place (``loss, logits = out[:2]`` would silently get the cache).

MoE causal LMs (Mixtral, Qwen2/3-MoE, OLMoE, PhiMoE, ...) add the router's load-balancing loss: with
``output_router_logits`` (the call's, else the config's) the patched forward asks the model for the router logits,
computes ``aux_loss`` with the modeling file's own ``load_balancing_loss_func`` and the same attributes the original
reads (``self.num_experts``, or ``self.config.text_config.num_experts`` for Qwen3-VL-MoE), adds
``router_aux_loss_coef * aux_loss`` to the fused loss and returns ``aux_loss`` in the output, as the original does.

Only forwards whose source has the shape above are patched (a transformers release that changed it is left
alone, with a warning).
"""

from __future__ import annotations

import functools
import inspect
import re
import warnings
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..nn._gated_mlp import plain_linear
from . import _patching, report
from .families import FAMILIES, FAMILY_BY_MODULE
from .modules import _patch_forward, patched_function

# The causal-LM classes of each family whose training loss is patched.
CAUSAL_LM_CLASSES = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "gemma": ("GemmaForCausalLM",),
    "gemma2": ("Gemma2ForCausalLM",),
    "gemma3": ("Gemma3ForCausalLM",),
    "qwen2_vl": ("Qwen2VLForConditionalGeneration",),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration",),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration",),
    "llama4": ("Llama4ForCausalLM",),
}
# Fragments (whitespace removed) the original forward must contain for the patched one to be equivalent.
# (A tuple: any one of its forms; transformers 5.17 slices inline, 5.24 through slice_logits_to_keep.)
# can_return_tuple: the patched forward reproduces its return_dict rule (_return_dict).
_REQUIRED = ("@can_return_tuple", "=self.model(",
             ("hidden_states=slice_logits_to_keep(hidden_states,logits_to_keep)",
              "slice_indices=slice(-logits_to_keep,None)ifisinstance(logits_to_keep,int)elselogits_to_keep"),
             ("logits=self.lm_head(hidden_states)", "logits=self.lm_head(hidden_states[:,slice_indices,:])"),
             "self.loss_function(")


def _keep_positions(hidden, logits_to_keep):
    """transformers' ``logits_to_keep`` slicing: an int keeps the last n positions (0: all), a tensor indexes."""
    index = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, index, :]
_SOFTCAP = ("logits=logits/self.config.final_logit_softcapping", "logits=torch.tanh(logits)",
            "logits=logits*self.config.final_logit_softcapping")
_NOT_FORWARDED = {"self", "labels", "logits_to_keep", "kwargs"}


class _RouterLoss(NamedTuple):
    """An MoE causal LM's auxiliary loss, as its forward computes it: ``aux = loss_fn(outputs.router_logits,
    experts(self), top_k(self), attention_mask)`` when ``output_router_logits`` (else ``default(self)``), and
    ``loss += coef(self) * aux``. ``default`` None: the forward reads the flag from its ``**kwargs`` only
    (``kwargs.get("output_router_logits", False)``, Qwen3-VL-MoE on transformers 5.17), and so does the patch."""
    loss_fn: Callable
    experts: Callable
    top_k: Callable
    coef: Callable
    default: Optional[Callable]


class _Plan:
    """What the patched forward needs to know about one class's original forward."""

    def __init__(self, cls: type, forwarded, output_cls: type, softcap: bool, router: Optional[_RouterLoss]):
        self.cls, self.forwarded = cls, forwarded
        self.output_cls, self.softcap, self.router = output_cls, softcap, router
        self.fields = [f for f in output_cls.__dataclass_fields__ if f not in ("loss", "logits", "aux_loss")]


# The router's auxiliary loss in an MoE forward (whitespace removed): the attributes it reads are captured.
_ROUTER_DEFAULT = re.compile(r"output_router_logits=\(?output_router_logitsifoutput_router_logitsisnotNone"
                             r"elseself\.((?:\w+\.)*output_router_logits)")
_ROUTER_CALL = re.compile(r"if(output_router_logits|kwargs\.get\([\"']output_router_logits[\"'],False\)):"
                          r"aux_loss=load_balancing_loss_func\(outputs\.router_logits,"
                          r"self\.([\w.]+),self\.([\w.]+),attention_mask,?\)iflabelsisnotNone:"
                          r"loss\+=self\.([\w.]+)\*aux_loss\.to\(loss\.device\)")


def _attribute_path(path: str) -> Callable:
    """``obj.a.b`` for the dotted ``path`` "a.b", as a plain function: torch.compile traces getattr, and breaks
    the graph at ``operator.attrgetter`` (measured on torch 2.11 and 2.13)."""
    names = path.split(".")

    def read(obj):
        for name in names:
            obj = getattr(obj, name)
        return obj
    return read


def _router_loss(forward, source: str, missing: list) -> Optional[_RouterLoss]:
    """The auxiliary loss of an MoE forward (None for a forward without one); what does not match goes to
    ``missing``."""
    if "load_balancing_loss_func(" not in source:
        return None
    default, call = _ROUTER_DEFAULT.search(source), _ROUTER_CALL.search(source)
    loss_fn = getattr(inspect.getmodule(forward), "load_balancing_loss_func", None)
    from_kwargs = call is not None and call.group(1) != "output_router_logits"
    if (default is None and not from_kwargs) or call is None or loss_fn is None or "aux_loss=aux_loss" not in source:
        missing.append("the router auxiliary loss in the form npu_liger knows")
        return None
    experts, top_k, coef = (_attribute_path(path) for path in call.groups()[1:])
    return _RouterLoss(loss_fn, experts, top_k, coef, None if from_kwargs else _attribute_path(default.group(1)))


@functools.lru_cache(maxsize=None)
def _plan(cls: type) -> Optional[_Plan]:
    """A plan for ``cls.forward``, or None (with a warning) when its source is not the computation we know."""
    forward = cls.forward
    try:
        source = "".join(inspect.getsource(forward).split())
    except (OSError, TypeError):
        return _unknown(cls, "no source to check")
    signature = inspect.signature(forward)
    forwarded = [p for p in signature.parameters if p not in _NOT_FORWARDED]
    missing = [f for f in _REQUIRED if not any(form in source for form in (f if isinstance(f, tuple) else (f,)))]
    missing += [f"{p}={p}" for p in forwarded if f"{p}={p}" not in source]
    softcap = "final_logit_softcapping" in source
    if softcap:
        missing += [f for f in _SOFTCAP if f not in source]
    missing += _odd_logits(forward, softcap)
    router = _router_loss(forward, source, missing)
    match = re.search(r"return(\w+)\(loss=loss,(?:aux_loss=aux_loss,)?logits=logits,", source)
    output_cls = getattr(inspect.getmodule(forward), match.group(1), None) if match else None
    if missing or output_cls is None or not hasattr(output_cls, "__dataclass_fields__"):
        return _unknown(cls, f"missing {missing or 'a known output class'}")
    return _Plan(cls, forwarded, output_cls, softcap, router)


def _odd_logits(forward, softcap: bool) -> list:
    """Assignments to ``logits`` other than ``self.lm_head(...)`` and (``softcap``) Gemma's three softcap steps:
    a forward that scales its logits (Granite's ``logits_scaling``, Falcon-H1's ``lm_head_multiplier``) computes
    another loss than the fused one."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return ["a parsable source"]
    allowed = {"self.lm_head"}
    odd = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "logits"
                                                     for t in node.targets)):
            continue
        value = node.value
        text = ast.unparse(value)
        if isinstance(value, ast.Call) and ast.unparse(value.func) in allowed:
            continue
        if softcap and text in ("logits / self.config.final_logit_softcapping", "torch.tanh(logits)",
                                "logits * self.config.final_logit_softcapping"):
            continue
        odd.append(f"logits = {text}")
    return odd


def _unknown(cls: type, why: str) -> None:
    warnings.warn(f"npu_liger: {cls.__name__}.forward is not the computation npu_liger knows (a different "
                  f"transformers version? {why}); its loss is left unpatched", stacklevel=5)
    return None


def _is_causal_lm_loss(model: nn.Module) -> bool:
    from transformers.loss.loss_utils import ForCausalLMLoss

    return model.loss_function is ForCausalLMLoss


def causal_lm_loss(hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor, softcap: Optional[float],
                   num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
    """HF's ``ForCausalLMLoss(lm_head(hidden), labels, ...)`` (softcapped logits for Gemma-2/3): without the
    logits through ``fused_linear_cross_entropy`` where ``lm_head`` is a plain ``nn.Linear``, else from
    ``lm_head``'s own logits (``causal_lm_loss_and_logits``)."""
    return causal_lm_loss_and_logits(hidden, lm_head, labels, softcap, num_items_in_batch, ignore_index,
                                     shift_labels)[0]


def causal_lm_loss_and_logits(hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor,
                              softcap: Optional[float], num_items_in_batch=None, ignore_index: int = -100,
                              shift_labels: Optional[torch.Tensor] = None
                              ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(loss, logits)``: logits None when the fused loss ran. The choice is made per call: a hook or a wrapper
    (LoRA) may have been added to lm_head since the model was patched."""
    import npu_liger

    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "mean" if num_items_in_batch is None else "sum"
    if plain_linear(lm_head):
        x = hidden.reshape(-1, hidden.shape[-1])
        weight, bias = lm_head.weight, lm_head.bias
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else weight.dtype
        x, weight = x.to(dtype), weight.to(dtype)  # what lm_head's matmul would compute in
        bias = None if bias is None else bias.to(dtype)
        target = shift_labels.reshape(-1).to(x.device)
        logits = None
        loss = npu_liger.fused_linear_cross_entropy(x, weight, target, bias, ignore_index=ignore_index,
                                                    reduction=reduction, softcap=softcap)
    else:
        logits = lm_head(hidden)
        if softcap is not None:  # the original forward's three steps, so the returned logits are its own
            logits = logits / softcap
            logits = torch.tanh(logits)
            logits = logits * softcap
        flat = logits.float().reshape(-1, logits.shape[-1])  # ForCausalLMLoss upcasts before the loss
        target = shift_labels.reshape(-1).to(flat.device)
        loss = npu_liger.cross_entropy(flat, target, ignore_index=ignore_index, reduction=reduction)
    if num_items_in_batch is None:
        return loss, logits
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch, logits


def _return_dict(model: nn.Module, passed: Optional[bool]) -> bool:
    """transformers' ``can_return_tuple`` rule, which wraps every patched forward: the call's ``return_dict``
    unless None, else ``config.return_dict``."""
    return model.config.return_dict if passed is None else passed


_PLANS = {}  # class -> _Plan, filled when an instance is patched (the forward only looks it up: compile-friendly)


def _plan_of(cls: type) -> "_Plan":
    """The plan of ``cls`` or of the class it was derived from (FSDP2's ``fully_shard`` swaps a module's class for
    a generated subclass, e.g. ``FSDPLlamaForCausalLM``)."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = next(_PLANS[base] for base in cls.__mro__ if base in _PLANS)
        _PLANS[cls] = plan
    return plan


def _causal_lm_forward(self, input_ids=None, *args, skip_logits: Optional[bool] = None, **kwargs):
    """The patched ``*ForCausalLM.forward``: see the module docstring. Arguments after input_ids are taken by
    keyword (as the Trainer and generate pass them); positional ones go to the original forward."""
    labels = kwargs.get("labels")
    if (args or not (self.training and labels is not None) or skip_logits is False or not _is_causal_lm_loss(self)
            or not _return_dict(self, kwargs.get("return_dict"))):
        return type(self).forward(self, input_ids, *args, **kwargs)
    plan = _plan_of(type(self))
    model_kwargs = {k: v for k, v in kwargs.items() if k not in ("labels", "logits_to_keep", "return_dict")}
    if not self.config.return_dict:  # the inner model would return a tuple too; its fields are wanted by name
        model_kwargs["return_dict"] = True
    router = plan.router
    if router is not None and router.default is not None:  # the original's rule: the call's flag, else the config's
        if model_kwargs.get("output_router_logits") is None:
            model_kwargs["output_router_logits"] = router.default(self)
    outputs = self.model(input_ids=input_ids, **model_kwargs)
    hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
    hidden = _keep_positions(hidden, kwargs.get("logits_to_keep", 0))
    softcap = self.config.final_logit_softcapping if plan.softcap else None
    loss, logits = causal_lm_loss_and_logits(hidden, self.lm_head, labels, softcap, kwargs.get("num_items_in_batch"),
                                             kwargs.get("ignore_index", -100), kwargs.get("shift_labels"))
    rest = {f: getattr(outputs, f, None) for f in plan.fields}
    if router is not None:
        aux_loss = None
        if model_kwargs.get("output_router_logits", False):
            aux_loss = router.loss_fn(outputs.router_logits, router.experts(self), router.top_k(self),
                                      kwargs.get("attention_mask"))
            loss = loss + router.coef(self) * aux_loss.to(loss.device)
        rest["aux_loss"] = aux_loss
    return plan.output_cls(loss=loss, logits=logits, **rest)


def _causal_lm_classes(family) -> tuple:
    return CAUSAL_LM_CLASSES.get(family.name, family.causal_lm)


_LM_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")


def _structural_candidate(module: nn.Module) -> bool:
    """A causal LM of a family the table does not name: by its name and its ``model`` / ``lm_head`` children (its
    forward is then checked as any other, and at call time its loss function must be ``ForCausalLMLoss``)."""
    return (type(module).__name__.endswith(_LM_SUFFIXES) and isinstance(getattr(module, "lm_head", None), nn.Module)
            and isinstance(getattr(module, "model", None), nn.Module))


def patch_causal_lm_loss(module: nn.Module) -> bool:
    """Patch one model instance if it is a causal LM of a supported family, or one of another family whose forward
    is the form checked (else nothing)."""
    family = FAMILY_BY_MODULE.get(type(module).__module__)
    name = type(module).__name__
    if family is not None and name not in _causal_lm_classes(family):
        return False  # the table lists its causal LMs (the others are left, with a reason in family.left)
    if family is None and not _structural_candidate(module):
        return False
    if family is None and not _is_causal_lm_loss(module):
        report.leave("loss", name, "its loss function is not HF's ForCausalLMLoss", warn=False)
        return False
    plan = _plan(type(module))
    if plan is None:
        report.leave("loss", name, "its forward is not the causal-LM form npu_liger knows", warn=False)
        return False
    if plan.forwarded[0] != "input_ids":
        _unknown(type(module), "input_ids is not its first argument")
        report.leave("loss", name, "input_ids is not its first argument", warn=False)
        return False
    _PLANS[type(module)] = plan
    _patch_forward(module, _causal_lm_forward)
    report.patched("loss", name, "fused_linear_cross_entropy")
    return True


def patch_losses(model: nn.Module) -> int:
    """Patch every causal LM in ``model`` (itself included); returns how many."""
    return sum(patch_causal_lm_loss(m) for m in model.modules())


def loss_patched(module: nn.Module) -> bool:
    return patched_function(module) is _causal_lm_forward


def hook_family_losses(name: str, loss: bool) -> None:
    """``apply_to_family``'s part: causal LMs of the family constructed afterwards get the loss patch (or, with
    ``loss=False``, no longer do)."""
    family = FAMILIES[name]
    module = family.load()
    for cls_name in _causal_lm_classes(family):
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        if not loss:
            _patching.restore_attr(cls, "__init__")
            continue
        original = _patching.original_attr(cls, "__init__")

        def __init__(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            patch_causal_lm_loss(self)

        functools.update_wrapper(__init__, original)
        _patching.set_attr(cls, "__init__", __init__)


def unhook_family_losses(name: str) -> None:
    family = FAMILIES[name]
    module = family.load()
    for cls_name in _causal_lm_classes(family):
        cls = getattr(module, cls_name, None)
        if cls is not None:
            _patching.restore_attr(cls, "__init__")


__all__ = ["causal_lm_loss", "causal_lm_loss_and_logits", "patch_losses", "loss_patched", "CAUSAL_LM_CLASSES"]
