"""Embedding lookup and its gradient on TPU SparseCores.

    python examples/sparsecore_embedding.py

``embedding_lookup(table, ids)`` is ``table[ids]``: every vector subcore gathers its share
of the rows from HBM with one indexed DMA. ``embedding_grad(grads, ids, vocab)`` is
``zeros((vocab, dim)).at[ids].add(grads)``, the gradient of the lookup with respect to the
table: every vector subcore owns a range of table rows, zeroes it in a ``VMEM_SHARED``
accumulator, scatter-adds into it the gradient rows whose ids fall in its range (the
others are masked with ``plsc.Indices(..., ignored_value=-1)``; repeated ids add up), and
copies its range out. No two subcores write the same row, so no synchronisation is
needed. (The TPU compiler takes scatter-adds into ``VMEM_SHARED``, not into HBM.) Both
kernels use SparseCore tiling (``use_tc_tiling_on_sc=False``): the rows are narrower than
the 128 elements an indexed DMA moves under TensorCore tiling.

The script runs both in the interpreter on CPU, compares them with plain JAX, and lowers
them for a TPU SparseCore (no TPU needed), printing the Mosaic ops used; with libtpu
installed (``pallas-tpu[compile]``) ``pallas_tpu.compile`` compiles them for a chip.
"""

from __future__ import annotations

import collections
import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pallas as pl  # noqa: E402
import pallas_tpu as pltpu  # noqa: E402
import pallas_tpu_sparsecore as plsc  # noqa: E402

SC_TILING = pltpu.CompilerParams(use_tc_tiling_on_sc=False)


def _mesh():
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")


def _worker(mesh):
    """This vector subcore's number, 0 .. mesh.size - 1."""
    return lax.axis_index("core") * mesh.num_subcores + lax.axis_index("subcore")


@functools.partial(jax.jit, static_argnames=("interpret",))
def embedding_lookup(table, ids, *, interpret=False):
    """``table[ids]`` for a (vocab, dim) table and int32 ids of shape (batch,)."""
    mesh = _mesh()
    (batch,), (_, dim) = ids.shape, table.shape
    per = batch // mesh.size
    if per * mesh.size != batch:
        raise ValueError(f"batch ({batch}) must be a multiple of the {mesh.size} subcores")

    @functools.partial(
        pl.kernel, mesh=mesh, interpret=interpret, compiler_params=SC_TILING,
        out_type=jax.ShapeDtypeStruct((batch, dim), table.dtype),
        scratch_types=[pltpu.VMEM((per,), jnp.int32), pltpu.VMEM((per, dim), table.dtype),
                       pltpu.SemaphoreType.DMA])
    def kernel(table_hbm, ids_hbm, out_hbm, ids_v, rows_v, sem):
        part = pl.ds(_worker(mesh) * per, per)
        pltpu.sync_copy(ids_hbm.at[part], ids_v)
        pltpu.async_copy(table_hbm.at[ids_v], rows_v, sem).wait()  # gather rows
        pltpu.sync_copy(rows_v, out_hbm.at[part])

    return kernel(table, ids)


@functools.partial(jax.jit, static_argnames=("vocab", "interpret"))
def embedding_grad(grads, ids, vocab: int, *, interpret=False):
    """``zeros((vocab, dim)).at[ids].add(grads)`` for grads (batch, dim) and ids (batch,).

    ``dim`` is one vector register (``plsc.get_sparse_core_info().num_lanes``) so that a
    row is zeroed with one store.
    """
    mesh = _mesh()
    lanes = plsc.get_sparse_core_info().num_lanes
    (batch, dim) = grads.shape
    own = vocab // mesh.size  # table rows per subcore
    if own * mesh.size != vocab or batch % lanes or dim != lanes:
        raise ValueError(f"vocab ({vocab}) must be a multiple of the {mesh.size} subcores, "
                         f"batch ({batch}) of the {lanes} lanes, and dim ({dim}) = {lanes}")

    @functools.partial(
        pl.kernel, mesh=mesh, interpret=interpret, compiler_params=SC_TILING,
        out_type=jax.ShapeDtypeStruct((vocab, dim), grads.dtype),
        scratch_types=[pltpu.VMEM((batch,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32),
                       pltpu.VMEM((lanes, dim), grads.dtype),
                       pltpu.VMEM((own, dim), grads.dtype),
                       pltpu.VMEM_SHARED((vocab, dim), grads.dtype), pltpu.SemaphoreType.DMA])
    def kernel(grads_hbm, ids_hbm, out_hbm, ids_v, mine_v, rows_v, own_v, acc, sem):
        lo = _worker(mesh) * own

        @pl.loop(0, own)
        def _(r):
            own_v[r] = jnp.zeros((dim,), grads.dtype)

        pltpu.sync_copy(own_v, acc.at[pl.ds(lo, own)])
        pltpu.sync_copy(ids_hbm, ids_v)

        @pl.loop(0, batch // lanes)
        def _(j):
            chunk = pl.ds(j * lanes, lanes)
            i = ids_v[chunk]
            mine_v[...] = jnp.where((i >= lo) & (i < lo + own), i, -1)
            pltpu.sync_copy(grads_hbm.at[chunk], rows_v)
            pltpu.async_copy(rows_v, acc.at[plsc.Indices(mine_v, ignored_value=-1)],
                             sem, add=True).wait()

        pltpu.sync_copy(acc.at[pl.ds(lo, own)], own_v)
        pltpu.sync_copy(own_v, out_hbm.at[pl.ds(lo, own)])

    return kernel(grads, ids)


def inputs(vocab=512, batch=256, seed=0):
    dim = plsc.get_sparse_core_info().num_lanes
    kt, ki, kg = jax.random.split(jax.random.key(seed), 3)
    table = jax.random.normal(kt, (vocab, dim), jnp.float32)
    ids = jax.random.randint(ki, (batch,), 0, vocab, jnp.int32)
    grads = jax.random.normal(kg, (batch, dim), jnp.float32)
    return table, ids, grads


def lookup_reference(table, ids):
    return table[ids]


def grad_reference(grads, ids, vocab):
    return jnp.zeros((vocab, grads.shape[1]), grads.dtype).at[ids].add(grads)


def mosaic_backend_configs(lowered) -> list:
    """The backend configs of the ``tpu_custom_call``s of a lowered function."""
    from pallas_tpu.inspect import backend_configs

    return backend_configs(lowered)


def main() -> int:
    from pallas_tpu.inspect import mosaic_modules, op_names

    vocab = 512
    table, ids, grads = inputs(vocab)
    ok = True
    for name, run, ref, args in [
        ("embedding_lookup", embedding_lookup, lookup_reference, (table, ids)),
        ("embedding_grad", functools.partial(embedding_grad, vocab=vocab),
         functools.partial(grad_reference, vocab=vocab), (grads, ids)),
    ]:
        got = run(*args, interpret=True)
        err = float(np.max(np.abs(np.asarray(got) - np.asarray(ref(*args)))))
        ok &= err <= 1e-5
        lowered = jax.jit(run).trace(*args).lower(lowering_platforms=("tpu",))
        (module,) = mosaic_modules(lowered)
        ops = collections.Counter(op_names(module))
        core = "sc_vector_subcore" if "sc_vector_subcore" in str(module) else "?"
        shown = [k for k in ops if k.startswith("tpu.") and "dma" in k or k == "scf.for"]
        print(f"{name}: interpret max err {err:.1e}; lowered for TPU ({core}, "
              f"{sum(ops.values())} ops): " + ", ".join(f"{k} x{ops[k]}" for k in shown))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
