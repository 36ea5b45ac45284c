"""What the lowering emits so that Mosaic's own compiler (libtpu) accepts it: structural
checks on the emitted modules, one per kind of module Mosaic used to reject. (The
conformance catalogue, compiled by libtpu at its ``compile`` level, is the check that
Mosaic accepts them; these tests pin what the lowering emits and run without libtpu.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
from pallas.plugins import KernelRequest
from pallas_conformance import pallas_call_eqns
from pallas_tpu._src.backend import MOSAIC_TPU

F32 = jnp.float32


def _main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and str(op.attributes["sym_name"]) == '"main"':
            return op
    raise AssertionError("no @main")


def emulate(f, *args):
    """The generated module of ``f``'s single ``pallas_call``, run by the executor."""
    (eqn,) = pallas_call_eqns(jax.make_jaxpr(f)(*args))
    request = KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return MOSAIC_TPU.emulate(request, *args)


def _funcs(module):
    return [str(op.attributes["sym_name"]) for op in module.body.operations
            if op.operation.name == "func.func"]


def test_a_kernel_without_a_grid_has_no_iteration_bounds_or_windows(lower_tpu):
    # Mosaic rejects window attributes without iteration bounds ("window attributes can
    # only be specified when explicit iteration_bounds are used").
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    x = jnp.ones((8, 128), F32)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32))(x)
    _, (m,) = lower_tpu(f, x)
    attrs = _main(m).attributes
    assert "iteration_bounds" not in attrs and "window_params" not in attrs
    assert str(attrs["dimension_semantics"]) == "[]"
    assert _funcs(m) == ['"main"']
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(got, x * 2)


def test_a_kernel_without_a_grid_but_a_partial_block_runs_on_a_one_step_grid(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    x = jnp.arange(16 * 128, dtype=F32).reshape(16, 128)
    f = lambda x: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        in_specs=[pl.BlockSpec((8, 128), lambda: (1, 0))])(x)
    _, (m,) = lower_tpu(f, x)
    attrs = _main(m).attributes
    assert str(attrs["iteration_bounds"]) == "array<i64: 1>"
    assert len(list(attrs["window_params"])) == 2
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(got, x[8:] + 1)


def test_bool_refs_hold_int32_and_bools_cross_the_call_as_int32(lower_tpu):
    # Mosaic cannot lay out 1-bit memrefs ("layout too complicated"); as upstream, a bool
    # ref holds int32, loads compare with 0 and stores widen.
    def kernel(m_ref, x_ref, o_ref, b_ref):
        m = m_ref[...]
        o_ref[...] = jnp.where(m, x_ref[...], 0.0)
        b_ref[...] = jnp.logical_not(m)

    m = (jnp.arange(8 * 128).reshape(8, 128) % 3) == 0
    x = jnp.ones((8, 128), F32)
    f = lambda m, x: pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct(x.shape, F32),
                           jax.ShapeDtypeStruct(x.shape, jnp.bool_)))(m, x)
    lowered, (mod,) = lower_tpu(f, m, x)
    args = list(_main(mod).regions[0].blocks[0].arguments)
    assert [str(a.type).split(",")[0] for a in args] == [
        "memref<8x128xi32", "memref<8x128xf32", "memref<8x128xf32", "memref<8x128xi32"]
    assert "tensor<8x128xi1>" not in lowered.as_text().split("tpu_custom_call")[1].split(
        "\n")[0]
    o, b = emulate(f, m, x)
    np.testing.assert_array_equal(o, np.where(m, 1.0, 0.0))
    assert b.dtype == jnp.bool_
    np.testing.assert_array_equal(b, ~np.asarray(m))


def test_generic_any_scratch_and_run_scoped_buffers_live_in_vmem(lower_tpu):
    # pl.ANY scratch is the backend's choice; Mosaic can neither infer the memory space
    # of an `any` scratch operand nor memref.alloca one.
    def kernel(x_ref, o_ref, acc_ref):
        acc_ref[...] = x_ref[...]

        def body(tmp):
            tmp[...] = acc_ref[...] * 2
            o_ref[...] = tmp[...]

        pl.run_scoped(body, pl.ANY((8, 128), F32))

    x = jnp.ones((8, 128), F32)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, F32),
                                 scratch_shapes=[pl.ANY((8, 128), F32)])(x)
    _, (m,) = lower_tpu(f, x)
    text = str(m)
    assert "#tpu.memory_space<any>" not in text
    assert "memref.alloca() : memref<8x128xf32, #tpu.memory_space<vmem>>" in text
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(got, x * 2)


def test_argmax_accumulates_from_the_neutral_element(lower_tpu):
    # Mosaic takes only the neutral element as a reduction's splat accumulator.
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.argmax(x_ref[...], axis=1).astype(jnp.int32)

    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 128)), F32)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.int32))(x)
    _, (m,) = lower_tpu(f, x)
    assert "dense<2147483647> : vector<8xi32>" in str(m)
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))


