"""Kernel fusion (``pallas.fuser``): kernels written once, with the ``jax.numpy`` code
around them fused into their blocks by ``fuser.fuse``. Each case is one ``pallas_call``
whose body evaluates the fused prologue and epilogue block by block."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas import fuser
from pallas_conformance.registry import case, randn

HI = lax.Precision.HIGHEST
F32 = jnp.float32
_TOL = {"float32": (1e-4, 1e-4)}


def _pulled(fusion, block_spec):
    """A fusion read in blocks of ``block_spec``: (kernel_fn, value block specs, values)."""
    fn, values, _ = fuser.get_fusion_values(fusion)
    kernel_fn, (specs,), _ = fuser.pull_block_spec(
        fn, block_spec, grid_len=2,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values)
    return kernel_fn, specs, values


def _output_fusion(z_fn, acc_type, acc_spec):
    """The epilogue: (kernel_fn, value block specs, values, out specs, out shapes)."""
    out_specs = fuser.push_block_spec(z_fn, acc_spec)(acc_type)
    fn, values, _ = fuser.get_fusion_values(z_fn, acc_type)
    kernel_fn, (specs, _), _ = fuser.pull_block_spec(
        fn, out_specs, grid_len=2,
        scalar_prefetch_handler=fuser.make_scalar_prefetch_handler())(values, acc_type)
    return kernel_fn, specs, values, out_specs, jax.eval_shape(z_fn, acc_type)


def _load(refs):
    return jax.tree.map(lambda r: r[...], refs)


def fusible_matmul(pallas_call, *, bm=64, bn=128):
    """A fusible ``z_fn(x_fn() @ y_fn())`` over (bm, bn) blocks, the whole K per block."""

    @fuser.fusible
    def matmul(x_fn, y_fn, z_fn):
        (m, k), (_, n) = x_fn.shape, y_fn.shape
        x_kernel, x_specs, x_values = _pulled(x_fn, pl.BlockSpec((bm, k), lambda i, j: (i, 0)))
        y_kernel, y_specs, y_values = _pulled(y_fn, pl.BlockSpec((k, bn), lambda i, j: (0, j)))
        trivial = z_fn is None
        if trivial:
            z_fn = lambda acc: (acc,)  # noqa: E731
        z_kernel, z_specs, z_values, out_specs, out_shape = _output_fusion(
            z_fn, jax.ShapeDtypeStruct((m, n), F32),
            pl.BlockSpec((bm, bn), lambda i, j: (i, j)))

        def kernel(x_refs, y_refs, z_refs, *o_refs):
            pids = (pl.program_id(0), pl.program_id(1))
            acc = jnp.dot(x_kernel(pids, (), _load(x_refs)), y_kernel(pids, (), _load(y_refs)),
                          precision=HI, preferred_element_type=F32)
            for o_ref, out in zip(o_refs, z_kernel(pids, (), _load(z_refs), acc)):
                o_ref[...] = out

        out = pallas_call(kernel, out_shape=out_shape, grid=(m // bm, n // bn),
                          in_specs=[x_specs, y_specs, z_specs],
                          out_specs=out_specs)(x_values, y_values, z_values)
        return out[0] if trivial else out

    return matmul


def _mlp_reference(x, w, bias):
    return jnp.tanh(jnp.dot(jax.nn.relu(x) * 2.0, w, precision=HI) + bias[None, :])


@case("fusion/matmul_prologue_epilogue", tags={"fusion", "dot", "broadcasting"},
      inputs=lambda rng: (randn(rng, (64, 64)), randn(rng, (64, 256), scale=0.125),
                          randn(rng, (256,))),
      reference=_mlp_reference, tolerance=_TOL)
def matmul_prologue_epilogue(pallas_call, x, w, bias):
    """relu(x) * 2 fused before a matmul; + bias and tanh fused after it."""
    matmul = fusible_matmul(pallas_call)
    return fuser.fuse(lambda x, w, b: jnp.tanh(matmul(jax.nn.relu(x) * 2.0, w) + b[None, :]))(
        x, w, bias)


@case("fusion/matmul_through_reshape_transpose", tags={"fusion", "dot"},
      inputs=lambda rng: (randn(rng, (2, 32, 128)), randn(rng, (256, 128), scale=0.125)),
      reference=lambda x, wt: jnp.dot(x.reshape(64, 128), wt.T, precision=HI) * 0.5,
      tolerance=_TOL)
def matmul_through_reshape_transpose(pallas_call, x, wt):
    """The operands reach the kernel through a reshape and a transpose; a scale after."""
    matmul = fusible_matmul(pallas_call)
    return fuser.fuse(lambda x, wt: matmul(x.reshape(64, 128), wt.T) * 0.5)(x, wt)
