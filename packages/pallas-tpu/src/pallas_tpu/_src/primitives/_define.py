"""Defining value primitives once: abstract eval, a jnp reference impl, interpreter rule.

The reference implementation (plain ``jax.numpy``) is the primitive's meaning: the
interpreter runs it (so it also vectorises under the interpreter's ``vmap``), and on
non-TPU platforms the primitive lowers to it. The Mosaic lowering lives in
``pallas_tpu._src.lowering.rules``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from pallas_tpu._src import jax_compat as jc

INTERPRET_RULES: dict = {}


def value_primitive(name: str, impl: Callable, multiple_results: bool = False):
    """A primitive whose meaning is ``impl(*args, **params)`` (written with jnp)."""
    prim = jc.Primitive(name)
    prim.multiple_results = multiple_results

    def abstract_eval(*avals, **params):
        shaped = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
        out = jax.eval_shape(lambda *xs: impl(*xs, **params), *shaped)
        if multiple_results:
            return [jc.ShapedArray(o.shape, o.dtype) for o in out]
        return jc.ShapedArray(out.shape, out.dtype)

    prim.def_abstract_eval(abstract_eval)
    prim.def_impl(lambda *args, **params: impl(*args, **params))
    jc.mlir.register_lowering(prim, jc.mlir.lower_fun(impl, multiple_results=multiple_results))

    def rule(ctx, eqn, invals):
        out = impl(*invals, **eqn.params)
        return list(out) if multiple_results else [out]

    INTERPRET_RULES[prim] = rule
    return prim
