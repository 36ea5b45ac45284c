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


# --- More vmap ------------------------------------------------------------------------

HI = jax.lax.Precision.HIGHEST


def _matmul_rows(pallas_call, x, w):
    """(16, C) @ (C, C) in two row blocks; ``w`` is one whole block for every program."""
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((x.shape[0], w.shape[1]), x.dtype),
                       grid=(x.shape[0] // 8,),
                       in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0)),
                                 pl.BlockSpec((C, C), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, C), lambda i: (i, 0)))(x, w)


def _add_program_id(pallas_call, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 10.0 * pl.program_id(0).astype(jnp.float32)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


def _ref_add_program_id(x):
    return x + 10.0 * jnp.repeat(jnp.arange(x.shape[-2] // 8, dtype=jnp.float32),
                                 8)[:, None]


def _running_sum(pallas_call, x):
    """A running sum of row blocks in scratch that persists along the grid."""
    def kernel(x_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += x_ref[...]
        o_ref[...] = acc_ref[...]

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec,
                       scratch_shapes=[pl.ANY((8, C), jnp.float32)])(x)


def _ref_running_sum(x):
    n = x.shape[0] // 8
    return jnp.cumsum(x.reshape(n, 8, C), axis=0).reshape(x.shape)


@case("vmap/in_axes1_out_axes1", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (16, 3, C)),),
      reference=lambda x: jnp.sin(x) * x)
def vmap_axes1(pallas_call, x):
    """in_axes=1 and out_axes=1: the batch axis in the middle of operand and result."""
    return jax.vmap(lambda a: _tiled_sin(pallas_call, a), in_axes=1, out_axes=1)(x)


@case("vmap/in_axes_last", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, C, 2)), randn(rng, (8, C, 2))),
      reference=lambda x, y: jnp.moveaxis(x * 2.0 + y, -1, 0))
def vmap_last(pallas_call, x, y):
    """in_axes=-1: the batch axis is the (minor-most) lane axis of the operands."""
    return jax.vmap(lambda a, b: _scale_add(pallas_call, a, b), in_axes=-1)(x, y)


@case("vmap/nested", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (2, 3, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def vmap_nested(pallas_call, x):
    """vmap of vmap of a grid kernel (two added grid axes)."""
    return jax.vmap(jax.vmap(lambda a: _tiled_sin(pallas_call, a)))(x)


@case("vmap/nested_mixed_axes", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (8, 2, C)), randn(rng, (3, 8, C))),
      reference=lambda x, y: (jnp.moveaxis(x, 1, 0)[:, None] * 2.0 + y[None]))
def vmap_nested_mixed(pallas_call, x, y):
    """Nested vmap where each level batches a different operand (the other unbatched)."""
    inner = jax.vmap(lambda a, b: _scale_add(pallas_call, a, b), in_axes=(None, 0))
    return jax.vmap(inner, in_axes=(1, None))(x, y)


@case("vmap/program_id", tags={"vmap", "control_flow"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),), reference=jax.vmap(_ref_add_program_id))
def vmap_program_id(pallas_call, x):
    """A kernel that reads program_id keeps its per-block values under vmap."""
    return jax.vmap(lambda a: _add_program_id(pallas_call, a))(x)


@case("vmap/nested_program_id", tags={"vmap", "control_flow"},
      inputs=lambda rng: (randn(rng, (2, 2, 16, C)),),
      reference=jax.vmap(jax.vmap(_ref_add_program_id)))
def vmap_nested_program_id(pallas_call, x):
    """program_id under two nested vmaps."""
    return jax.vmap(jax.vmap(lambda a: _add_program_id(pallas_call, a)))(x)


@case("vmap/unbatched_weight_dot", tags={"vmap", "dot"},
      inputs=lambda rng: (randn(rng, (3, 16, C)), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w: jnp.einsum("bmk,kn->bmn", x, w, precision=HI),
      tolerance={"float32": (1e-4, 1e-4)})
def vmap_unbatched_weight(pallas_call, x, w):
    """in_axes=(0, None) on a grid kernel: a batched activation and a shared weight."""
    return jax.vmap(lambda a, b: _matmul_rows(pallas_call, a, b), in_axes=(0, None))(x, w)


@case("vmap/grid_scratch_accumulate",
      tags={"vmap", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (3, 32, C)),), reference=jax.vmap(_ref_running_sum),
      tolerance={"float32": (1e-5, 1e-5)})