def test_bf16_dots_carry_no_fp32_contract_precision(lower_tpu):
    # Mosaic rejects fp32 contract precision for bf16 operands ("Bad lhs type").
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=jax.lax.Precision.HIGHEST,
                             preferred_element_type=F32)

    x = jnp.ones((8, 128), jnp.bfloat16)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 8), F32))(x, x.T)
    _, (m,) = lower_tpu(f, x)
    assert "tpu.matmul" in str(m) and "contract_precision" not in str(m)


def test_comparisons_use_what_mosaic_compares(lower_tpu):
    # Mosaic rejects unordered float predicates ("Unsupported comparison direction:
    # une"), compares no i1 vectors and, on v5e/v6e, no i8 ones.
    def kernel(x_ref, b_ref, i_ref, o_ref):
        x, b, i = x_ref[...], b_ref[...], i_ref[...]
        ne = x != 2.0
        nan = jnp.isnan(x)
        lt_b = b < ne
        eq_b = b == nan
        gt_i8 = i > jnp.int8(3)
        o_ref[...] = (ne.astype(jnp.int32) + 2 * nan + 4 * lt_b + 8 * eq_b + 16 * gt_i8)

    x = jnp.asarray(np.tile([1.0, 2.0, np.nan, -4.0], (8, 32)), F32)
    b = (jnp.arange(8 * 128).reshape(8, 128) % 3) == 0
    i = (jnp.arange(8 * 128).reshape(8, 128) % 7 - 3).astype(jnp.int8)
    f = lambda x, b, i: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32))(x, b, i)
    _, (m,) = lower_tpu(f, x, b, i)
    text = str(m)
    assert "une" not in text and "uno" not in text
    assert "xi1>, vector<8x128xi1>" not in text.split("arith.cmpi")[-1].split("\n")[0]
    for line in text.splitlines():
        if "arith.cmpi" in line:
            assert "xi32>" in line, line
    (got,) = emulate(f, x, b, i)
    xn, bn, in_ = np.asarray(x), np.asarray(b), np.asarray(i)
    ne, nan = xn != 2.0, np.isnan(xn)
    want = ne + 2 * nan + 4 * (bn < ne) + 8 * (bn == nan) + 16 * (in_ > 3)
    np.testing.assert_array_equal(got, want)


def test_float16_is_computed_as_float32_and_crosses_the_call_as_float32(lower_tpu):
    # Mosaic has no f16 vectors ("Invalid vector type for load"): f16 refs hold f32, f16
    # values are f32, and the custom call converts operands and results.
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...]) + x_ref[...]

    x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 8)), jnp.float16)
    f = lambda x, y: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape,
                                                                           jnp.float16))(x, y)
    lowered, (m,) = lower_tpu(f, x, x)
    assert "f16" not in str(m)
    call = lowered.as_text().split("tpu_custom_call")[1].split("\n")[0]
    assert "f16" not in call
    (got,) = emulate(f, x, x)
    assert got.dtype == jnp.float16
    want = np.asarray(x, np.float32) @ np.asarray(x, np.float32) + np.asarray(x, np.float32)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-3, atol=2e-3)


def test_bitcasting_float16_is_a_clear_error(lower_tpu):
    def kernel(x_ref, o_ref):
        o_ref[...] = jax.lax.bitcast_convert_type(x_ref[...], jnp.int16)

    x = jnp.ones((8, 128), jnp.float16)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int16))(x)
    with pytest.raises(Exception, match="float16 as float32"):
        lower_tpu(f, x)


def test_narrow_integer_arithmetic_runs_in_i32_and_wraps(lower_tpu):
    # v5e/v6e do no 8-bit vector arithmetic ("Only vector<i32> ... are supported") and
    # no unsigned max/min or reductions: widened to i32 (beyond upstream, which asks the
    # user to cast), truncated back, so results wrap as the narrow ops would.
    def kernel(x_ref, u_ref, o_ref, m_ref, a_ref):
        x = x_ref[...]
        o_ref[...] = x * x + jnp.abs(x) - (x >> 1)
        m_ref[...] = jnp.maximum(u_ref[...], jnp.uint32(1 << 31))
        a_ref[...] = jnp.argmax(u_ref[...], axis=1).astype(jnp.int32)

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.integers(-128, 128, (8, 128)), jnp.int8)
    u = jnp.asarray(rng.integers(0, 1 << 32, (8, 128), dtype=np.uint64), jnp.uint32)
    f = lambda x, u: pl.pallas_call(kernel, out_shape=(
        jax.ShapeDtypeStruct(x.shape, jnp.int8), jax.ShapeDtypeStruct(u.shape, jnp.uint32),
        jax.ShapeDtypeStruct((8,), jnp.int32)))(x, u)
    _, (m,) = lower_tpu(f, x, u)
    text = str(m)
    for op in ("arith.muli", "arith.addi", "arith.subi", "arith.shrsi", "math.absi"):
        for line in text.splitlines():
            if op in line:
                assert "xi32>" in line and "xi8>" not in line, line
    assert "maxui" not in text and "minui" not in text
    o, mx, am = emulate(f, x, u)
    xn, un = np.asarray(x), np.asarray(u)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(o, xn * xn + np.abs(xn) - (xn >> 1))
    np.testing.assert_array_equal(mx, np.maximum(un, np.uint32(1 << 31)))
    np.testing.assert_array_equal(am, np.argmax(un, axis=1))


