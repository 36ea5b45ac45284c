"""``custom_fusion``: a function with its own block-spec rules inside a fusion.

Inside a fusion, ``custom_fusion_p`` is pulled and pushed with the user's rules and
evaluated per block with the user's eval rule. Inside a Pallas kernel body (any
backend), the call is inlined: ``pallas_impl`` if given, else the function itself, so
no backend needs a rule for it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
    register_usage_rule,
)
from pallas._src.fuser.tracing import in_kernel_trace, split
from pallas._src.fuser.transforms import no_block_index_transform
from pallas._src.fuser.usage import compute_usage

custom_fusion_p = jc.Primitive("custom_fusion")
custom_fusion_p.multiple_results = True


@dataclasses.dataclass(frozen=True)
class CustomEvalContext:
    """What a custom eval rule knows: the output blocks it computes."""

    out_block_specs: tuple[Any, ...]
    out_block_indices: tuple[Any, ...]


def _definer(attr: str):
    """A ``def_*`` method of :class:`custom_fusion`: a decorator that stores the function
    it is given as the attribute ``attr`` and returns it."""
    def define(self, fn):
        setattr(self, attr, fn)
        return fn

    return define


class custom_fusion:  # noqa: N801 - upstream's name
    """Decorates a function with custom pull/push/eval rules for :func:`pull_block_spec`.

    ``def_pull_block_spec(rule)``: ``rule(out_transforms) -> in_transforms``;
    ``def_push_block_spec(rule)``: ``rule(in_specs) -> out_specs``;
    ``def_eval_rule(rule)``: ``rule(ctx, *in_blocks) -> out_blocks``;
    ``def_pallas_impl(fn)``: the implementation used inside a Pallas kernel.
    """

    def __init__(self, fun: Callable[..., Any]):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.eval_rule = None
        self.pull_block_spec_rule = None
        self.push_block_spec_rule = None
        self.pallas_impl = None

    def_pallas_impl = _definer("pallas_impl")
    def_pull_block_spec = _definer("pull_block_spec_rule")
    def_push_block_spec = _definer("push_block_spec_rule")
    def_eval_rule = _definer("eval_rule")

    def __call__(self, *args, **kwargs):
        name = getattr(self.fun, "__name__", repr(self.fun))
        missing = [what for what, rule in (("def_eval_rule", self.eval_rule),
                                           ("def_pull_block_spec", self.pull_block_spec_rule))
                   if rule is None]
        if missing:
            raise ValueError(f"custom_fusion {name} needs {' and '.join(missing)} before it "
                             "is called")
        try:
            args = jc.resolve_kwargs(self.fun, args, kwargs)
        except TypeError as e:
            raise TypeError(
                "The input arguments to the custom_fusion-decorated function "
                f"{name} could not be resolved to positional-only arguments. Binding "
                f"failed with the error:\n{e}") from e
        if in_kernel_trace():  # inside a Pallas kernel: inline, on every backend
            return (self.pallas_impl or self.fun)(*args)
        flat, in_tree = jax.tree.flatten(args)
        avals = [jc.typeof(x) for x in flat]
        jaxpr, consts, out_tree = _trace(self.fun, args, in_tree, avals, "custom_fusion fun")
        if self.pallas_impl is not None:
            pallas_jaxpr, pallas_consts, _ = _trace(self.pallas_impl, args, in_tree, avals,
                                                    "custom_fusion pallas_impl")
        else:
            pallas_jaxpr, pallas_consts = None, []
        out = custom_fusion_p.bind(
            *consts, *pallas_consts, *flat, jaxpr=jaxpr, num_consts=len(consts),
            eval_rule=self.eval_rule, pull_block_spec_rule=self.pull_block_spec_rule,
            push_block_spec_rule=self.push_block_spec_rule, pallas_jaxpr=pallas_jaxpr,
            pallas_num_consts=len(pallas_consts), in_tree=in_tree, out_tree=out_tree,
            kernel_out_tree=out_tree)
        return jax.tree.unflatten(out_tree, out)


def _trace(fun, args, in_tree, avals, what):
    dbg = jc.api_util.debug_info(what, fun, args, {})
    flat_fun, out_tree = jc.flatten_fun_nokwargs(jc.lu.wrap_init(fun, debug_info=dbg),
                                                 in_tree)
    jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(flat_fun, avals)
    return jaxpr, consts, out_tree()


def _impl(*args, jaxpr, num_consts, pallas_num_consts, **params):
    del params
    consts, _, args = split(args, [num_consts, pallas_num_consts])
    return jc.eval_jaxpr(jaxpr, consts, *args)


custom_fusion_p.def_impl(_impl)
jc.mlir.register_lowering(custom_fusion_p, jc.mlir.lower_fun(_impl, multiple_results=True))


@custom_fusion_p.def_effectful_abstract_eval
def _abstract_eval(*args, jaxpr, pallas_jaxpr, **params):
    del args, params
    for what, j in (("function", jaxpr), ("pallas_impl", pallas_jaxpr)):
        if j is not None and j.effects:
            raise NotImplementedError(
                f"custom_fusion {what} has effects, which is not yet supported: {j.effects}")
    return [v.aval for v in jaxpr.outvars], jaxpr.effects


@register_eval_rule(custom_fusion_p)
def _eval_rule(ctx, *args, eval_rule, num_consts, pallas_num_consts, **params):
    del params
    args = args[num_consts + pallas_num_consts:]
    return eval_rule(CustomEvalContext(ctx.out_block_specs, ctx.get_out_block_indices()),
                     *args)


@register_pull_block_spec_rule(custom_fusion_p)
def _pull_rule(ctx, out_transforms, *, pull_block_spec_rule, num_consts, pallas_num_consts,
               **params):
    del ctx, params
    ins = list(pull_block_spec_rule(tuple(out_transforms)))
    return [no_block_index_transform] * (num_consts + pallas_num_consts) + ins


@register_push_block_spec_rule(custom_fusion_p)
def _push_rule(ctx, *specs, push_block_spec_rule, num_consts, pallas_num_consts, **params):
    del ctx, params
    if push_block_spec_rule is None:
        raise NotImplementedError("this custom_fusion has no push rule: define one with "
                                  "def_push_block_spec to use it in an output fusion")
    return push_block_spec_rule(tuple(specs[num_consts + pallas_num_consts:]))


@register_usage_rule(custom_fusion_p)
def _usage_rule(ctx, used_out, *, jaxpr, pallas_num_consts, **params):
    del ctx, params
    read = compute_usage(jaxpr, used_out)
    return ([read(v) for v in jaxpr.constvars] + [set()] * pallas_num_consts
            + [read(v) for v in jaxpr.invars])