def vmap_grid_scratch(pallas_call, x):
    """vmap of a grid kernel whose scratch, reset at program_id 0, persists along the grid."""
    return jax.vmap(lambda a: _running_sum(pallas_call, a))(x)


@case("vmap/multiple_outputs", tags={"vmap", "multiple_outputs", "reductions"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),),
      reference=lambda x: (x * 2.0, jnp.sum(x, axis=-1, keepdims=True)),
      tolerance={"float32": (1e-5, 1e-5)})
def vmap_multi(pallas_call, x):
    """vmap of a kernel with two outputs of different shapes (a block and its row sums)."""
    def f(a):
        def kernel(x_ref, o_ref, s_ref):
            o_ref[...] = x_ref[...] * 2.0
            s_ref[...] = jnp.sum(x_ref[...], axis=-1, keepdims=True)

        return pallas_call(kernel, out_shape=(sds(a.shape, a.dtype), sds((16, 1), a.dtype)),
                           grid=(2,), in_specs=[pl.BlockSpec((8, C), lambda i: (i, 0))],
                           out_specs=(pl.BlockSpec((8, C), lambda i: (i, 0)),
                                      pl.BlockSpec((8, 1), lambda i: (i, 0))))(a)

    return jax.vmap(f)(x)


@case("vmap/pytree_operands", tags={"vmap", "pytrees"},
      inputs=lambda rng: (randn(rng, (2, 8, C)), randn(rng, (8, C))),
      reference=lambda x, y: {"s": x + y, "d": x - y})
def vmap_pytree(pallas_call, x, y):
    """vmap with a dict operand (one leaf batched, one not) and a dict result."""
    def f(d):
        def kernel(r, o):
            o["s"][...] = r["a"][...] + r["b"][...]
            o["d"][...] = r["a"][...] - r["b"][...]

        shape = sds(d["a"].shape, d["a"].dtype)
        return pallas_call(kernel, out_shape={"s": shape, "d": shape})(d)

    return jax.vmap(f, in_axes=({"a": 0, "b": None},))({"a": x, "b": y})


