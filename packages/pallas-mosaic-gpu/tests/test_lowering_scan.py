"""``lax.scan`` over register arrays: the scanned operands and stacked results go through
SMEM buffers (a thread holds only its own elements of an array, and nothing indexes
registers dynamically), so iteration ``i`` reads row ``i`` of each ``xs`` and writes row
``i`` of each ``ys``. The numbers are checked by executing the generated module (the
emulate level's executor) against plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl
import pallas.plugins
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.lowering import build

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32


def _emulate(kernel, out_shape, *args):
    """(generated kernel, its outputs executed on CPU) of ``pallas_call(kernel)``."""
    from pallas_mosaic_gpu._src.executor import run_kernel

    f = pl.pallas_call(kernel, out_shape=out_shape, backend="mosaic_gpu")
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    k = build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")
    return k, run_kernel(k, list(args))


def _rng():
    return np.random.default_rng(0)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_over_rows_stacks_its_running_sums(reverse):
    x = _rng().standard_normal((8, 128), np.float32)

    def kernel(x_ref, o_ref):
        def step(acc, row):
            acc = acc + row
            return acc, acc

        o_ref[...] = lax.scan(step, jnp.zeros((128,), F32), x_ref[...], reverse=reverse)[1]

    k, (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x)
    want = np.cumsum(x[::-1], 0)[::-1] if reverse else np.cumsum(x, 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # The block in, the block out, and one SMEM buffer each for xs and ys.
    assert k.smem_bytes >= 4 * x.nbytes


def test_a_scan_with_two_xs_two_ys_and_a_carry_returned_too():
    rng = _rng()
    x = rng.standard_normal((4, 256), np.float32)
    y = rng.standard_normal((4, 256), np.float32)

    def kernel(x_ref, y_ref, s_ref, p_ref, c_ref):
        def step(c, xy):
            a, b = xy
            return c + a * b, (a + b, a * c)

        c, (s, p) = lax.scan(step, jnp.ones((256,), F32), (x_ref[...], y_ref[...]))
        s_ref[...], p_ref[...], c_ref[...] = s, p, c[None, :]

    outs = (jax.ShapeDtypeStruct(x.shape, F32),) * 2 + (jax.ShapeDtypeStruct((1, 256), F32),)
    _, (s, p, c) = _emulate(kernel, outs, x, y)
    cs = np.ones(256, np.float32)
    want_p = []
    for i in range(4):
        want_p.append(x[i] * cs)
        cs = cs + x[i] * y[i]
    np.testing.assert_allclose(s, x + y, rtol=1e-6)
    np.testing.assert_allclose(p, np.stack(want_p), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c[0], cs, rtol=1e-5, atol=1e-5)


def test_a_scan_over_a_vector_of_scalars_and_small_rows():
    # Rows of a (16,) array are scalars; rows of a (16, 4) array are small arrays that
    # every thread holds whole.
    v = np.arange(16, dtype=np.float32)
    m = _rng().standard_normal((16, 4), np.float32)

    def kernel(v_ref, m_ref, o_ref, t_ref):
        def step(acc, xs):
            s, row = xs
            return acc + s * row, s * 2.0

        acc, ys = lax.scan(step, jnp.zeros((4,), F32), (v_ref[...], m_ref[...]))
        o_ref[...] = acc
        t_ref[...] = ys

    outs = (jax.ShapeDtypeStruct((4,), F32), jax.ShapeDtypeStruct((16,), F32))
    _, (acc, ys) = _emulate(kernel, outs, v, m)
    np.testing.assert_allclose(acc, (v[:, None] * m).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ys, v * 2.0)


def test_a_scan_over_int32_rows_and_bool_results():
    x = _rng().integers(-50, 50, (8, 128)).astype(np.int32)

    def kernel(x_ref, o_ref, b_ref):
        def step(m, row):
            m = jnp.maximum(m, row)
            return m, row > 0

        m, pos = lax.scan(step, jnp.full((128,), -100, jnp.int32), x_ref[...])
        o_ref[...] = m[None, :]
        b_ref[...] = pos.astype(jnp.int32)

    outs = (jax.ShapeDtypeStruct((1, 128), jnp.int32), jax.ShapeDtypeStruct(x.shape, jnp.int32))
    _, (m, pos) = _emulate(kernel, outs, x)
    np.testing.assert_array_equal(m[0], x.max(0))
    np.testing.assert_array_equal(pos, (x > 0).astype(np.int32))


def test_a_fori_style_scan_needs_no_smem_buffer():
    x = _rng().standard_normal((8, 128), np.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = lax.fori_loop(0, 3, lambda i, v: v * 2.0, x_ref[...])

    k, (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x)
    np.testing.assert_allclose(out, x * 8.0)
    assert k.smem_bytes < 3 * x.nbytes


def _loops(k) -> list:
    """The trip counts (upper bounds) of the kernel's scf.for ops, outermost first."""
    import re

    from pallas_mosaic_gpu._src.executor import module_of

    text = str(module_of(k))
    consts = dict(re.findall(r"(%c\w*) = arith\.constant (\d+) : index", text))
    return [consts.get(hi, hi) for hi in re.findall(r"scf\.for %\w+ = %\w+ to (%\w+)", text)]


@pytest.mark.parametrize("unroll, loops", [(1, ["8"]), (2, ["4"]), (3, ["2"]), (True, [])])
def test_fori_loop_unroll_repeats_the_body_in_each_step_as_upstream(unroll, loops):
    # unroll=k: the body k times per scf.for step (8 // k steps), the steps left over
    # (8 % k) after the loop; unroll=True: no loop. Reversed rows check the indices.
    x = _rng().standard_normal((8, 128), np.float32)

    def kernel(x_ref, o_ref):
        def step(acc, row):
            acc = acc * 0.5 + row
            return acc, acc

        o_ref[...] = lax.scan(step, jnp.zeros((128,), F32), x_ref[...], reverse=True,
                              unroll=unroll)[1]

    k, (out,) = _emulate(kernel, jax.ShapeDtypeStruct(x.shape, F32), x)
    assert _loops(k) == loops
    want = np.zeros_like(x)
    acc = np.zeros((128,), np.float32)
    for i in reversed(range(8)):
        acc = acc * 0.5 + x[i]
        want[i] = acc
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
