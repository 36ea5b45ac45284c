"""pallas_call inside jax.shard_map: row shards, psum and all_gather across shards,
program_id per shard, and grad through a sharded kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from pallas_conformance.cases import _programs as shared
from pallas_conformance.registry import case, randn, sds

C = shared.C


def _mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


@case("shard_map/rows", tags={"shard_map"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def shard_rows(pallas_call, x):
    """pallas_call per shard under jax.shard_map over a 1-device mesh."""
    mesh = _mesh()
    f = jax.shard_map(lambda a: shared.tiled_sin(pallas_call, a), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/with_psum", tags={"shard_map", "reductions"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: x * 2.0 + y)
def shard_psum(pallas_call, x, y):
    """A kernel per shard followed by a collective (psum over a 1-device axis)."""
    mesh = _mesh()
    f = jax.shard_map(lambda a, b: jax.lax.psum(shared.scale_add(pallas_call, a, b), "x"),
                      mesh=mesh, in_specs=(P(), P()), out_specs=P())
    return jax.jit(f)(x, y)


def _mesh_all(rows: int):
    """A 1-D mesh over as many local devices (a power of two, at most 4) as divide
    ``rows // 8`` row blocks."""
    n = 1
    while n * 2 <= min(jax.device_count(), 4) and (rows // 8) % (n * 2) == 0:
        n *= 2
    return jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,),
                         devices=jax.devices()[:n])


@case("shard_map/psum_column_sums", tags={"shard_map", "reductions"},
      inputs=lambda rng: (randn(rng, (32, C)), randn(rng, (32, C))),
      reference=lambda x, y: jnp.sum(x * y, axis=0),
      tolerance={"float32": (1e-4, 1e-5)})
def shard_psum_cols(pallas_call, x, y):
    """Each shard's kernel reduces its rows; lax.psum adds the partial sums of all shards."""
    mesh = _mesh_all(x.shape[0])

    def local(a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = jnp.sum(a_ref[...] * b_ref[...], axis=0)

        part = pallas_call(kernel, out_shape=sds((C,), a.dtype))(a, b)
        return jax.lax.psum(part, "x")

    f = jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P())
    sh = jax.NamedSharding(mesh, P("x"))
    return jax.jit(f)(jax.device_put(x, sh), jax.device_put(y, sh))


@case("shard_map/all_gather", tags={"shard_map"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=lambda x: jnp.sin(x) * x)
def shard_all_gather(pallas_call, x):
    """A tiled kernel per shard, then lax.all_gather(tiled=True) back to the whole array
    (check_vma=False: the gathered result is replicated)."""
    mesh = _mesh_all(x.shape[0])
    f = jax.shard_map(
        lambda a: jax.lax.all_gather(shared.tiled_sin(pallas_call, a), "x", tiled=True),
        mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False)
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/program_id_per_shard", tags={"shard_map", "control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate(
          [shared.ref_add_program_id(s) for s in jnp.split(x, _mesh_all(x.shape[0]).size)]))
def shard_program_id(pallas_call, x):
    """program_id counts the grid of each shard's call, not of the global array."""
    mesh = _mesh_all(x.shape[0])
    f = jax.shard_map(lambda a: shared.add_program_id(pallas_call, a), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/grad", tags={"shard_map", "grad"},
      inputs=lambda rng: (randn(rng, (32, C)), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w: jax.grad(shared.matmul_loss, argnums=(0, 1))(x, w),
      tolerance={"float32": (1e-4, 1e-4)})
def shard_grad(pallas_call, x, w):
    """grad through shard_map of a matmul kernel with a replicated weight (its cotangent
    is summed over the shards)."""
    mesh = _mesh_all(x.shape[0])

    def loss(a, b):
        def local(a_, b_):
            return jax.lax.psum(jnp.sum(shared.matmul_rows(pallas_call, a_, b_) ** 2), "x")

        return jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P()), out_specs=P())(a, b)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(
        jax.device_put(x, jax.NamedSharding(mesh, P("x"))), w)