@case("vmap/of_jit", tags={"vmap"},
      inputs=lambda rng: (randn(rng, (4, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def vmap_of_jit(pallas_call, x):
    """vmap of a jitted function that calls the kernel (batching through pjit)."""
    return jax.vmap(jax.jit(lambda a: _tiled_sin(pallas_call, a)))(x)


def _gather_blocks(pallas_call, idx, x):
    """Row blocks of ``x`` gathered by prefetched block indices."""
    def kernel(idx_ref, x_ref, o_ref):
        del idx_ref
        o_ref[...] = x_ref[...] * 2.0

    return pallas_call(
        kernel, out_shape=sds((idx.shape[0] * 8, C), x.dtype),
        grid_spec=pl.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(idx.shape[0],),
            in_specs=[pl.BlockSpec((8, C), lambda i, idx: (idx[i], 0))],
            out_specs=pl.BlockSpec((8, C), lambda i, idx: (i, 0))))(idx, x)


def _ref_gather_blocks(idx, x):
    return jnp.concatenate([x[8 * int(i):8 * int(i) + 8] for i in idx]) * 2.0


@case("vmap/scalar_prefetch_unbatched_indices", tags={"vmap", "scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([2, 0, 3], jnp.int32), randn(rng, (2, 32, C))),
      reference=lambda idx, x: jnp.stack([_ref_gather_blocks(idx, b) for b in x]))
def vmap_prefetch_unbatched(pallas_call, idx, x):
    """vmap over the data of a scalar-prefetch gather whose indices are shared."""
    return jax.vmap(lambda a: _gather_blocks(pallas_call, idx, a))(x)


@case("vmap/scalar_prefetch_batched_indices", tags={"vmap", "scalar_prefetch"},
      inputs=lambda rng: (jnp.asarray([[2, 0, 3], [1, 1, 0]], jnp.int32),
                          randn(rng, (2, 32, C))),
      reference=lambda idx, x: jnp.stack([_ref_gather_blocks(i, b) for i, b in zip(idx, x)]))
def vmap_prefetch_batched(pallas_call, idx, x):
    """vmap over batched prefetched indices and data (one gather per batch element)."""
    return jax.vmap(lambda i, a: _gather_blocks(pallas_call, i, a))(idx, x)


@case("vmap/aliased_unbatched_input", tags={"vmap", "aliasing"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (3, 8, C))),
      reference=lambda acc, x: acc[None] * 0.5 + x)
def vmap_aliased(pallas_call, acc, x):
    """vmap where the aliased input is unbatched (it is broadcast to the batched output)."""
    def f(a, b):
        def kernel(a_ref, b_ref, o_ref):
            del a_ref
            o_ref[...] = o_ref[...] * 0.5 + b_ref[...]

        return pallas_call(kernel, out_shape=sds(a.shape, a.dtype),
                           input_output_aliases={0: 0})(a, b)

    return jax.vmap(f, in_axes=(None, 0))(acc, x)


# --- More grad and jvp ----------------------------------------------------------------

def _softmax_rows(pallas_call, x):
    def kernel(x_ref, o_ref):
        v = x_ref[...]
        e = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
        o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


def _matmul_loss(a, b):
    return jnp.sum(jnp.dot(a, b, precision=HI) ** 2)


@case("grad/matmul", tags={"grad", "dot"},
      inputs=lambda rng: (randn(rng, (16, C), scale=0.3), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w: jax.grad(_matmul_loss, argnums=(0, 1))(x, w),
      tolerance={"float32": (1e-4, 1e-4)})
def grad_matmul(pallas_call, x, w):
    """grad of sum((x @ w)**2) through a row-tiled matmul kernel, for both operands."""
    return jax.grad(lambda a, b: jnp.sum(_matmul_rows(pallas_call, a, b) ** 2),
                    argnums=(0, 1))(x, w)


@case("grad/softmax", tags={"grad", "reductions", "broadcasting"},
      inputs=lambda rng: (randn(rng, (16, C), scale=2.0), randn(rng, (16, C))),
      reference=lambda x, t: jax.grad(
          lambda a: jnp.sum(jax.nn.softmax(a, axis=-1) * t))(x),
      tolerance={"float32": (1e-5, 1e-4)})
def grad_softmax(pallas_call, x, t):
    """grad of a weighted sum of a row-softmax kernel (max, exp, sum, divide)."""
    return jax.grad(lambda a: jnp.sum(_softmax_rows(pallas_call, a) * t))(x)


@case("grad/jvp_matmul", tags={"grad", "dot"},
      inputs=lambda rng: (randn(rng, (16, C), scale=0.3), randn(rng, (C, C), scale=0.1),
                          randn(rng, (16, C), scale=0.3), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w, tx, tw: jax.jvp(lambda a, b: jnp.dot(a, b, precision=HI),
                                             (x, w), (tx, tw)),
      tolerance={"float32": (1e-4, 1e-4)})
def jvp_matmul(pallas_call, x, w, tx, tw):
    """jax.jvp of a matmul kernel with tangents for both operands."""
    return jax.jvp(lambda a, b: _matmul_rows(pallas_call, a, b), (x, w), (tx, tw))


@case("grad/vjp_two_outputs", tags={"grad", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C)), randn(rng, (8, C)),
                          randn(rng, (8, C))),
      reference=lambda x, y, gu, gv: jax.vjp(lambda a, b: (a * b, jnp.sin(a) + b),
                                             x, y)[1]((gu, gv)))
def vjp_two_outputs(pallas_call, x, y, gu, gv):
    """jax.vjp of a kernel with two outputs, pulled back with explicit cotangents."""
    def f(a, b):
        def kernel(a_ref, b_ref, u_ref, v_ref):
            u_ref[...] = a_ref[...] * b_ref[...]
            v_ref[...] = jnp.sin(a_ref[...]) + b_ref[...]

        s = sds(a.shape, a.dtype)
        return pallas_call(kernel, out_shape=(s, s))(a, b)

    _, pull = jax.vjp(f, x, y)
    return pull((gu, gv))


@case("grad/accumulate_over_grid", tags={"grad", "reductions", "sequential_grid"},
      inputs=lambda rng: (randn(rng, (8, 4 * C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(jnp.sum(jnp.tanh(a), axis=1) ** 2))(x),
      tolerance={"float32": (1e-4, 1e-5)})
def grad_accumulate(pallas_call, x):
    """grad through a row-sum kernel that accumulates into its output along a grid axis."""
    def f(a):
        def kernel(x_ref, o_ref):
            @pl.when(pl.program_id(0) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)

            o_ref[...] += jnp.sum(jnp.tanh(x_ref[...]), axis=1, keepdims=True)

        return pallas_call(kernel, out_shape=sds((8, 1), a.dtype), grid=(4,),
                           in_specs=[pl.BlockSpec((8, C), lambda k: (0, k))],
                           out_specs=pl.BlockSpec((8, 1), lambda k: (0, 0)))(a)

    return jax.grad(lambda a: jnp.sum(f(a) ** 2))(x)


@case("grad/fori_loop_kernel", tags={"grad", "control_flow"},
      inputs=lambda rng: (randn(rng, (8, C), scale=0.5),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(
          jax.lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) * a, a)))(x),
      tolerance={"float32": (1e-5, 1e-5)})
def grad_fori(pallas_call, x):
    """grad through a kernel whose body is a static-bound fori_loop."""
    def f(a):
        def kernel(x_ref, o_ref):
            v = x_ref[...]
            o_ref[...] = jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * v, v)

        return pallas_call(kernel, out_shape=sds(a.shape, a.dtype))(a)

    return jax.grad(lambda a: jnp.sum(f(a)))(x)


@case("grad/second_order", tags={"grad"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(
          jax.grad(lambda b: jnp.sum(jnp.sin(b) * b))(a)))(x),
      tolerance={"float32": (1e-5, 1e-5)})
def grad_second(pallas_call, x):
    """grad of grad: the diagonal second derivative of a tiled elementwise kernel."""
    g = jax.grad(lambda a: jnp.sum(_tiled_sin(pallas_call, a)))
    return jax.grad(lambda a: jnp.sum(g(a)))(x)


@case("grad/under_vmap", tags={"grad", "vmap"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),),
      reference=jax.vmap(jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))))
