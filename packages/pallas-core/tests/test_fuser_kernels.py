"""pallas.fuser end to end: a fusible matmul kernel whose producers and consumers are
fused into it by ``fuse``, run as an ordinary ``pallas_call`` in the interpreter."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas import fuser

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fused_matmul.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("pallas_core_example_fused_matmul", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()
# out = z_fn(x_fn() @ y_fn()), tiled (64, 128) with the whole K in each block: the
# example's kernel, so these tests specify what the example shows.
fusible_matmul = example.make_fusible_matmul(block=(64, 128), interpret=True)


def _operands(rng, m=128, k=64, n=256):
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    return x, y


def test_without_fusions_the_kernel_is_a_plain_matmul(rng):
    x, y = _operands(rng)
    out = jax.jit(fusible_matmul)(x, y)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-4)


def test_prologue_and_epilogue_are_fused_into_the_kernel(rng):
    x, y = _operands(rng)
    bias = jnp.asarray(rng.standard_normal((256,)), jnp.float32)

    def f(x, y, bias):
        z = fusible_matmul(jax.nn.relu(x) * 2.0, y)
        return jnp.tanh(z + bias[None, :]).astype(jnp.bfloat16)

    fused = jax.jit(fuser.fuse(f))
    jaxpr = jax.make_jaxpr(fuser.fuse(f))(x, y, bias)
    prims = {e.primitive.name for e in jaxpr.jaxpr.eqns}
    # Everything happens inside the one pallas_call: no relu, tanh or cast outside it.
    assert prims == {"pallas_call"}, prims
    out = fused(x, y, bias)
    assert out.dtype == jnp.bfloat16 and out.shape == (128, 256)
    np.testing.assert_allclose(out.astype(jnp.float32), f(x, y, bias).astype(jnp.float32),
                               rtol=2e-2, atol=2e-2)


def test_fusion_through_transpose_and_reshape(rng):
    x = jnp.asarray(rng.standard_normal((64, 2, 64)), jnp.float32)  # -> (128, 64)
    yt = jnp.asarray(rng.standard_normal((256, 64)), jnp.float32)   # -> (64, 256)

    def f(x, yt):
        return fusible_matmul(x.reshape(128, 64), yt.T)

    out = jax.jit(fuser.fuse(f))(x, yt)
    np.testing.assert_allclose(out, x.reshape(128, 64) @ yt.T, rtol=1e-5, atol=1e-4)


def test_a_fused_function_under_vmap_of_size_one(rng):
    x, y = _operands(rng)
    out = jax.vmap(fuser.fuse(lambda x, y: fusible_matmul(x, y) * 3.0))(x[None], y[None])
    np.testing.assert_allclose(out[0], (x @ y) * 3.0, rtol=1e-5, atol=1e-4)


def test_a_write_to_a_ref_must_depend_on_the_fusible_output(rng):
    # A write that does not depend on the kernel's output has no output fusion to run in
    # (in an input fusion it would run once per block); upstream refuses it too.
    x, y = _operands(rng, m=128, k=128, n=128)

    @jax.jit
    def independent_write(x, y):
        side = jax.new_ref(jnp.zeros_like(x))

        @fuser.fuse
        def f(x, y):
            side[...] = x * 2.0
            return fusible_matmul(x, y)

        return f(x, y), jax.ref.freeze(side)

    with pytest.raises(ValueError, match=r"`swap` at .* writes to a Ref .* must depend on an "
                                         r"output of the fusible"):
        independent_write(x, y)

    @fuser.fusible
    def whole_array_matmul(x_fn, y_fn, z_fn):
        # Calls its fusions on whole arrays: the output fusion, with its write, runs once.
        out = x_fn() @ y_fn()
        return out if z_fn is None else z_fn(out)

    @jax.jit
    def dependent_write(x, y):
        side = jax.new_ref(jnp.zeros_like(x))

        @fuser.fuse
        def f(x, y):
            out = whole_array_matmul(x, y)
            side[...] = out * 2.0
            return out

        return f(x, y), jax.ref.freeze(side)

    out, side = dependent_write(x, y)
    np.testing.assert_allclose(side, 2.0 * (x @ y), rtol=1e-5, atol=1e-4)


def test_unfusible_producer_names_the_primitive_and_block_spec(rng):
    x, y = _operands(rng)

    def f(x, y):
        return fusible_matmul(jnp.cumsum(x, axis=1), y)

    with pytest.raises(NotImplementedError, match=r"`cumsum`.*block_shape=\(64, 64\)"):
        fuser.fuse(f)(x, y)


def test_the_example_matches_plain_jax_and_lowers_for_every_installed_backend(capsys):
    assert example.main() == 0
    out = capsys.readouterr().out
    assert "interpret: one fused kernel (top-level primitives ['pallas_call'])" in out
    assert "triton (cuda): lowered to one kernel" in out
    assert "mosaic_tpu (tpu): lowered to one kernel" in out
