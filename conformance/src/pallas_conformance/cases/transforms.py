"""JAX transformations of pallas_call: vmap, grad/vjp/jvp, shard_map, jax.export.

These need the transformation rules of ``pallas_call_p`` (batching, JVP, partial eval);
backends claim ``vmap``/``grad``/``shard_map``/``export`` when they pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas as pl
from pallas_conformance.catalogue import case, randn, sds

C = 128


def _scale_add(pallas_call, x, y):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype))(x, y)


def _tiled_sin(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...]) * x_ref[...]

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


@case("vmap/batch_axis0", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (3, 8, C)), randn(rng, (3, 8, C))),
      reference=lambda x, y: x * 2.0 + y)
def vmap0(pallas_call, x, y):
    """jax.vmap over a leading batch axis."""
    return jax.vmap(lambda a, b: _scale_add(pallas_call, a, b))(x, y)


@case("vmap/in_axes_mixed", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, 3, C)), randn(rng, (8, C))),
      reference=lambda x, y: jnp.moveaxis(x, 1, 0) * 2.0 + y)
def vmap_mixed(pallas_call, x, y):
    """in_axes=(1, None): a batched operand on axis 1 and an unbatched one."""
    return jax.vmap(lambda a, b: _scale_add(pallas_call, a, b), in_axes=(1, None))(x, y)


@case("vmap/gridded_kernel", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (2, 16, C)),),
      reference=lambda x: jnp.sin(x) * x)
def vmap_grid(pallas_call, x):
    """vmap of a kernel that already has a grid."""
    return jax.vmap(lambda a: _tiled_sin(pallas_call, a))(x)


@case("grad/elementwise_vjp", tags={"grad"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(x))
def grad_elementwise(pallas_call, x):
    """jax.grad through a tiled elementwise kernel."""
    return jax.grad(lambda a: jnp.sum(_tiled_sin(pallas_call, a)))(x)


@case("grad/jvp", tags={"grad"},
      inputs=lambda rng: (randn(rng, (16, C)), randn(rng, (16, C))),
      reference=lambda x, t: jax.jvp(lambda a: jnp.sin(a) * a, (x,), (t,)))
def jvp(pallas_call, x, t):
    """jax.jvp of a tiled elementwise kernel."""
    return jax.jvp(lambda a: _tiled_sin(pallas_call, a), (x,), (t,))


@case("grad/two_operands", tags={"grad"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: (jnp.full_like(x, 2.0), jnp.ones_like(y)))
def grad_two(pallas_call, x, y):
    """Gradients with respect to two operands."""
    return jax.grad(lambda a, b: jnp.sum(_scale_add(pallas_call, a, b)), argnums=(0, 1))(x, y)


def _mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


@case("shard_map/rows", tags={"shard_map"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def shard_rows(pallas_call, x):
    """pallas_call per shard under jax.shard_map over a 1-device mesh."""
    mesh = _mesh()
    f = jax.shard_map(lambda a: _tiled_sin(pallas_call, a), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/with_psum", tags={"shard_map", "reductions"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: x * 2.0 + y)
def shard_psum(pallas_call, x, y):
    """A kernel per shard followed by a collective (psum over a 1-device axis)."""
    mesh = _mesh()
    f = jax.shard_map(lambda a, b: jax.lax.psum(_scale_add(pallas_call, a, b), "x"),
                      mesh=mesh, in_specs=(P(), P()), out_specs=P())
    return jax.jit(f)(x, y)


@case("export/export_and_call", tags={"export"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_round_trip(pallas_call, x):
    """jax.export.export, then call the Exported (serialisation needs flatbuffers)."""
    exp = jax.export.export(jax.jit(lambda a: _tiled_sin(pallas_call, a)))(x)
    assert "func.func public @main" in exp.mlir_module()
    return exp.call(x)


@case("export/two_outputs", tags={"export", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: (x * 2.0 + y, x * 2.0 + y))
def export_two(pallas_call, x, y):
    """An exported function with two pallas_call results."""
    def f(a, b):
        r = _scale_add(pallas_call, a, b)
        return r, r

    exp = jax.export.export(jax.jit(f))(x, y)
    return exp.call(x, y)