def grad_vmap(pallas_call, x):
    """vmap of grad of a tiled elementwise kernel (per-example gradients)."""
    return jax.vmap(jax.grad(lambda a: jnp.sum(_tiled_sin(pallas_call, a))))(x)


@case("grad/checkpoint", tags={"grad"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum((jnp.sin(a) * a) ** 2))(x),
      tolerance={"float32": (1e-5, 1e-5)})
def grad_checkpoint(pallas_call, x):
    """grad through jax.checkpoint around the kernel (the kernel is recomputed)."""
    f = jax.checkpoint(lambda a: _tiled_sin(pallas_call, a))
    return jax.grad(lambda a: jnp.sum(f(a) ** 2))(x)


@case("grad/jvp_scratch", tags={"grad", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (32, C)), randn(rng, (32, C))),
      reference=lambda x, t: jax.jvp(_ref_running_sum, (x,), (t,)),
      tolerance={"float32": (1e-5, 1e-5)})
def jvp_scratch(pallas_call, x, t):
    """jax.jvp of a kernel with persistent scratch (the scratch gets a tangent buffer)."""
    return jax.jvp(lambda a: _running_sum(pallas_call, a), (x,), (t,))


def _masked_tanh(pallas_call, x):
    """tanh of the first 100 lanes through a masked load (other=0) and a masked store
    over a zero fill."""
    def kernel(x_ref, o_ref):
        m = jax.lax.broadcasted_iota(jnp.int32, (8, C), 1) < 100
        o_ref[...] = jnp.zeros_like(o_ref)
        v = pl.load(x_ref, (slice(None), slice(None)), mask=m, other=0.0)
        pl.store(o_ref, jnp.tanh(v), (slice(None), slice(None)), mask=m)

    spec = pl.BlockSpec((8, C), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                       in_specs=[spec], out_specs=spec)(x)


def _ref_masked_tanh(x):
    return jnp.where(jnp.arange(C)[None] < 100, jnp.tanh(x), 0.0)


@case("grad/masked_load_store", tags={"grad", "indexing"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(_ref_masked_tanh(a) ** 2))(x),
      tolerance={"float32": (1e-5, 1e-5)})
def grad_masked(pallas_call, x):
    """grad through masked pl.load/pl.store: masked-out lanes get a zero gradient."""
    return jax.grad(lambda a: jnp.sum(_masked_tanh(pallas_call, a) ** 2))(x)


