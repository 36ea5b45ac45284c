"""Interpreter rules for JAX's PRNG primitives on a key whose implementation is a
backend's (e.g. pallas-tpu's ``"pallas_tpu"`` keys, drawn from the core's PRNG).

JAX runs a key's ``seed``/``fold_in``/``split``/``random_bits`` by lowering the
implementation's function; inside a kernel that function may use the backend's kernel
primitives (``prng_seed``, ``prng_random_bits``), which only the interpreter can run. So
for a single key the function is traced to a jaxpr and evaluated here, rule by rule.
Keys of JAX's own implementations give the same numbers either way.

``threefry2x32`` (which kernels also bind directly, with a (1, 1) key against a block of
counts) runs on operands broadcast to one shape first: JAX's rolled-loop evaluation of
it carries the key words at their own shape, which breaks when the interpreter batches
the counts over the grid but not the key (JAX's batching of it broadcasts the key to
size-1 batch dimensions).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter.evaluator import bind_eqn, eval_closed
from pallas._src.interpreter.rules import register_interpret_rule


def _run(ctx, fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    return eval_closed(ctx, closed, args)[0]


@register_interpret_rule(jc.random_bits_p)
def _random_bits_rule(ctx, eqn, invals):
    key, = invals
    if key.ndim:
        return bind_eqn(eqn, invals)
    impl, p = key.dtype._impl, eqn.params
    data = jax.random.key_data(key)
    return [_run(ctx, lambda d: impl.random_bits(d, p["bit_width"], p["shape"]), data)]


@register_interpret_rule(jc.random_fold_in_p)
def _random_fold_in_rule(ctx, eqn, invals):
    key, msg = invals
    if key.ndim or jnp.ndim(msg):
        return bind_eqn(eqn, invals)
    impl = key.dtype._impl
    data = _run(ctx, impl.fold_in, jax.random.key_data(key), msg)
    return [jax.random.wrap_key_data(data, impl=impl.name)]


@register_interpret_rule(jc.random_seed_p)
def _random_seed_rule(ctx, eqn, invals):
    seed, = invals
    impl = eqn.params["impl"]
    if jnp.ndim(seed):
        return bind_eqn(eqn, invals)
    return [jax.random.wrap_key_data(_run(ctx, impl.seed, seed), impl=impl.name)]


@register_interpret_rule(jc.random_split_p)
def _random_split_rule(ctx, eqn, invals):
    key, = invals
    if key.ndim:
        return bind_eqn(eqn, invals)
    impl, shape = key.dtype._impl, eqn.params["shape"]
    data = _run(ctx, lambda d: impl.split(d, shape), jax.random.key_data(key))
    return [jax.random.wrap_key_data(data, impl=impl.name)]


@register_interpret_rule(jc.threefry2x32_p)
def _threefry2x32_rule(ctx, eqn, invals):
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in invals))
    # Adding the same zeros to every operand makes them all vary over the grid as soon as
    # one does (batched alike under the interpreter's vmap), not only in shape.
    zero = sum(x ^ x for x in invals)  # not zeros_like: that would not vary
    return list(jc.threefry2x32_p.bind(*(jnp.broadcast_to(x, shape) + zero for x in invals)))
