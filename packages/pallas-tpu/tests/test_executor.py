"""The Mosaic executor runs the module the ``tpu_custom_call`` carries: DMAs land when
waited for, unknown ops are errors, and faults planted in the real lowering are caught by
the ``mosaic_tpu`` emulate level (while ``backend_interpret``, which never sees the
module, cannot catch them)."""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jaxlib.mlir import ir

import pallas as pl
import pallas_tpu as pltpu
from pallas.plugins import KernelRequest
from pallas_conformance import FAIL, PASS, CaseRunner, get_case, pallas_call_eqns
from pallas_tpu import executor
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.backend import MOSAIC_TPU, MosaicTpuBackend
from pallas_tpu._src.lowering import kernel as kernel_mod
from pallas_tpu._src.lowering import rules_arith, rules_tpu
from pallas_tpu._src.lowering.engine import RULES

F32 = jnp.float32
ANY = pltpu.MemorySpace.ANY


def emulate(backend, f, *args):
    """``backend.emulate`` on the single ``pallas_call`` of ``f``."""
    (eqn,) = pallas_call_eqns(jax.make_jaxpr(f)(*args))
    p = eqn.params
    request = KernelRequest.from_params(p, p["compiler_params"])
    return backend.emulate(request, *args)


# ------------------------------------------------------------------------------------
# Kernels the catalogue does not have: DMAs between HBM and VMEM.


def _double_buffered(x):
    def kernel(x_hbm, o_ref, buf, sem):
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = i % 2

        def copy(j, s):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(j * 8, 8)], buf.at[s], sem.at[s])

        @pl.when(i == 0)
        def _():
            copy(0, 0).start()

        @pl.when(i + 1 < n)
        def _():
            copy(i + 1, 1 - slot).start()

        copy(i, slot).wait()
        o_ref[...] = buf[slot] * 2.0

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec(memory_space=ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def _hbm_round_trip(x):
    def kernel(x_hbm, o_hbm):
        def body(buf, dma_sem, sem):
            pltpu.async_copy(x_hbm, buf, dma_sem).wait()
            pl.semaphore_signal(sem, 2)
            pl.semaphore_wait(sem, 2)
            buf[...] = buf[...] + 1.0
            pltpu.sync_copy(buf, o_hbm)

        pl.run_scoped(body, pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA,
                      pltpu.SemaphoreType.REGULAR)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[pl.BlockSpec(memory_space=ANY)],
                          out_specs=pl.BlockSpec(memory_space=ANY))(x)


def _column_sums(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(jnp.sum(x_ref[...], axis=0)[None, :], (8, 128))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32))(x)


def _x(shape):
    return jnp.asarray(np.random.default_rng(0).standard_normal(shape), F32)


def test_double_buffered_dma_runs_the_copies():
    x = _x((64, 128))
    (out,) = emulate(MOSAIC_TPU, _double_buffered, x)
    np.testing.assert_array_equal(out, x * 2)


def test_dma_semaphores_and_run_scoped():
    x = _x((8, 128))
    (out,) = emulate(MOSAIC_TPU, _hbm_round_trip, x)
    np.testing.assert_array_equal(out, x + 1)


def test_reduction_axis():
    x = _x((128, 128))
    (out,) = emulate(MOSAIC_TPU, _column_sums, x)
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(0), (8, 128)), rtol=1e-5, atol=1e-4)


def test_a_fori_loop_with_run_time_bounds_runs_its_steps():
    """The ``scf.for`` over i32 a run-time-bounded ``fori_loop`` lowers to runs steps
    lower..upper-1, and none when upper <= lower; a constant bound is a 0-d array in the
    executor, and the counter keeps its integer type."""
    def f(n, x):
        def kernel(n_ref, x_ref, o_ref):
            o_ref[...] = lax.fori_loop(n_ref[0], n_ref[1],
                                       lambda i, a: a + x_ref[...] * i.astype(F32),
                                       jnp.ones((8, 128), F32))
            o_ref[...] += lax.fori_loop(0, n_ref[0], lambda i, a: a + jnp.full(
                (8, 128), i, jnp.int32).astype(F32), jnp.zeros((8, 128), F32))

        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              in_specs=[smem, pl.BlockSpec((8, 128), lambda: (0, 0))],
                              backend="mosaic_tpu")(n, x)

    x = _x((8, 128))
    for lo, hi in ((2, 5), (5, 2)):
        (out,) = emulate(MOSAIC_TPU, f, jnp.asarray([lo, hi], jnp.int32), x)
        np.testing.assert_allclose(out, 1 + sum(range(lo)) + x * sum(range(lo, hi)), rtol=1e-5,
                                   atol=1e-6)


