"""Reverse and forward mode on mosaic_gpu: the backward kernels pallas-core generates
lower through this backend, and JVP kernels read their dot operands in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
from pallas_mosaic_gpu._src.lowering import build
from pallas_mosaic_gpu._src.lowering.engine import is_elementwise
from pallas_mosaic_gpu._src.lowering.spill import spill_buffers

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32
HI = jax.lax.Precision.HIGHEST


def _matmul_rows(x, w):
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], precision=HI)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), F32),
        grid=(x.shape[0] // 8,), backend="mosaic_gpu",
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                  pl.BlockSpec((128, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x, w)


def _calls(f, *args):
    found = []

    def walk(j):
        for e in j.eqns:
            if e.primitive is pl.pallas_call_p:
                found.append(e.params)
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return found


def test_grad_of_a_matmul_lowers_as_backward_kernels_for_cuda():
    x, w = jnp.zeros((16, 128), F32), jnp.zeros((128, 128), F32)
    loss = jax.grad(lambda a, b: jnp.sum(_matmul_rows(a, b) ** 2), argnums=(0, 1))
    with pl.grad_fallback("error"):
        calls = _calls(loss, x, w)
        text = jax.jit(loss).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    backward = [p for p in calls if "(backward," in p["name"]]
    assert len(backward) == 2  # dx and dw
    assert text.count("custom_call @mosaic_gpu_v2") == len(calls)


def test_a_jvp_kernel_reads_its_dot_operands_in_place():
    """The JVP kernel reads x, tx, w and tw before its dots: no SMEM copy of w or tw
    is reserved (two 64 KiB copies would not fit beside the four blocks)."""
    x, w = jnp.zeros((16, 128), F32), jnp.zeros((128, 128), F32)
    f = lambda a, b, ta, tb: jax.jvp(_matmul_rows, (a, b), (ta, tb))  # noqa: E731
    (p,) = _calls(f, x, w, x, w)
    spills = spill_buffers(p["jaxpr"].jaxpr, is_elementwise)
    assert all(b is None for _, bufs in spills for b in bufs)
    build(p["jaxpr"], p["grid_mapping"], None, "jvp")  # fits in SMEM
