"""Fuser rules of call primitives: ``jit``, ``custom_jvp``/``custom_vjp`` calls, hijax.

A call is looked through: block specs are pulled/pushed through its body, and its eval
rule runs the body block by block.
"""

from __future__ import annotations

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.kernel import make_kernel_function
from pallas._src.fuser.pull import pull_jaxpr, pull_transforms
from pallas._src.fuser.push import push_jaxpr
from pallas._src.fuser.registry import (
    register_eval_rule,
    register_pull_block_spec_rule,
    register_push_block_spec_rule,
    register_usage_rule,
)
from pallas._src.fuser.usage import Usage, compute_usage

CALLS = {jc.jit_p: "jaxpr", jc.custom_jvp_call_p: "call_jaxpr",
         jc.custom_vjp_call_p: "call_jaxpr", jc.closed_call_p: "call_jaxpr"}


def _body(params, key):
    body = params[key]
    if isinstance(body, jc.ClosedJaxpr):
        return body.jaxpr, list(body.consts)
    return body, []


def _all_regular(v):
    del v
    return {Usage.REGULAR}


def _make_rules(prim, key):
    @register_usage_rule(prim)
    def usage_rule(ctx, used_out, **params):
        del ctx
        jaxpr, _ = _body(params, key)
        read = compute_usage(jaxpr, used_out)
        return [read(v) for v in jaxpr.invars]

    @register_pull_block_spec_rule(prim)
    def pull_rule(ctx, out_transforms, **params):
        jaxpr, _ = _body(params, key)
        ins, _, _ = pull_transforms(
            jaxpr, tuple(out_transforms), read_usage=_all_regular,
            scalar_prefetch_handler=ctx.scalar_prefetch_handler, grid_len=ctx.grid_len,
            strict_mode=ctx.strict_mode)
        return ins

    @register_eval_rule(prim)
    def eval_rule(ctx, *args, **params):
        jaxpr, consts = _body(params, key)
        _, env, sp_fns = pull_jaxpr(
            jaxpr, ctx.out_block_specs, read_usage=_all_regular,
            scalar_prefetch_handler=ctx.scalar_prefetch_handler, grid_len=ctx.grid_len)
        in_tree = jax.tree.structure((tuple(jaxpr.invars), {}))
        out_tree = jax.tree.structure(tuple(jaxpr.outvars))
        kernel_fn = make_kernel_function(
            jaxpr, consts, in_tree, out_tree, _all_regular, ctx.in_block_specs, env, sp_fns,
            ctx.scalar_prefetch_handler, ctx.grid_len)
        return kernel_fn(ctx.get_program_ids(), ctx.scalar_prefetch, *args)

    @register_push_block_spec_rule(prim)
    def push_rule(ctx, *specs, **params):
        del ctx
        jaxpr, _ = _body(params, key)
        return push_jaxpr(jaxpr, *specs)


for _prim, _key in CALLS.items():
    _make_rules(_prim, _key)


# -- hijax primitives bring their own rules ---------------------------------------------


@register_pull_block_spec_rule(jc.call_hi_primitive_p)
def _hi_pull_rule(ctx, out_transforms, *, _prim):
    return _prim.pull_block_spec_rule(ctx, out_transforms)


@register_push_block_spec_rule(jc.call_hi_primitive_p)
def _hi_push_rule(ctx, *specs, _prim):
    return _prim.push_block_spec_rule(ctx, specs)


@register_eval_rule(jc.call_hi_primitive_p)
def _hi_eval_rule(ctx, *args, _prim):
    return jax.tree.leaves(_prim.block_eval_rule(ctx, *args))