def test_an_unknown_op_is_an_error_naming_it():
    ctx = kernel_mod.new_context()
    with ctx, ir.Location.unknown():
        m = ir.Module.parse(
            "func.func @main(%o: memref<8x128xi32, #tpu.memory_space<vmem>>) attributes "
            "{dimension_semantics = [], iteration_bounds = array<i64>, scalar_prefetch = 0 "
            ": i64, scratch_operands = 0 : i64, window_params = [{}]} {\n"
            "  %c = arith.constant 10 : i32\n  \"tpu.delay\"(%c) : (i32) -> ()\n  return\n}")
        cfg = jc.backend_config_of(
            m, vmem_limit_bytes=None, cost_estimate=None, flags=None, allow_input_fusion=None,
            internal_scratch_in_bytes=None, collective_id=None, serialization_format=None)
    with pytest.raises(executor.ExecutorError, match="does not implement op 'tpu.delay'"):
        executor.run_custom_call(cfg.to_json(), [], [((8, 128), np.int32)])


# ------------------------------------------------------------------------------------
# Planted faults: throwaway backends whose lowering is the real one with one fault.


@contextlib.contextmanager
def _sub_as_add():
    saved = rules_arith._BINARY[lax.sub_p]
    rules_arith._BINARY[lax.sub_p] = (rules_arith.arith.addf,) + saved[1:]
    try:
        yield
    finally:
        rules_arith._BINARY[lax.sub_p] = saved


class _SwappedReturn:
    """``func`` with ``ReturnOp`` swapping the first two values (index maps' block
    indices; ``@main`` returns nothing)."""

    def __getattr__(self, name):
        return getattr(kernel_mod.func, name)

    @staticmethod
    def ReturnOp(vals):  # noqa: N802 - mirrors the binding's name
        vals = list(vals)
        if len(vals) >= 2:
            vals[0], vals[1] = vals[1], vals[0]
        return _FUNC.ReturnOp(vals)


_FUNC = kernel_mod.func


@contextlib.contextmanager
def _swapped_block_indices():
    kernel_mod.func = _SwappedReturn()
    try:
        yield
    finally:
        kernel_mod.func = _FUNC


def _reduce_other_axis():
    def wrong(saved):
        def rule(lctx, eqn, x):
            nd = len(eqn.invars[0].aval.shape)
            axes = tuple(nd - 1 - a for a in eqn.params["axes"])
            return saved(lctx, eqn.replace(params={**eqn.params, "axes": axes}), x)

        return rule

    return RULES.overridden(lax.reduce_sum_p, wrong)


def _no_dma_wait():
    from pallas_tpu._src.primitives import dma

    return RULES.overridden(dma.dma_wait_p, lambda saved: lambda lctx, eqn, *invals: [])


@dataclasses.dataclass
class FaultyBackend(MosaicTpuBackend):
    """``mosaic_tpu`` with a fault planted in its lowering while it emulates."""

    fault: object = None

    def emulate(self, *args, **kw):
        with self.fault():
            return super().emulate(*args, **kw)

    def interpret(self, *args, **kw):
        with self.fault():
            return super().interpret(*args, **kw)


def faulty(fault) -> FaultyBackend:
    fields = {f.name: getattr(MOSAIC_TPU, f.name) for f in dataclasses.fields(MOSAIC_TPU)}
    return FaultyBackend(**fields, fault=fault)


def _status(backend, case, level="emulate"):
    r = CaseRunner(backend).run(get_case(case), level)
    return r.status, r.detail


@pytest.mark.parametrize("case", ["elementwise/sub_f32", "kernels/layer_norm_f32"])
def test_float_subtract_lowered_as_add_is_caught(case):
    assert _status(MOSAIC_TPU, case)[0] == PASS
    status, detail = _status(faulty(_sub_as_add), case)
    assert status == FAIL and "differ" in detail
    # The backend-semantics level re-runs the jaxpr: it cannot see the fault.
    assert _status(faulty(_sub_as_add), case, "backend_interpret")[0] == PASS


