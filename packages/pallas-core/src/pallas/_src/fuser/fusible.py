"""``fusible``: marks a kernel-calling function whose producers and consumers ``fuse`` fuses.

Called outside ``fuse``, a fusible runs with trivial fusions: each input fusion returns
its argument and every output fusion is ``None``. Under ``fuse`` it is one
``fusible_p`` equation, which ``fuse`` replaces by a call of the function with the
surrounding computation as fusions.
"""

from __future__ import annotations

from typing import Any

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.fusion import Fusion
from pallas._src.fuser.tracing import split

fusible_p = jc.Primitive("fusible")
fusible_p.multiple_results = True


def _trivial_fusion(x) -> Fusion:
    return Fusion(func=lambda: x, in_type=((), {}), out_type=jax.typeof(x))


def fusible(f=None, *, output_fusion_prefix: Any = True):
    """Declares ``f(*input_fusions, output_fusions)`` fusible (see :func:`fuse`).

    ``output_fusion_prefix`` is a pytree prefix of ``f``'s outputs: each leaf is one
    output fusion, so ``(True, True)`` gives a separate fusion per output.
    """

    def decorator(f):
        def wrapper(*args):
            def trivially_fused(*args):
                in_fusions = jax.tree.map(_trivial_fusion, args)
                prefix = jax.tree.structure(output_fusion_prefix)
                return f(*in_fusions, jax.tree.unflatten(prefix, [None] * prefix.num_leaves))

            flat_args, in_tree = jax.tree.flatten(args)
            dbg = jc.api_util.debug_info("fusible", trivially_fused, args, {})
            flat_fun, out_tree = jc.flatten_fun_nokwargs(
                jc.lu.wrap_init(trivially_fused, debug_info=dbg), in_tree)
            jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(
                flat_fun, [jc.typeof(x) for x in flat_args])
            out = fusible_p.bind(
                *consts, *flat_args, jaxpr=jaxpr, num_consts=len(consts), in_tree=in_tree,
                out_tree=out_tree(), func=f, output_fusion_prefix=output_fusion_prefix)
            return jax.tree.unflatten(out_tree(), out)

        return wrapper

    return decorator(f) if f is not None else decorator


@fusible_p.def_impl
def _fusible_impl(*args, jaxpr, num_consts, **params):
    del params
    consts, args = split(args, [num_consts])
    return jc.eval_jaxpr(jaxpr, consts, *args)


@fusible_p.def_effectful_abstract_eval
def _fusible_abstract_eval(*args, jaxpr, **params):
    del args, params
    return [v.aval for v in jaxpr.outvars], jaxpr.effects


jc.mlir.register_lowering(fusible_p, jc.mlir.lower_fun(_fusible_impl, multiple_results=True))


def _fusible_batching_rule(axis_data, args, dims, **params):
    if axis_data.size != 1:
        raise NotImplementedError(
            f"fusible does not support non-trivial batching (vmap of size {axis_data.size}); "
            "vmap inside the fusible kernel instead")
    args = [a if d is None else jax.numpy.take(a, 0, axis=d) for a, d in zip(args, dims)]
    outs = fusible_p.bind(*args, **params)
    return [o[None] for o in outs], [0] * len(outs)


jc.batching.fancy_primitive_batchers[fusible_p] = _fusible_batching_rule

# High-level (hijax) operands: outside ``fuse`` the fusible is its trivially fused body.
fusible_p.is_high = lambda *args, jaxpr, **params: jaxpr.is_high


def _fusible_to_lojax(*args, jaxpr, num_consts, **params):
    del params
    consts, args = split(args, [num_consts])
    return jc.eval_jaxpr(jaxpr, consts, *args)


fusible_p.to_lojax = _fusible_to_lojax