def test_math_mosaic_cannot_legalize_is_expanded_and_accurate(lower_tpu):
    # "failed to legalize operation 'math.acos'" (and the others): expanded into exp,
    # log, log1p, sqrt, atan2, erf; bf16 transcendentals are computed in f32.
    fns = [jnp.arccos, jnp.arcsin, jnp.arctan, jnp.arcsinh, jnp.arctanh, jnp.cbrt,
           jnp.sinh, jnp.cosh, jnp.expm1, jax.scipy.special.erfc,
           lambda x: jnp.arccosh(1 + jnp.abs(x) * 4),
           lambda x: jnp.where(jnp.isfinite(x), x, 0.0),
           lambda x: x ** jnp.int32(3),
           lambda x: jnp.prod(x + 1.0, axis=0, keepdims=True) + 0 * x]

    def kernel(x_ref, o_ref):
        x = x_ref[...]
        for i, fn in enumerate(fns):
            o_ref[i] = fn(x)

    xs = np.linspace(-0.99, 0.99, 8 * 128, dtype=np.float32).reshape(8, 128)
    xs[0, :4] = [0.0, 1e-4, -3e-3, 0.4]
    x = jnp.asarray(xs)
    f = lambda x: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((len(fns), 8, 128), F32))(x)
    _, (m,) = lower_tpu(f, x)
    text = str(m)
    for op in ("acos", "asin", "atan ", "asinh", "acosh", "atanh", "cbrt", "sinh", "cosh",
               "expm1", "erfc", "isfinite", "fpowi"):
        assert f"math.{op}" not in text, op
    assert "<mul>" not in text
    (got,) = emulate(f, x)
    want = np.stack([np.asarray(fn(x)) for fn in fns])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def _copy(x, block, index_map, grid):
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
        in_specs=[pl.BlockSpec(block, index_map)], out_specs=pl.BlockSpec(block, index_map),
        backend="mosaic_tpu")(x)


def test_blocks_xla_cannot_tile_are_refused_at_trace_time():
    # CompileTimeMosaicMisalignedBlockAndTiling, caught before the compiler: a 1-D bf16
    # array is tiled by 256 elements; a squeezed second-to-last dim is a 1-row window.
    x = jnp.zeros((512,), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"last block dimension 128 must be divisible by "
                                         r"256.*rank-1 block of this dtype"):
        jax.eval_shape(lambda x: _copy(x, (128,), lambda i: (i,), (4,)), x)
    jax.eval_shape(lambda x: _copy(x, (256,), lambda i: (i,), (2,)), x)  # fine
    q = jnp.zeros((4, 2, 128), F32)
    with pytest.raises(ValueError, match="second-to-last block dimension 1 must be "
                                         "divisible by 8 or equal to the array dimension 2"):
        jax.eval_shape(lambda q: _copy(q, (None, None, 128), lambda s, h: (s, h, 0), (4, 2)), q)
    jax.eval_shape(lambda q: _copy(q, (None, 2, 128), lambda s: (s, 0, 0), (4,)), q)  # fine


def test_what_mosaic_does_not_implement_is_refused_as_unsupported(lower_tpu):
    # Lane-strided access outside a 128-lane ref, and int32 matmuls, which Mosaic rejects
    # at compile time: a clear error when lowering, which the conformance suite reads as
    # unsupported (pallas.plugins.LevelUnsupportedError).
    from pallas.plugins import LevelUnsupportedError

    x = jnp.zeros((8, 256), F32)
    f = lambda x: pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[:, pl.ds(0, 128, stride=2)]),
        out_shape=jax.ShapeDtypeStruct((8, 128), F32))(x)
    with pytest.raises(LevelUnsupportedError, match=r"stride 2\) along the last \(lane\)"):
        lower_tpu(f, x)
    i = jnp.zeros((8, 128), jnp.int32)
    g = lambda i: pl.pallas_call(
        lambda a_ref, o_ref: o_ref.__setitem__(..., jnp.dot(a_ref[...], a_ref[...].T)),
        out_shape=jax.ShapeDtypeStruct((8, 8), jnp.int32))(i)
    with pytest.raises(LevelUnsupportedError, match="dot_general of int32 operands"):
        lower_tpu(g, i)


def test_bf16_argmax_compares_in_f32(lower_tpu):
    # v6e: a bf16 max broadcast back for the compare is an "Invalid relayout" for Mosaic.
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.argmax(x_ref[...], axis=1, keepdims=True).astype(jnp.int32)

    x = jnp.asarray(np.random.default_rng(3).normal(size=(16, 128)), jnp.bfloat16)
    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 1), jnp.int32))(x)
    _, (m,) = lower_tpu(f, x)
    assert "<maximumf>" in str(m) and "[1] : vector<16x128xbf16>" not in str(m)
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(got[:, 0], np.argmax(np.asarray(x, np.float32), axis=1))
