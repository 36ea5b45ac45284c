"""Arrays in a tiled register layout (WGMMA's, its rows): ``plgpu.layout_cast``, and
elementwise ops, row reductions, broadcasts back, casts and loop carries that keep the
layout with no shared memory; ``pl.run_state`` over ``plgpu.ACC.init``; an
``optimization_barrier``. The numbers are checked by executing the generated module
(the emulate level's executor)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src import executor
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32
TILED_F32 = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
ROWS = plgpu.Layout.WGMMA.reduce(1)


def _kernel(body, out_shape, *args, **kw):
    f = pl.pallas_call(body, out_shape=out_shape, backend="mosaic_gpu",
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * len(args),
                       out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), **kw)
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return f, build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")


def _tiles(compute, shape=(64, 64)):
    """x -> tiled, swizzled SMEM (TMA) -> ``compute(x_smem[...])`` (WGMMA layout) -> the
    same SMEM -> GMEM."""

    def kernel(x_gmem, o_gmem):
        def body(buf, bar):
            plgpu.copy_gmem_to_smem(x_gmem, buf, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            buf[...] = compute(buf[...])
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM(shape, F32, transforms=TILED_F32), plgpu.Barrier())

    return kernel


def _run(kernel, x, **kw):
    from pallas_mosaic_gpu._src.executor import run_kernel

    f, k = _kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x, **kw)
    (out,) = run_kernel(k, [x])
    return f, k, out


def _softmax_rows(s):
    m = s.max(axis=1)
    p = jnp.exp2(s - lax.broadcast_in_dim(m, s.shape, [0]))
    return p / lax.broadcast_in_dim(p.sum(axis=1), s.shape, [0])


def test_a_row_softmax_of_a_wgmma_array_runs_in_registers_and_is_right():
    x = np.random.default_rng(0).standard_normal((64, 64), np.float32) * 4
    _, k, out = _run(_tiles(_softmax_rows), x)
    p = np.exp2(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(out, p / p.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    # The two row reductions (shuffles within warps) and the broadcasts need no SMEM:
    # only the tile and its barrier, not even the reduction scratch.
    assert k.smem_bytes <= 64 * 64 * 4 + 128


def test_a_row_statistic_carried_through_a_loop_keeps_its_layout():
    def compute(s):
        def step(i, carry):
            m, t = carry  # m: rows (entered as a splat), t: the tile (WGMMA)
            m = jnp.maximum(m, t.max(axis=1))
            return m, t * 0.5

        m0 = plgpu.layout_cast(jnp.full((64,), -jnp.inf, F32), ROWS)
        m, t = lax.fori_loop(0, 3, step, (m0, s))
        return t + lax.broadcast_in_dim(m, s.shape, [0])

    x = np.random.default_rng(1).standard_normal((64, 64), np.float32)
    _, _, out = _run(_tiles(compute), x)
    np.testing.assert_allclose(out, x / 8 + x.max(1, keepdims=True), rtol=1e-6)


def test_a_loop_entered_with_a_splat_is_emitted_again_in_the_bodys_layout():
    def compute(s):
        # The carry starts as a plain zero array; the body returns a WGMMA array.
        return lax.fori_loop(0, 2, lambda i, acc: acc + s, jnp.zeros(s.shape, F32))

    x = np.random.default_rng(2).standard_normal((64, 64), np.float32)
    _, _, out = _run(_tiles(compute), x)
    np.testing.assert_allclose(out, 2 * x, rtol=1e-6)


def test_layout_cast_of_a_splat_and_casts_between_float_widths_keep_the_layout():
    def compute(s):
        half = s.astype(jnp.float16).astype(F32)  # packed conversions, same layout
        return half + plgpu.layout_cast(jnp.full(s.shape, 1.0, F32), plgpu.Layout.WGMMA)

    x = np.random.default_rng(3).standard_normal((64, 64), np.float32)
    _, _, out = _run(_tiles(compute), x)
    np.testing.assert_allclose(out, x.astype(np.float16).astype(np.float32) + 1, rtol=1e-6)


def test_approx_math_makes_exp2_of_a_register_array_ex2_approx():
    kernel = _tiles(lambda s: jnp.exp2(s))
    x = np.zeros((64, 64), np.float32)
    f, _ = _kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                   compiler_params=plgpu.CompilerParams(approx_math=True))
    assert "ex2.approx" in jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()


def test_run_state_over_an_initialised_accumulator_and_closed_over_values_lowers():
    def compute(s):
        scale = s.max() * 0.0 + 2.0  # a value pl.run_state closes over

        def body(acc):
            acc[...] = acc[...] * scale

        return pl.run_state(body)(plgpu.ACC.init(s))

    x = np.zeros((64, 64), np.float32)
    f, k = _kernel(_tiles(compute), jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    assert "run_state" in k.primitives
    assert "mosaic_gpu_v2" in jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()


def test_an_optimization_barrier_passes_register_arrays_through():
    def compute(s):
        a, b = lax.optimization_barrier((s * 2, s.max(axis=1)))
        return a + lax.broadcast_in_dim(b, s.shape, [0])

    x = np.random.default_rng(4).standard_normal((64, 64), np.float32)
    _, k, out = _run(_tiles(compute), x)
    assert "optimization_barrier" in k.primitives
    np.testing.assert_allclose(out, 2 * x + x.max(1, keepdims=True), rtol=1e-6)


def test_a_broadcast_a_tiled_layout_cannot_make_is_refused_naming_the_layouts():
    def compute(s):
        col = s.max(axis=1)
        return s + lax.broadcast_in_dim(col, s.shape, [1])  # rows put on columns

    x = np.zeros((64, 64), np.float32)
    with pytest.raises(NotImplementedError, match=r"broadcasting a \(64,\) array"):
        _kernel(_tiles(compute), jax.ShapeDtypeStruct(x.shape, x.dtype), x)



def test_a_branch_returning_a_splat_yields_the_strided_registers_the_other_expects():
    def body(x_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = lax.cond(pl.program_id(0) == 0, lambda: jnp.zeros_like(x),
                              lambda: x * 2)

    x = np.random.default_rng(6).standard_normal((2, 8, 128), np.float32)
    from pallas_mosaic_gpu._src.executor import run_kernel

    spec = pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0))
    f = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, F32), grid=(2,),
                       in_specs=[spec], out_specs=spec, backend="mosaic_gpu")
    (eqn,) = [e for e in jax.make_jaxpr(f)(x).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    (out,) = run_kernel(build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k"),
                        [x])
    np.testing.assert_allclose(out, np.stack([np.zeros_like(x[0]), 2 * x[1]]), rtol=1e-6)


def _if_result_types(k) -> list[list[str]]:
    """The result types of every ``scf.if`` in kernel ``k``'s module."""
    import re

    from pallas_mosaic_gpu._src.executor.launch import module_of

    out = []
    for line in str(module_of(k)).splitlines():
        m = re.search(r"= scf\.if .* -> \((.*)\) \{$", line)
        if m:
            out.append([t.strip() for t in m.group(1).split(",")])
    return out