@case("grad/jvp_while_loop", tags={"grad", "control_flow"},
      inputs=lambda rng: (randn(rng, (8, C)) * 5.0, randn(rng, (8, C))),
      reference=lambda x, t: jax.jvp(
          lambda a: jax.lax.while_loop(lambda v: jnp.max(jnp.abs(v)) >= 1.0,
                                       lambda v: v * 0.5, a), (x,), (t,)))
def jvp_while(pallas_call, x, t):
    """jax.jvp (forward mode) of a kernel whose while_loop trip count depends on data."""
    def f(a):
        def kernel(x_ref, o_ref):
            o_ref[...] = jax.lax.while_loop(lambda v: jnp.max(jnp.abs(v)) >= 1.0,
                                            lambda v: v * 0.5, x_ref[...])

        return pallas_call(kernel, out_shape=sds(a.shape, a.dtype))(a)

    return jax.jvp(f, (x,), (t,))


# --- More shard_map (over every local device; set XLA_FLAGS=
# --xla_force_host_platform_device_count=N on a CPU to use N > 1) -----------------------

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
        lambda a: jax.lax.all_gather(_tiled_sin(pallas_call, a), "x", tiled=True),
        mesh=mesh, in_specs=P("x"), out_specs=P(), check_vma=False)
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/program_id_per_shard", tags={"shard_map", "control_flow"},
      inputs=lambda rng: (randn(rng, (32, C)),),
      reference=lambda x: jnp.concatenate(
          [_ref_add_program_id(s) for s in jnp.split(x, _mesh_all(x.shape[0]).size)]))
def shard_program_id(pallas_call, x):
    """program_id counts the grid of each shard's call, not of the global array."""
    mesh = _mesh_all(x.shape[0])
    f = jax.shard_map(lambda a: _add_program_id(pallas_call, a), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    return jax.jit(f)(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))


@case("shard_map/grad", tags={"shard_map", "grad"},
      inputs=lambda rng: (randn(rng, (32, C)), randn(rng, (C, C), scale=0.1)),
      reference=lambda x, w: jax.grad(_matmul_loss, argnums=(0, 1))(x, w),
      tolerance={"float32": (1e-4, 1e-4)})
def shard_grad(pallas_call, x, w):
    """grad through shard_map of a matmul kernel with a replicated weight (its cotangent
    is summed over the shards)."""
    mesh = _mesh_all(x.shape[0])

    def loss(a, b):
        def local(a_, b_):
            return jax.lax.psum(jnp.sum(_matmul_rows(pallas_call, a_, b_) ** 2), "x")

        return jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P()), out_specs=P())(a, b)

    return jax.jit(jax.grad(loss, argnums=(0, 1)))(
        jax.device_put(x, jax.NamedSharding(mesh, P("x"))), w)


# --- More export ----------------------------------------------------------------------

