"""The plugin, tensor cores in the PTX, the cuda lowering, and the errors."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_triton as pltriton


def test_plugin_is_discovered_through_its_entry_point():
    b = pallas.plugins.get_backend("triton")
    assert b.name == "triton" and b.package == "pallas-triton"
    assert b.version == pltriton.__version__
    assert "cuda" in b.platforms
    assert b.compiler_params_type is pltriton.CompilerParams
    assert {"lower", "compile", "emulate"} <= set(b.levels)
    assert "triton" in [x.name for x in pallas.plugins.list_backends()]


def test_compiler_params_select_the_backend():
    params = pltriton.CompilerParams(num_warps=8, num_stages=2)
    assert params.BACKEND == "triton"
    assert pallas.plugins.select_backend("cuda", compiler_params=params).name == "triton"
    assert pallas.plugins.select_backend("cuda", backend="triton").name == "triton"


def _matmul(bm, bn, bk, dtype=jnp.bfloat16, num_warps=4):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((2 * bm, 2 * bn), jnp.float32), grid=(2, 2),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j: (i, 0)),
                  pl.BlockSpec((bk, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps))
    a = jnp.ones((2 * bm, bk), dtype)
    b = jnp.ones((bk, 2 * bn), dtype)
    return f, (a, b)


def test_bf16_dot_uses_tensor_cores_on_sm80():
    f, args = _matmul(64, 64, 32)
    (k,) = pltriton.compile(f, *args, compute_capability=80)
    assert "mma.sync" in k.ptx
    assert k.uses_tensor_cores()


def test_bf16_dot_uses_wgmma_on_sm90():
    f, args = _matmul(64, 64, 32)
    (k,) = pltriton.compile(f, *args, compute_capability=90)
    assert "wgmma" in k.ptx


def test_inspect_shows_the_generated_kernel():
    f, args = _matmul(32, 32, 32)
    src = pltriton.inspect(f, *args)
    assert "tl.dot(" in src and "tl.program_id(0)" in src and "tl.program_id(1)" in src
    assert "out_dtype=tl.float32" in src


def test_non_power_of_two_block_is_rejected():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((24, 24), jnp.float32),
                       grid=(2,), in_specs=[pl.BlockSpec((12, 24), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((12, 24), lambda i: (i, 0)))
    with pytest.raises(NotImplementedError, match=r"pallas-triton.*power of two"):
        pltriton.inspect(f, jnp.zeros((24, 24)))


def test_unsupported_primitive_names_itself_backend_and_alternative():
    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sort(x_ref[...])

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32))
    with pytest.raises(NotImplementedError, match=r"'sort'.*Triton backend.*outside"):
        pltriton.inspect(f, jnp.zeros((16,)))


def test_small_and_integer_dots_fall_back_to_multiply_and_sum():
    for dtype in (jnp.float32, jnp.int32):
        f, args = _matmul(8, 8, 8, dtype=dtype)
        src = pltriton.inspect(f, *args)
        assert "tl.dot(" not in src and "tl.sum(" in src
        out = pltriton.emulate(f, *args)
        np.testing.assert_allclose(out, np.full((16, 16), 8.0))


@pytest.mark.parametrize(("m", "k", "n", "dtype"), [
    (8, 256, 128, jnp.int8),  # the quantised matmul of the conformance catalogue
    (128, 8, 64, jnp.bfloat16), (64, 256, 4, jnp.float16)])
def test_large_products_with_a_small_dimension_pad_to_a_tensor_core_dot(m, k, n, dtype):
    # As (M, K, N) and summed, an (8, 256) x (256, 128) int8 product kept AMD's LLVM
    # backend compiling for over 15 minutes; padded with zeros it is one tl.dot.
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=o_ref.dtype)

    acc = jnp.int32 if dtype == jnp.int8 else jnp.float32
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), acc))
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.integers(-8, 8, (m, k)), dtype)
    b = jnp.asarray(rng.integers(-8, 8, (k, n)), dtype)
    src = pltriton.inspect(f, a, b)
    assert "tl.dot(" in src and "tl.sum(" not in src
    want = jnp.dot(a, b, preferred_element_type=acc)  # exact: small integers
    np.testing.assert_array_equal(pltriton.emulate(f, a, b), want)


def test_input_output_aliases_in_emulation():
    def kernel(x_ref, o_ref):
        o_ref[0:8] = x_ref[0:8] + 1.0

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
                       input_output_aliases={0: 0})
    x = np.arange(16, dtype=np.float32)
    out = pltriton.emulate(f, x)
    np.testing.assert_array_equal(out, np.concatenate([x[:8] + 1, x[8:]]))


needs_cuda_plugin = pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda13_plugin") is None,
    reason="lowering for cuda needs jax-cuda13-plugin==0.10.2 (pallas-triton[cuda])")


@needs_cuda_plugin
def test_lowers_for_cuda_to_the_triton_kernel_call():
    f, args = _matmul(64, 64, 32)
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "stablehlo.custom_call @triton_kernel_call" in text
    assert "api_version = 2" in text


@needs_cuda_plugin
def test_exports_for_cuda():
    from jax import export

    f, args = _matmul(32, 32, 32)
    exp = export.export(
        jax.jit(f), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("triton_kernel_call")],
    )(*args)
    assert exp.platforms == ("cuda",)
    assert exp.serialize()


def test_elementwise_inline_asm_compiles():
    def kernel(x_ref, o_ref):
        (y,) = pltriton.elementwise_inline_asm(
            "shl.b32 $0, $1, 1;", args=[x_ref[...]], constraints="=r,r", pack=1,
            result_shape_dtypes=[jax.ShapeDtypeStruct((128,), jnp.int32)])
        o_ref[...] = y

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.int32))
    (k,) = pltriton.compile(f, jnp.zeros((128,), jnp.int32))
    assert "shl.b32" in k.ptx
    with pytest.raises(NotImplementedError, match="interpreter cannot execute PTX"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.int32),
                       interpret=True)(jnp.zeros((128,), jnp.int32))


def test_reduction_grid_axes_run_in_program(make_case):
    f, args = make_case("matmul_k_grid", False)
    (k,) = pltriton.lower(f, *args)
    assert k.grid == (2, 2, 3) and k.launch_grid == (2, 2, 1)
    assert "for step2_" in k.source


def _traced_fori(compiler_params=None):
    # A fori_loop whose trip count depends on program_id (as in causal attention).
    def kernel(x_ref, o_ref):
        i = pl.program_id(0)

        def body(j, acc):
            return acc + x_ref[pl.ds(j * 8, 8), :]

        o_ref[...] = jax.lax.fori_loop(0, i + 1, body, jnp.zeros((8, 16), jnp.float32))

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((32, 16), jnp.float32), grid=(4,),
        in_specs=[pl.BlockSpec((32, 16), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((8, 16), lambda i: (i, 0)), compiler_params=compiler_params)
    return f, jnp.arange(32 * 16, dtype=jnp.float32).reshape(32, 16)


def test_fori_loop_with_traced_bounds_is_a_for_loop():
    # Triton software-pipelines `for` loops, not `while` loops.
    f, x = _traced_fori()
    src = pltriton.inspect(f, x)
    assert "while " not in src and "in range(c" in src
    want = np.cumsum(np.asarray(x).reshape(4, 8, 16), axis=0).reshape(32, 16)
    np.testing.assert_allclose(np.asarray(pltriton.emulate(f, x)), want)
    np.testing.assert_allclose(np.asarray(f(x)), want)


def test_compile_targets_compiler_params_compute_capability():
    f, x = _traced_fori(pltriton.CompilerParams(compute_capability=90))
    (k,) = pltriton.compile(f, x)
    assert k.compute_capability == 90
    (k,) = pltriton.compile(f, x, compute_capability=80)
    assert k.compute_capability == 80


def _k_grid_matmul(final_reads_input: bool):
    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            extra = a_ref[:, :32] if final_reads_input else 0.0
            o_ref[...] = acc_ref[...] + extra

    f = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32), grid=(2, 2, 3),
        in_specs=[pl.BlockSpec((32, 32), lambda i, j, k: (i, k)),
                  pl.BlockSpec((32, 32), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((32, 32), lambda i, j, k: (i, j)),
        scratch_shapes=[pl.ANY((32, 32), jnp.float32)])
    a = jnp.arange(64 * 96, dtype=jnp.float32).reshape(64, 96) / 1000
    b = jnp.arange(96 * 64, dtype=jnp.float32).reshape(96, 64) / 1000
    return f, (a, b)


@pytest.mark.parametrize("final_reads_input", [False, True])
def test_final_k_step_store_is_emitted_after_the_loop(final_reads_input):
    f, args = _k_grid_matmul(final_reads_input)
    src = pltriton.inspect(f, *args)
    store_line = [ln for ln in src.splitlines() if "tl.store(" in ln][0]
    loop_line = [ln for ln in src.splitlines() if "for step" in ln][0]
    after_loop = len(store_line) - len(store_line.lstrip()) == (
        len(loop_line) - len(loop_line.lstrip()))
    # An input block moves along K: reading it in the final step keeps the store inside.
    assert after_loop is not final_reads_input
    np.testing.assert_allclose(np.asarray(pltriton.emulate(f, *args)), np.asarray(f(*args)),
                               rtol=1e-2)
    (k,) = pltriton.compile(f, *args, compute_capability=90)
    assert k.uses_tensor_cores()


def _unary_call(op, x):
    def kernel(x_ref, o_ref):
        o_ref[...] = op(x_ref[...])

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))


# At the poles the reflection divides by tan(pi x) == 0 before the NaN is selected.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_digamma_matches_xla_including_its_poles():
    # libdevice has no digamma: the backend generates one; XLA gives NaN at the poles.
    x = jnp.array([[0.0, -1.0, -2.0, 0.5, 1.0, 3.25, 20.0, -0.5] * 16] * 8, jnp.float32)
    f = _unary_call(jax.lax.digamma, x)
    got, want = np.asarray(pltriton.emulate(f, x)), np.asarray(jax.lax.digamma(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)


def test_sign_of_bf16_is_minus_one_for_negative_values():
    x = jnp.array([[-3.0, -0.5, 0.0, 2.0] * 32] * 8, jnp.bfloat16)
    got = np.asarray(pltriton.emulate(_unary_call(jnp.sign, x), x), np.float32)
    np.testing.assert_array_equal(got, np.asarray(jnp.sign(x), np.float32))


def test_a_ref_indexed_by_a_vector_of_indices_gathers_and_scatters():
    """``x_ref[idx]`` with a 1-D index vector (upstream's GPU layer norm loads columns
    this way) becomes pointer offsets from the vector, masked like any other access."""
    n = 300  # the last block of columns hangs over the row

    def kernel(x_ref, o_ref):
        cols = pl.program_id(0) * 128 + jnp.arange(128)
        valid = cols < n
        row = pl.load(x_ref.at[cols], mask=valid, other=0.0)
        pl.store(o_ref.at[cols], row * 2.0, mask=valid)

    x = jnp.arange(n, dtype=jnp.float32)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32), grid=(3,))
    assert "tl.load" in pltriton.inspect(f, x)
    np.testing.assert_array_equal(pltriton.emulate(f, x), 2 * x)
    pltriton.compile(f, x, compute_capability=80)


def test_a_ref_indexed_by_broadcast_row_and_column_vectors():
    """``x_ref.at[rows[:, None], cols[None]]`` (upstream's layer-norm backward reads its
    tiles this way): the broadcast index tensors are the offsets of each dimension."""
    def kernel(x_ref, o_ref):
        r, c = jnp.arange(8), jnp.arange(128)
        mask = (r[:, None] < 5) & (c[None] < 100)
        o_ref[...] = pl.load(x_ref.at[r[:, None], c[None]], mask=mask, other=-1.0)

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
    want = jnp.where((jnp.arange(8)[:, None] < 5) & (jnp.arange(128)[None] < 100), x, -1.0)
    np.testing.assert_array_equal(f(x), want)  # the interpreter
    np.testing.assert_array_equal(pltriton.emulate(f, x), want)
    pltriton.compile(f, x, compute_capability=90)


@pytest.mark.parametrize("name", [None, "triton", "tl"])
def test_a_kernel_named_by_a_keyword_or_a_module_name_lowers(name):
    # A lambda kernel is named "<lambda>": its def was `def lambda(...)`, a SyntaxError
    # (found by pallas.tuning, whose configs are often lambdas).
    x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                       out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                       in_specs=[spec], out_specs=spec, backend="triton", name=name)
    source = pltriton.inspect(f, x)
    assert f"def {name or 'lambda'}_kernel(" in source
    jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))
    np.testing.assert_array_equal(pltriton.emulate(f, x), x * 2)
