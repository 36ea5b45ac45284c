"""``pallas_call`` under ``jit`` with sharded inputs, ``shard_map``, ``jax.export``, and
cost estimates.

The multi-device checks run in a subprocess: ``--xla_force_host_platform_device_count``
must be set before JAX initialises its CPU backend, which in this process (and in
pytest-xdist workers) has already happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import pallas as pl
import pallas.plugins
from pallas._src.pallas_call import lower_with_interpreter

SDS = jax.ShapeDtypeStruct

_MULTI_DEVICE_SCRIPT = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import pallas as pl

    assert jax.device_count() == 8, jax.devices()

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.tanh(x_ref[...] @ w_ref[...]) + pl.program_id(0)

    def f(x, w):
        return pl.pallas_call(
            kernel, jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype),
            grid=(x.shape[0] // 4,),
            in_specs=[pl.BlockSpec((4, x.shape[1]), lambda i: (i, 0)),
                      pl.BlockSpec(w.shape, lambda i: (0, 0))],
            out_specs=pl.BlockSpec((4, w.shape[1]), lambda i: (i, 0)),
            interpret=True)(x, w)

    def ref(x, w):
        pid = jnp.repeat(jnp.arange(x.shape[0] // 4, dtype=x.dtype), 4)[:, None]
        return jnp.tanh(x @ w) + pid

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32) * 0.2

    def check(name, got, want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
        print("ok", name)

    for kind in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((8,), ("d",), axis_types=(kind,))
        xs = jax.device_put(x, NamedSharding(mesh, P("d")))
        ws = jax.device_put(w, NamedSharding(mesh, P()))
        check(f"jit {kind.name}", jax.jit(f)(xs, ws), ref(x, w))

    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
    xs = jax.device_put(x, NamedSharding(mesh, P("d")))
    # per shard, program_id restarts: the reference is applied per shard too
    ref_sharded = jnp.concatenate([ref(x[8 * k: 8 * k + 8], w) for k in range(8)])
    for check_vma in (True, False):
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"),
                                  check_vma=check_vma))
        check(f"shard_map check_vma={check_vma}", g(xs, w), ref_sharded)

    def loss(f):
        return lambda x, w: jnp.sum(jax.shard_map(
            f, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))(x, w) ** 2)
    gx, gw = jax.jit(jax.grad(loss(f), (0, 1)))(xs, w)
    rx, rw = jax.jit(jax.grad(loss(ref), (0, 1)))(xs, w)
    check("grad of shard_map", gx, rx)
    check("grad of shard_map (w)", gw, rw)
    g = jax.jit(jax.shard_map(jax.vmap(f, (0, None)), mesh=mesh, in_specs=(P("d"), P()),
                              out_specs=P("d")))
    xb = x.reshape(8, 8, 16)
    check("shard_map of vmap", g(jax.device_put(xb, NamedSharding(mesh, P("d"))), w),
          jax.vmap(ref, (0, None))(xb, w))
''')


def test_jit_with_sharded_inputs_and_shard_map_on_eight_cpu_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", _MULTI_DEVICE_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("jit Auto", "jit Explicit", "shard_map check_vma=True",
                 "shard_map check_vma=False", "grad of shard_map", "shard_map of vmap"):
        assert f"ok {name}" in proc.stdout, proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------
# jax.export


def _matmul(x, w, **kw):
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.sin(x_ref[...] @ w_ref[...])

    kw.setdefault("interpret", True)
    return pl.pallas_call(
        kernel, SDS((x.shape[0], w.shape[1]), jnp.float32), grid=(2,),
        in_specs=[pl.BlockSpec((x.shape[0] // 2, x.shape[1]), lambda i: (i, 0)),
                  pl.BlockSpec(w.shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((x.shape[0] // 2, w.shape[1]), lambda i: (i, 0)), **kw)(x, w)


@pytest.fixture
def operands(rng):
    return (jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
            jnp.asarray(rng.normal(size=(16, 8)), jnp.float32) * 0.3)


def _roundtrip(fun, *args):
    exp = export.export(jax.jit(fun))(*args)
    blob = exp.serialize()
    return export.deserialize(blob).call(*args)


def test_export_serializes_deserializes_and_runs(operands):
    x, w = operands
    np.testing.assert_allclose(_roundtrip(_matmul, x, w), jnp.sin(x @ w), rtol=1e-5, atol=1e-5)


def test_export_of_transformed_calls(operands):
    x, w = operands
    xb = jnp.stack([x, -x])
    np.testing.assert_allclose(_roundtrip(jax.vmap(_matmul, (0, None)), xb, w),
                               jnp.sin(xb @ w), rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x, w: jnp.sum(_matmul(x, w)))
    np.testing.assert_allclose(_roundtrip(grad, x, w),
                               jax.grad(lambda x, w: jnp.sum(jnp.sin(x @ w)))(x, w),
                               rtol=1e-5, atol=1e-5)


class _RecordingBackend(pallas.plugins.Backend):
    def lower(self, request):
        self.costs.append(request.cost_estimate)
        return lower_with_interpreter(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                      grid_mapping=request.grid_mapping)


@pytest.fixture
def recording_backend(clean_registry):
    b = _RecordingBackend(name="cost_test", version="0", platforms=("cpu",))
    b.costs = []
    pallas.plugins.register_backend(b)
    return b


def test_export_with_a_compiled_backend(operands, recording_backend):
    x, w = operands
    fun = lambda x, w: _matmul(x, w, interpret=False, backend="cost_test")  # noqa: E731
    np.testing.assert_allclose(_roundtrip(fun, x, w), jnp.sin(x @ w), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------
# Cost estimates


def test_estimate_cost_of_a_matmul():
    m, k, n = 16, 32, 8
    cost = pl.estimate_cost(lambda a, b: a @ b, SDS((m, k), jnp.float32),
                            SDS((k, n), jnp.float32))
    assert isinstance(cost, pl.CostEstimate)
    assert cost.flops == 2 * m * n * k
    assert cost.bytes_accessed > 0
    cost = pl.estimate_cost(jnp.exp, SDS((128,), jnp.float32))
    assert cost.transcendentals == 128


def test_cost_estimate_reaches_the_backend_and_scales_under_vmap(operands, recording_backend):
    x, w = operands
    cost = pl.CostEstimate(flops=2 * 8 * 16 * 8, transcendentals=64, bytes_accessed=1280)
    fun = lambda x, w: _matmul(x, w, interpret=False, backend="cost_test",  # noqa: E731
                               cost_estimate=cost)
    jax.jit(fun)(x, w)
    assert recording_backend.costs[-1] == cost
    jax.jit(jax.vmap(fun, (0, None)))(jnp.stack([x, x, x]), w)
    batched = recording_backend.costs[-1]
    assert (batched.flops, batched.transcendentals, batched.bytes_accessed) == (
        3 * cost.flops, 3 * cost.transcendentals, 3 * cost.bytes_accessed)


# --------------------------------------------------------------------------------------
# Shape polymorphism (jax.export with symbolic dimensions)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


@pytest.mark.parametrize("with_specs", [True, False], ids=["block-specs", "whole-array"])
def test_symbolic_blocks_without_the_dynamic_shapes_switch_are_an_error_naming_the_operand(
        with_specs):
    """As upstream: blocks must be static under shape polymorphism unless the export
    runs under pl.pallas_export_experimental(dynamic_shapes=True)."""
    def f(x):
        specs = {}
        if with_specs:
            spec = pl.BlockSpec((x.shape[0] // 2, 128), lambda i: (i, 0))
            specs = dict(grid=(2,), in_specs=[spec], out_specs=spec)
        return pl.pallas_call(_copy, jax.ShapeDtypeStruct(x.shape, x.dtype), **specs)(x)

    (w,) = export.symbolic_shape("w")
    with pytest.raises(ValueError, match=r"does not support dynamically-shaped blocks. Block "
                                         r"spec for args\[0\] has block_shape.*"
                                         r"pallas_export_experimental\(dynamic_shapes=True\)"):
        export.export(jax.jit(f))(jax.ShapeDtypeStruct((w, 128), jnp.float32))


def _export_and_call(f, sym_shape, *shapes, dynamic_shapes=False):
    """Exports ``f`` (CPU, interpret=True inside) for ``sym_shape``; calls it on arrays
    of each concrete shape; returns [(x, f(x))]."""
    with pl.pallas_export_experimental(dynamic_shapes):
        exp = export.export(jax.jit(f))(jax.ShapeDtypeStruct(sym_shape, jnp.float32))
    out = []
    for shape in shapes:
        x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
        out.append((x, exp.call(x)))
    return out


def test_a_symbolic_grid_is_a_dynamic_grid_size_operand_and_runs_once_exported():
    """As upstream: a symbolic grid size becomes a dynamic grid bound (the call's first
    operand); the exported interpreter runs to the size of the array it is called on."""
    def f(x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(_copy, jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(pl.cdiv(x.shape[0], 8),), in_specs=[spec],
                              out_specs=spec, interpret=True)(x)

    (w,) = export.symbolic_shape("w")
    closed = jax.make_jaxpr(f)(jax.ShapeDtypeStruct((w, 128), jnp.float32))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is pl.pallas_call_p]
    assert eqn.params["grid_mapping"].num_dynamic_grid_bounds == 1
    assert eqn.invars[0].aval.shape == () and eqn.invars[0].aval.dtype == jnp.int32
    for x, y in _export_and_call(f, (w, 128), (16, 128), (20, 128)):  # 20: a ragged edge
        np.testing.assert_array_equal(y, x)


def test_symbolic_block_shapes_run_in_the_interpreter_once_exported():
    """Dynamic-shape export: blocks of half the (symbolic) array in each dimension."""
    def f(x):
        block = (x.shape[0] // 2, x.shape[1] // 2)
        spec = pl.BlockSpec(block, lambda i, j: (i, j))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                              jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2, 2),
                              in_specs=[spec], out_specs=spec, interpret=True)(x)

    w, h = export.symbolic_shape("w, h")
    for x, y in _export_and_call(f, (w, h), (16, 24), (6, 10), dynamic_shapes=True):
        np.testing.assert_array_equal(y, x * 2)


def test_a_kernel_may_slice_its_refs_by_a_symbolic_size():
    def kernel(x_ref, o_ref):
        half = pl.cdiv(x_ref.shape[0], 2)
        assert half == o_ref.shape[0]
        o_ref[...] = x_ref[:half] + x_ref.shape[0]  # a dimension used as a value, too

    def f(x):
        out = jax.ShapeDtypeStruct((pl.cdiv(x.shape[0], 2), 128), x.dtype)
        return pl.pallas_call(kernel, out, interpret=True)(x)

    (m,) = export.symbolic_shape("m")
    for x, y in _export_and_call(f, (m, 128), (7, 128), (2, 128), dynamic_shapes=True):
        np.testing.assert_array_equal(y, x[: (len(x) + 1) // 2] + len(x))


def test_cdiv_of_symbolic_dimensions_stays_symbolic():
    (w,) = export.symbolic_shape("w")
    assert str(pl.cdiv(w, 8)) == str((w + 7) // 8)


_DECLARED_VMA_SCRIPT = textwrap.dedent('''
import jax, jax.numpy as jnp, numpy as np
import pallas as pl
from jax.sharding import PartitionSpec as P

mesh = jax.make_mesh((2,), ("d",))

def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + jax.lax.axis_index("d").astype(jnp.float32)

def body(x):
    out_shape = jax.ShapeDtypeStruct(
        x.shape, x.dtype, manual_axis_type=jax.sharding.ManualAxisType(varying={"d"}))
    y = pl.pallas_call(kernel, out_shape=out_shape, interpret=True)(x)
    print("vma", sorted(jax.typeof(y).manual_axis_type.varying))
    return y

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("d")))
print("pvary in kernel", "pvary" in str(f.trace(jnp.zeros((8, 128))).jaxpr))
np.testing.assert_array_equal(f(jnp.zeros((8, 128))),
                              np.concatenate([np.zeros((8, 128)), np.ones((8, 128))]))
print("ok declared")
''')


def test_an_out_shape_declares_the_mesh_axes_its_output_varies_over():
    """A replicated operand, an output that differs per device: upstream's
    ``ShapeDtypeStruct(manual_axis_type=...)`` says it varies (inferring from the
    operands would say it does not). ``x + axis_index`` in the kernel needs no pvary."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-c", _DECLARED_VMA_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vma ['d']" in proc.stdout and "ok declared" in proc.stdout, proc.stdout
    # The kernel is traced without shard_map's typing, as upstream: no pvary in its body.
    assert "pvary in kernel False" in proc.stdout, proc.stdout