@case("export/serialize_round_trip", tags={"export"},
      inputs=lambda rng: (randn(rng, (16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_serialize(pallas_call, x):
    """jax.export, serialize to bytes, deserialize and call the deserialized Exported."""
    exp = jax.export.export(jax.jit(lambda a: _tiled_sin(pallas_call, a)))(x)
    blob = exp.serialize()
    assert isinstance(blob, (bytes, bytearray)) and len(blob) > 0
    return jax.export.deserialize(blob).call(x)


@case("export/pytree_args", tags={"export", "pytrees", "multiple_outputs"},
      inputs=lambda rng: (randn(rng, (8, C)), randn(rng, (8, C))),
      reference=lambda x, y: {"sum": x + y, "prod": (x * y, x - y)})
def export_pytree(pallas_call, x, y):
    """Export of a function with a dict argument and a nested dict/tuple result, after a
    serialize/deserialize round trip."""
    def f(d):
        def kernel(a_ref, b_ref, s_ref, p_ref, m_ref):
            a, b = a_ref[...], b_ref[...]
            s_ref[...] = a + b
            p_ref[...] = a * b
            m_ref[...] = a - b

        s = sds(d["a"].shape, d["a"].dtype)
        total, prod, diff = pallas_call(kernel, out_shape=(s, s, s))(d["a"], d["b"])
        return {"sum": total, "prod": (prod, diff)}

    args = {"a": x, "b": y}
    exp = jax.export.deserialize(jax.export.export(jax.jit(f))(args).serialize())
    return exp.call(args)


@case("export/of_vmap", tags={"export", "vmap"},
      inputs=lambda rng: (randn(rng, (3, 16, C)),), reference=lambda x: jnp.sin(x) * x)
def export_vmap(pallas_call, x):
    """Export of a vmapped grid kernel, serialized and deserialized."""
    f = jax.jit(jax.vmap(lambda a: _tiled_sin(pallas_call, a)))
    return jax.export.deserialize(jax.export.export(f)(x).serialize()).call(x)


@case("export/of_grad", tags={"export", "grad"},
      inputs=lambda rng: (randn(rng, (16, C)),),
      reference=lambda x: jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(x))
def export_grad(pallas_call, x):
    """Export of the gradient of a tiled elementwise kernel."""
    f = jax.jit(jax.grad(lambda a: jnp.sum(_tiled_sin(pallas_call, a))))
    return jax.export.export(f)(x).call(x)


@case("export/scratch_and_grid",
      tags={"export", "scratch", "sequential_grid", "carry_across_blocks"},
      inputs=lambda rng: (randn(rng, (32, C)),), reference=_ref_running_sum,
      tolerance={"float32": (1e-5, 1e-5)})
def export_scratch(pallas_call, x):
    """Export of a grid kernel with persistent scratch, serialized and deserialized."""
    f = jax.jit(lambda a: _running_sum(pallas_call, a))
    return jax.export.deserialize(jax.export.export(f)(x).serialize()).call(x)


# --- Backward passes with accumulation over grid axes ------------------------------------

def _k_matmul(pallas_call, x, w, rescale=None):
    """x @ w over an (i, j, k) grid of (8, 128) x (128, 128) blocks, accumulating into the
    output block along k; with ``rescale``, ``o = o * rescale + x @ w`` at every step."""
    def kernel(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        prod = jnp.dot(x_ref[...], w_ref[...], precision=HI)
        if rescale is None:
            o_ref[...] += prod
        else:
            o_ref[...] = o_ref[...] * rescale + prod

    (m, k), n = x.shape, w.shape[1]
    return pallas_call(kernel, out_shape=sds((m, n), x.dtype), grid=(m // 8, n // C, k // C),
                       in_specs=[pl.BlockSpec((8, C), lambda i, j, kk: (i, kk)),
                                 pl.BlockSpec((C, C), lambda i, j, kk: (kk, j))],
                       out_specs=pl.BlockSpec((8, C), lambda i, j, kk: (i, j)))(x, w)


def _rescaled_ref(x, w, rescale):
    o = jnp.zeros((x.shape[0], w.shape[1]), x.dtype)
    for kk in range(x.shape[1] // C):
        o = o * rescale + jnp.dot(x[:, kk * C:(kk + 1) * C], w[kk * C:(kk + 1) * C],
                                  precision=HI)
    return o


@case("grad/matmul_k_accumulation", tags={"grad", "dot", "sequential_grid"},
      inputs=lambda rng: (randn(rng, (16, 2 * C), scale=0.3),
                          randn(rng, (2 * C, 2 * C), scale=0.1)),
      reference=lambda x, w: jax.grad(_matmul_loss, argnums=(0, 1))(x, w),
      tolerance={"float32": (1e-4, 1e-4)})
def grad_k_matmul(pallas_call, x, w):
    """grad of a matmul that accumulates into its output along a k grid axis: each
    operand's cotangent sums over the grid axis its index map does not use."""
    return jax.grad(lambda a, b: jnp.sum(_k_matmul(pallas_call, a, b) ** 2),
                    argnums=(0, 1))(x, w)


@case("grad/rescaled_accumulator", tags={"grad", "dot", "sequential_grid"},
      inputs=lambda rng: (randn(rng, (16, 2 * C), scale=0.3),
                          randn(rng, (2 * C, 2 * C), scale=0.1)),
      reference=lambda x, w: jax.grad(
          lambda a, b: jnp.sum(_rescaled_ref(a, b, 0.5) ** 2), argnums=(0, 1))(x, w),
      tolerance={"float32": (1e-4, 1e-4)})
def grad_rescaled(pallas_call, x, w):
    """grad through an accumulator scaled at every k step (o = o * 0.5 + x @ w): the
    cotangent reaching an early step is scaled by the later ones."""
    return jax.grad(lambda a, b: jnp.sum(_k_matmul(pallas_call, a, b, 0.5) ** 2),
                    argnums=(0, 1))(x, w)
