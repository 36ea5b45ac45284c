"""``pallas_call`` continued: ``pl.kernel``/``pl.core_map`` over a mesh, lowering to MLIR,
``jax.export``, ``pl.run_state``, cost estimates and named grids, checked against plain
JAX. Every kernel runs under the interpreter on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins  # noqa: F401 - pl.plugins

SDS = jax.ShapeDtypeStruct


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


# --------------------------------------------------------------------------------------
# pl.kernel and pl.core_map over a mesh


def _core_mesh(**axes):
    from pallas._src.mesh import CoreMesh  # the backend-neutral mesh of the interpreter

    return CoreMesh(**axes)


def test_kernel_runs_the_body_once_per_core_on_whole_refs():
    mesh = _core_mesh(core=4)
    x = jnp.arange(16, dtype=jnp.float32)

    @pl.kernel(out_type=SDS((16,), jnp.float32), mesh=mesh, interpret=True)
    def double_by_core(x_ref, o_ref):
        assert x_ref.shape == (16,)
        c = jax.lax.axis_index("core")
        o_ref[pl.ds(c * 4, 4)] = x_ref[pl.ds(c * 4, 4)] * 2 + c.astype(jnp.float32)

    out = double_by_core(x)
    np.testing.assert_array_equal(out, np.arange(16) * 2 + np.repeat(np.arange(4), 4))


def test_kernel_with_two_mesh_axes_and_a_tuple_out_type():
    mesh = _core_mesh(x=2, y=3)

    def body(a_ref, b_ref):
        i, j = jax.lax.axis_index("x"), jax.lax.axis_index("y")
        a_ref[i, j] = i * 10 + j
        b_ref[i * 3 + j] = 1

    a, b = pl.kernel(body, (SDS((2, 3), jnp.int32), SDS((6,), jnp.int32)), mesh=mesh,
                     interpret=True)()
    np.testing.assert_array_equal(a, [[0, 1, 2], [10, 11, 12]])
    np.testing.assert_array_equal(b, np.ones(6))


def test_kernel_passes_a_mapping_of_scratch_types_as_keyword_refs():
    """A dict of scratch types reaches the body as keyword refs, as upstream (upstream's
    tpu_pallas_state_test test_kernel_helper_with_scratch raised NotImplementedError)."""
    x = jnp.arange(8, dtype=jnp.float32)

    def body(x_ref, o_ref, *, tmp_ref, acc_ref):
        tmp_ref[...] = x_ref[...] + 1
        acc_ref[...] = tmp_ref[...] * 2
        o_ref[...] = acc_ref[...] - tmp_ref[...]

    out = pl.kernel(body, out_type=SDS((8,), jnp.float32), mesh=_core_mesh(core=1),
                    scratch_types=dict(acc_ref=pl.ANY((8,), jnp.float32),
                                       tmp_ref=pl.ANY((8,), jnp.float32)),
                    interpret=True)(x)
    np.testing.assert_array_equal(out, np.arange(8) + 1)


def test_core_map_runs_a_closure_over_refs_on_every_core():
    mesh = _core_mesh(core=4)
    x = jnp.arange(16, dtype=jnp.float32)

    def f(refs):
        x_ref, o_ref = refs

        @pl.core_map(mesh, interpret=True)
        def _():
            c = jax.lax.axis_index("core")
            o_ref[pl.ds(c * 4, 4)] = x_ref[pl.ds(c * 4, 4)] + c.astype(jnp.float32)

    _, out = pl.run_state(f)((x, jnp.zeros_like(x)))
    np.testing.assert_array_equal(out, np.arange(16) + np.repeat(np.arange(4), 4))


# --------------------------------------------------------------------------------------
# Lowering and export


def test_lower_as_mlir_returns_the_module_text():
    f = pl.pallas_call(_copy_kernel, SDS((4,), jnp.float32), interpret=True)
    text = pl.lower_as_mlir(f, jnp.arange(4, dtype=jnp.float32))
    assert isinstance(text, str) and "func.func" in text


@pytest.mark.parametrize("interpret", [True, False], ids=["interpret", "cpu-backend"])
def test_jax_export_round_trip(interpret):
    x = jnp.arange(4, dtype=jnp.float32)
    f = pl.pallas_call(_add_kernel, SDS((4,), jnp.float32), interpret=interpret)
    exported = jax.export.export(jax.jit(f), platforms=("cpu",))(x, x)
    restored = jax.export.deserialize(exported.serialize())
    np.testing.assert_array_equal(restored.call(x, x), 2 * x)


def test_pallas_export_experimental_switches_on_dynamically_shaped_blocks():
    """Without the switch a symbolic block asks for it (upstream's ValueError); with it,
    the whole-array block of symbolic size exports and runs on any size."""
    def f(x):
        return pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), interpret=True)(x)

    (w,) = jax.export.symbolic_shape("w")
    arg = SDS((w,), jnp.float32)
    with pytest.raises(ValueError, match="pallas_export_experimental"):
        jax.export.export(jax.jit(f))(arg)
    with pl.pallas_export_experimental(dynamic_shapes=True):
        exported = jax.export.export(jax.jit(f))(arg)
    for n in (1, 5):
        x = jnp.arange(n, dtype=jnp.float32)
        np.testing.assert_array_equal(exported.call(x), x)


def test_a_backend_without_dynamic_shapes_refuses_symbolic_blocks(clean_registry):
    class Static(pl.plugins.Backend):
        def lower(self, request):
            raise AssertionError("not reached: the core refuses first")

    pl.plugins.register_backend(Static(name="static_only", version="0", platforms=("cpu",),
                                       capabilities=frozenset({"export"})))

    def f(x):
        return pl.pallas_call(_copy_kernel, SDS(x.shape, x.dtype), backend="static_only")(x)

    (w,) = jax.export.symbolic_shape("w")
    with pytest.raises(NotImplementedError, match=r"dynamic shapes not supported in the "
                                                  r"static_only backend: .* operand args\[0\]"):
        with pl.pallas_export_experimental(dynamic_shapes=True):
            jax.export.export(jax.jit(f))(SDS((w,), jnp.float32))


def test_run_state_runs_a_function_on_refs():
    def f(refs):
        a_ref, b_ref = refs
        b_ref[...] = a_ref[...] * 2
        a_ref[...] = a_ref[...] + 1

    a, b = pl.run_state(f)((jnp.arange(3, dtype=jnp.float32), jnp.zeros(3, jnp.float32)))
    np.testing.assert_array_equal(a, [1, 2, 3])
    np.testing.assert_array_equal(b, [0, 2, 4])


def test_estimate_cost_binds_keyword_arguments():
    """Keyword arguments are bound, not traced (upstream's TPU flash attention passes a
    flag and a value of the enclosing jit this way)."""
    def attention_like(q, k, *, causal, scale):
        s = (q @ k.T) * scale
        return jnp.where(jnp.tril(jnp.ones(s.shape, bool)), s, 0.0) if causal else s

    q = jax.ShapeDtypeStruct((128, 64), jnp.float32)

    @jax.jit
    def inside(scale):
        cost = pl.estimate_cost(attention_like, q, q, causal=True, scale=scale)
        assert cost.flops >= 2 * 128 * 128 * 64
        return scale

    inside(jnp.float32(0.5))
    assert pl.estimate_cost(attention_like, q, q, causal=False, scale=1.0).flops > 0


def test_a_named_grid_binds_its_axis_names():
    """``grid=(("i", 2), ("j", 4))`` names the axes, as upstream: ``lax.axis_index`` and
    ``lax.psum`` over a name work inside the kernel."""
    def kernel(o_ref):
        o_ref[...] = jnp.full(o_ref.shape, jax.lax.axis_index("i") * 10
                              + jax.lax.psum(1, "j"), jnp.int32)

    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 4, 8, 128), jnp.int32),
                         grid=(("i", 2), ("j", 4)),
                         out_specs=pl.BlockSpec((None, None, 8, 128),
                                                lambda i, j: (i, j, 0, 0)),
                         interpret=True)()
    np.testing.assert_array_equal(out[:, 0, 0, 0], [4, 14])
    with pytest.raises(TypeError, match=r"named grid gives every axis as a \(name, size\)"):
        pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
                       grid=(("i", 2), 4), interpret=True)
