"""Subcore control: ``subcore_barrier``, ``fetch_and_add`` and ``parallel_loop``.

Primitives ``sc_subcore_barrier``, ``sc_fetch_and_add`` and ``sc_parallel_loop``.
Interpreter model: the vector subcores of a mesh run one after the other, so a barrier
has nothing to wait for (it is a no-op; data handed between subcores through
``VMEM_SHARED`` across a barrier is therefore not modelled), ``fetch_and_add`` adds to
the one SMEM buffer the interpreter keeps (per-subcore SMEM is not modelled), and a
``parallel_loop`` runs its iterations in order. Lowering: ``tpu.barrier``,
``tpu.fetch_and_add_sync``, and ``scf.for`` marked ``sc.parallel_access`` with
``sc.loop_unroll_factor``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import scf
from jaxlib.mosaic.python import tpu

import pallas as pl
from pallas.plugins import (
    effect_primitive,
    eval_jaxpr,
    read_cell,
    register_kernel_local_effect,
    write_cell,
)
from pallas_tpu import MemorySpace
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src import jax_compat as jc
from pallas_tpu_sparsecore._src.lowering.table import rule
from pallas_tpu_sparsecore._src.primitives import refs as R

# ======================================================================================
# subcore_barrier


class BarrierEffect(jc.Effect):
    """Keeps barriers in place (never removed or reordered as dead code)."""


jc.control_flow_allowed_effects.add_type(BarrierEffect)
jc.lowerable_effects.add_type(BarrierEffect)
# Orders the kernel's own subcores only: not an effect of the pallas_call (an exported
# kernel must load where pallas-tpu-sparsecore is not installed).
register_kernel_local_effect(BarrierEffect)
_barrier_effect = BarrierEffect()

subcore_barrier_p = effect_primitive("sc_subcore_barrier", {_barrier_effect})


def subcore_barrier() -> None:
    """Waits until every vector subcore of this SparseCore reaches the barrier."""
    subcore_barrier_p.bind()


def _barrier_rule(ctx, eqn, invals):
    return []  # subcores run one after the other in the interpreter


@rule(subcore_barrier_p)
def _barrier_lowering(lctx, eqn):
    tpu.barrier(tpx.to_index(0))
    return []


# ======================================================================================
# fetch_and_add


fetch_and_add_p = jc.Primitive("sc_fetch_and_add")


def fetch_and_add(x_ref, value, *, subcore_id) -> jax.Array:
    """Adds ``value`` to the int32 SMEM scalar ``x_ref`` of vector subcore
    ``subcore_id``; returns its previous value."""
    fn = "plsc.fetch_and_add"
    R.check_ref(fn, "x_ref", x_ref)
    base, flat, tree, view = R.flatten_ref(x_ref)
    if math.prod(view.shape) != 1:
        raise ValueError(f"{fn}: x_ref must be a scalar ref (one element); got shape "
                         f"{view.shape}")
    if view.dtype != jnp.int32:
        raise TypeError(f"{fn}: x_ref must hold int32; got {jnp.dtype(view.dtype).name}")
    space = getattr(jax.typeof(base), "memory_space", None)
    if space is pl.MemorySpace.DEFAULT:  # a block with no memory space: the backend's pick
        space = None
    if space is not None and space is not MemorySpace.SMEM:
        raise ValueError(f"{fn}: x_ref must be in SMEM (pltpu.SMEM); got {space}")
    value = jnp.asarray(value, jnp.int32)
    sub = jnp.asarray(subcore_id)
    if value.shape or sub.shape or sub.dtype != jnp.int32:
        raise TypeError(f"{fn}: value and subcore_id must be int32 scalars; got "
                        f"{value.dtype.name}{list(value.shape)} and "
                        f"{sub.dtype.name}{list(sub.shape)}")
    return fetch_and_add_p.bind(base, *flat, value, sub, tree=tree)


fetch_and_add_p.def_effectful_abstract_eval(
    lambda *avals, tree: (jc.ShapedArray((), jnp.int32),
                          {jc.ReadEffect(0), jc.WriteEffect(0)}))


def _fetch_and_add_rule(ctx, eqn, invals):
    cell, *rest = invals
    flat, value = rest[:-2], rest[-2]
    tree = eqn.params["tree"]
    old = read_cell(cell, flat, tree)
    write_cell(cell, flat, tree, old + value)
    return [old.reshape(())]


@rule(fetch_and_add_p)
def _fetch_and_add_lowering(lctx, eqn, ref, *rest):
    tree = eqn.params["tree"]
    flat, value, sub = rest[:-2], rest[-2], rest[-1]
    w = tpx.apply_transforms(ref, flat, tree)
    idx = [tpx.to_i32(s) for s in w.starts]
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    value = tpx.materialize(value, i32)
    sub = tpx.materialize(sub, i32)
    return tpu.fetch_and_add_sync(ref.memref, idx, value, sub)


# ======================================================================================
# parallel_loop


parallel_loop_p = jc.Primitive("sc_parallel_loop")
parallel_loop_p.multiple_results = True


def parallel_loop(lower, upper, step=1, *, unroll=1, carry=None):
    """Decorator: runs ``body(i)`` (or ``carry = body(i, carry)``) for ``i`` in
    ``range(lower, upper, step)``, telling the compiler the iterations are independent
    (they may overlap or be reordered; only the carry passes values between them).
    Returns the final carry (None without one)."""
    if not isinstance(unroll, int) or unroll < 1:
        raise ValueError(f"plsc.parallel_loop: unroll must be a positive int; got {unroll!r}")

    def decorator(body):
        flat_carry, carry_tree = jax.tree_util.tree_flatten(carry)
        flat_carry = [jnp.asarray(c) for c in flat_carry]
        for c in flat_carry:
            if R.is_ref(c):
                raise TypeError("plsc.parallel_loop: the carry may not contain refs")

        def flat_body(i, *cs):
            if carry is None:
                out = body(i)
                if out is not None:
                    raise ValueError("plsc.parallel_loop: a body without carry= must "
                                     "return None")
                return []
            out = body(i, jax.tree_util.tree_unflatten(carry_tree, cs))
            leaves, tree = jax.tree_util.tree_flatten(out)
            if tree != carry_tree:
                raise ValueError(f"plsc.parallel_loop: the body must return the carry's "
                                 f"structure {carry_tree}; got {tree}")
            return leaves

        avals = [jc.ShapedArray((), jnp.int32)] + [jax.typeof(c) for c in flat_carry]
        jaxpr, out_avals, consts = jc.trace_to_jaxpr(flat_body, avals, "parallel_loop")
        for a, c in zip(out_avals, flat_carry):
            if a.shape != c.shape or a.dtype != c.dtype:
                raise TypeError(f"plsc.parallel_loop: the body returned {a.str_short()} "
                                f"for a carry of {jax.typeof(c).str_short()}")
        jaxpr = jc.convert_constvars_jaxpr(jaxpr)
        bounds = [jnp.asarray(b, jnp.int32) for b in (lower, upper, step)]
        outs = parallel_loop_p.bind(*bounds, *consts, *flat_carry, jaxpr=jaxpr,
                                    num_consts=len(consts), unroll=unroll)
        return None if carry is None else jax.tree_util.tree_unflatten(carry_tree, outs)

    return decorator


def _loop_abstract_eval(*avals, jaxpr, num_consts, unroll):
    effects = set()
    for eff in jc.positional_effects(jaxpr):
        if isinstance(eff, jc.JaxprInputEffect):
            if eff.input < num_consts:  # a ref the body closes over
                eff = eff.replace(input=eff.input + 3)
            else:
                continue
        effects.add(eff)
    return list(avals[3 + num_consts:]), effects


parallel_loop_p.def_effectful_abstract_eval(_loop_abstract_eval)


def _loop_rule(ctx, eqn, invals):
    """Runs the iterations in order: rebuilds the loop as ``lax.fori_loop`` over the
    trip count and evaluates that with the interpreter (which threads the refs)."""
    p = eqn.params
    n = p["num_consts"]
    body = jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(p["jaxpr"], ()))

    def as_loop(lo, hi, st, *rest):
        consts, carry = rest[:n], rest[n:]
        trips = jnp.maximum(0, (hi - lo + st - jnp.sign(st)) // st)

        def step(k, cs):
            return tuple(body(*consts, lo + k * st, *cs))

        return list(lax.fori_loop(0, trips, step, tuple(carry)))

    avals = [v.aval for v in eqn.invars]
    jaxpr, _, consts = jc.trace_to_jaxpr(as_loop, avals, "parallel_loop (interpreted)")
    return eval_jaxpr(ctx, jaxpr, consts, invals)


@rule(parallel_loop_p)
def _loop_lowering(lctx, eqn, lo, hi, st, *rest):
    p = eqn.params
    n = p["num_consts"]
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    lo, hi, st = (tpx.to_i32(tpx.materialize(v, i32)) for v in (lo, hi, st))
    consts = list(rest[:n])
    carry = [tpx.materialize(c, eqn.invars[3 + n + k].aval)
             for k, c in enumerate(rest[n:])]
    loop = scf.ForOp(lo, hi, st, carry)
    loop.attributes["sc.parallel_access"] = ir.UnitAttr.get()
    loop.attributes["sc.loop_unroll_factor"] = tpx.types.i64_attr(p["unroll"])
    with ir.InsertionPoint(loop.body):
        outs = tpx.lower_jaxpr(lctx, p["jaxpr"], (),
                               [*consts, loop.induction_variable, *loop.inner_iter_args])
        outs = [tpx.materialize(o, v.aval) for o, v in zip(outs, p["jaxpr"].outvars)]
        scf.YieldOp(outs)
    return list(loop.results)


INTERPRET_RULES = {
    subcore_barrier_p: _barrier_rule,
    fetch_and_add_p: _fetch_and_add_rule,
    parallel_loop_p: _loop_rule,
}