def test_branches_returning_wgmma_arrays_keep_the_layout():
    """lax.switch whose branches return the tile in the WGMMA layout, or a splat (made
    WGMMA too): the results are yielded as the WGMMA fragments (16 vector<2xf32> per
    thread for 64x64 f32), not converted to the strided layout and back. Each branch
    is taken once (the index is a runtime value)."""
    branches = [lambda s: s * 2, lambda s: jnp.zeros_like(s), lambda s: s + 1]

    def compute(s):
        i = pl.program_id(0)
        a, b, c = (lax.switch(i + k, branches, s) for k in range(3))
        return a + 10 * b + 100 * c

    x = np.random.default_rng(7).standard_normal((64, 64), np.float32)
    _, k, out = _run(_tiles(compute), x, grid=(1,))
    np.testing.assert_allclose(out, 2 * x + 100 * (x + 1), rtol=1e-6)
    ifs = _if_result_types(k)
    assert ifs and all(t == ["vector<2xf32>"] * 16 for t in ifs), ifs


def test_a_cond_in_a_loop_over_a_wgmma_carry_and_a_select_keep_the_layout():
    """The loop carry and the branch results settle on WGMMA together (the cond is
    emitted again inside each emission of the loop); ``jnp.where`` is a select."""
    def compute(s):
        t = lax.fori_loop(0, 2, lambda i, c: lax.cond(i == 0, lambda: c * 2, lambda: c + 1),
                          s)
        return jnp.where(pl.program_id(0) == 0, t, s)

    x = np.random.default_rng(9).standard_normal((64, 64), np.float32)
    _, k, out = _run(_tiles(compute), x, grid=(1,))
    np.testing.assert_allclose(out, 2 * x + 1, rtol=1e-6)
    assert all(t == ["vector<2xf32>"] * 16 for t in _if_result_types(k))


def test_a_branch_result_whose_layouts_cannot_meet_is_refused_naming_them():
    """One branch returns the tile in the WGMMA layout, the other an iota in the
    strided layout, which Mosaic GPU cannot convert to WGMMA's in registers."""
    def compute(s):
        return lax.cond(pl.program_id(0) == 0, lambda: s,
                        lambda: lax.broadcasted_iota(F32, s.shape, 1))

    x = np.zeros((64, 64), np.float32)
    with pytest.raises(Exception, match=r"(?s)lax.cond on the mosaic_gpu backend: .*cannot meet.*"
                       r"WGStridedFragLayout.* to TiledLayout"):
        _kernel(_tiles(compute), jax.ShapeDtypeStruct(x.shape, x.dtype), x, grid=(1,))


@pytest.mark.parametrize("layout", [plgpu.Layout.WG_STRIDED((128,), 1),
                                    plgpu.Layout.WG_STRIDED((128,), vec_size=1),
                                    plgpu.Layout.WG_STRIDED(shape=(128,), vec_size=1)])
def test_wg_strided_takes_its_shape_and_vector_size_positionally_or_by_keyword(layout):
    """A (128,) row loaded in the strided layout of width 1, broadcast to (64, 128)."""
    def body(x_ref, o_ref):
        row = plgpu.load(x_ref, (), layout=layout)
        o_ref[...] = lax.broadcast_in_dim(row, (64, 128), (1,))

    x = np.arange(128, dtype=np.float32)
    _, k = _kernel(body, jax.ShapeDtypeStruct((64, 128), F32), x)
    (out,) = executor.run_kernel(k, [x])
    np.testing.assert_array_equal(out, np.broadcast_to(x, (64, 128)))