@pytest.mark.parametrize("case", ["dot/accumulate_over_grid_i8_to_i32", "kernels/tiled_matmul_f32"])
def test_swapped_block_indices_are_caught(case):
    assert _status(MOSAIC_TPU, case)[0] == PASS
    assert _status(faulty(_swapped_block_indices), case)[0] == FAIL


def test_reduction_over_the_wrong_axis_is_caught():
    x = _x((128, 128))
    (good,) = emulate(MOSAIC_TPU, _column_sums, x)
    (bad,) = emulate(faulty(_reduce_other_axis), _column_sums, x)
    assert not np.allclose(good, bad, rtol=1e-3)
    np.testing.assert_allclose(good, np.broadcast_to(x.sum(0), (8, 128)), rtol=1e-5,
                               atol=1e-4)


def test_reduction_over_the_wrong_axis_fails_a_catalogue_case():
    assert _status(faulty(_reduce_other_axis), "reductions/sum_axis1_2d_f32")[0] == FAIL


@pytest.mark.parametrize("kernel", [_double_buffered, _hbm_round_trip])
def test_a_missing_dma_wait_is_caught(kernel):
    x = _x((64, 128) if kernel is _double_buffered else (8, 128))
    with pytest.raises(executor.ExecutorError, match="never waited|DMA"):
        emulate(faulty(_no_dma_wait), kernel, x)


def test_rule_tables_are_restored():
    assert rules_arith._BINARY[lax.sub_p][0] is rules_arith.arith.subf
    assert kernel_mod.func is _FUNC and rules_tpu is not None


@pytest.mark.parametrize("f8", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_float8_casts_run_and_round_to_nearest_even(f8):
    """The executor knows Mosaic's float8 element types (libtpu compiles these casts for
    v5e): 1.9 rounds up into the next binade in e4m3fn, ties go to even."""
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...].astype(f8).astype(F32)

    x = jnp.tile(jnp.asarray([1.9, 1.0625, 1.1875, -3.9, 0.0, 240.0, -1.5, 7.0] * 16, F32),
                 (8, 1))
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32))
    (out,) = emulate(MOSAIC_TPU, f, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x.astype(f8).astype(F32)))


def test_scalar_prefetch_operands_are_writable_state_across_grid_steps():
    """Scalar-prefetch operands live in SMEM for the whole grid: a kernel may keep state
    there (upstream's paged attention keeps its DMA buffer index and an init flag), and
    later steps read what was written, as in TPU interpret mode (upstream's too; plain
    ``interpret=True`` gives each step the operands' values, in both)."""
    def kernel(s_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + s_ref[0].astype(F32)
        s_ref[0] = s_ref[0] + pl.program_id(0) + 1  # 0, 1, 3, 6 at steps 0..3

    spec = pl.BlockSpec((8, 128), lambda i, s: (i, 0))

    def call(**kw):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((32, 128), F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(4,), in_specs=[spec], out_specs=spec), **kw)

    s, x = jnp.zeros((1,), jnp.int32), jnp.zeros((32, 128), F32)
    (out,) = emulate(MOSAIC_TPU, call(), s, x)
    np.testing.assert_array_equal(np.asarray(out)[::8, 0], [0, 1, 3, 6])
    tpu_interpret = call(interpret=pltpu.InterpretParams())(s, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(tpu_interpret))


def test_index_maps_see_scalar_prefetch_writes_one_point_late():
    """A TPU's pipeline works out a point's blocks (its index maps) before the previous
    point's body runs: an index map reading a prefetched scalar the kernel writes sees
    the value as it was when the previous point began, as in TPU interpret mode (and the
    core interpreter). Point t copies the block point t - 2 named (0 before that)."""
    def kernel(b_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]
        b_ref[0] = pl.program_id(0)

    def call(**kw):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((48, 128), F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(6,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, b: (b[0], 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, b: (i, 0))), **kw)

    b = jnp.zeros((1,), jnp.int32)
    x = jnp.repeat(jnp.arange(6, dtype=F32), 8)[:, None] * jnp.ones((1, 128), F32)
    (out,) = emulate(MOSAIC_TPU, call(), b, x)
    np.testing.assert_array_equal(np.asarray(out)[::8, 0], [0, 0, 0, 1, 2, 3])
    tpu_interpret = call(interpret=pltpu.InterpretParams())(b, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(tpu_interpret))
