"""Inside kernels: reading and writing refs, indexing (``.at``, ``pl.ds``, strides,
masks), ``program_id``, ``when``, ``loop``, ``lax`` control flow over refs, and
``jax.numpy``/``lax`` operations on blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallas as pl

SDS = jax.ShapeDtypeStruct


def _call(kernel, out_shape, *args, **kw):
    return pl.pallas_call(kernel, out_shape, interpret=True, **kw)(*args)


# --------------------------------------------------------------------------------------
# Reading and writing refs


def test_ref_reads_and_writes_with_integer_and_slice_indices():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[0, :] = x_ref[3, :]
        o_ref[1:3, 2:6] = x_ref[1:3, 0:4] * 2
        o_ref[3] = x_ref[0] + x_ref[0, 7]

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    xn = np.asarray(x)
    ref = np.zeros_like(xn)
    ref[0] = xn[3]
    ref[1:3, 2:6] = xn[1:3, 0:4] * 2
    ref[3] = xn[0] + xn[0, 7]
    np.testing.assert_array_equal(out, ref)


def test_ref_at_views_compose():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        view = o_ref.at[1:3]  # rows 1..2
        view.at[:, 4:][...] = x_ref.at[2:4][:, :4]
        inner = x_ref.at[0].at[pl.ds(2, 3)]
        o_ref.at[0][pl.ds(0, 3)] = inner[...]

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    xn = np.asarray(x)
    ref = np.zeros_like(xn)
    ref[1:3, 4:] = xn[2:4, :4]
    ref[0, 0:3] = xn[0, 2:5]
    np.testing.assert_array_equal(out, ref)


def test_integer_array_indices_gather_and_scatter():
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        idx = (jnp.arange(4) + 1) % 4
        o_ref[...] = x_ref[idx]  # gather: [1, 2, 3, 0]
        o_ref[idx[:2]] = jnp.zeros((2,), jnp.float32)  # scatter into rows 1 and 2

    np.testing.assert_array_equal(_call(kernel, SDS((4,), jnp.float32), x), [1, 0, 0, 0])


def test_ref_shape_dtype_and_ndim_are_static():
    seen = {}

    def kernel(x_ref, o_ref):
        seen.update(shape=x_ref.shape, dtype=x_ref.dtype, ndim=x_ref.ndim)
        o_ref[...] = x_ref[...]

    _call(kernel, SDS((3, 5), jnp.int16), jnp.zeros((3, 5), jnp.int16))
    assert seen == {"shape": (3, 5), "dtype": jnp.int16, "ndim": 2}


def test_augmented_assignment_on_refs():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]
        o_ref[...] += 1
        o_ref[...] *= 3
        o_ref[2:4] -= 100

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    ref = (np.arange(8) + 1) * 3.0
    ref[2:4] -= 100
    np.testing.assert_array_equal(out, ref)


# --------------------------------------------------------------------------------------
# pl.ds / pl.dslice / pl.Slice


def test_ds_with_static_start():
    x = jnp.arange(16, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[pl.ds(0, 8)] = x_ref[pl.ds(8, 8)]
        o_ref[pl.dslice(8, 8)] = x_ref[pl.dslice(0, 8)]

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    np.testing.assert_array_equal(out, np.roll(np.arange(16), 8))


def test_ds_with_traced_start_from_program_id():
    x = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[pl.ds(i, 1), :] = x_ref[pl.ds(3 - i, 1), :] + 1

    # whole arrays at each grid point, so each point writes one row
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4,),
                         in_specs=[pl.BlockSpec((4, 8), lambda i: (0, 0))],
                         out_specs=pl.BlockSpec((4, 8), lambda i: (0, 0)), interpret=True)(x)
    np.testing.assert_array_equal(out, np.asarray(x)[::-1] + 1)


def test_ds_with_a_loop_index_start_in_fori_loop():
    x = jnp.arange(12, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        def body(k, carry):
            chunk = x_ref[pl.ds(k * 3, 3)]
            o_ref[pl.ds(k * 3, 3)] = chunk[::-1]
            return carry + jnp.sum(chunk)

        total = lax.fori_loop(0, 4, body, jnp.float32(0))
        o_ref[0] = total

    out = np.asarray(_call(kernel, SDS(x.shape, x.dtype), x))
    ref = np.arange(12, dtype=np.float32).reshape(4, 3)[:, ::-1].reshape(-1)
    ref[0] = np.arange(12).sum()
    np.testing.assert_array_equal(out, ref)


def test_strided_ds_and_slice_read_every_other_element():
    x = jnp.arange(16, dtype=jnp.float32)

    def kernel(x_ref, even_ref, odd_ref):
        even_ref[...] = x_ref[pl.ds(0, 8, stride=2)]
        odd_ref[...] = x_ref[pl.Slice(1, 8, 2)]

    even, odd = _call(kernel, (SDS((8,), jnp.float32), SDS((8,), jnp.float32)), x)
    np.testing.assert_array_equal(even, np.arange(0, 16, 2))
    np.testing.assert_array_equal(odd, np.arange(1, 16, 2))


def test_strided_store_writes_every_third_element():
    def kernel(o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[pl.ds(1, 3, 3)] = jnp.arange(3, dtype=jnp.int32) + 7

    out = _call(kernel, SDS((9,), jnp.int32))
    np.testing.assert_array_equal(out, [0, 7, 0, 0, 8, 0, 0, 9, 0])


def test_strided_ds_with_traced_start():
    x = jnp.arange(2 * 8, dtype=jnp.float32).reshape(2, 8)

    def kernel(x_ref, o_ref):
        i = pl.program_id(0)
        o_ref[...] = x_ref[pl.ds(i, 1), pl.ds(i, 4, stride=2)]

    out = pl.pallas_call(kernel, SDS((2, 4), jnp.float32), grid=(2,),
                         in_specs=[pl.no_block_spec],
                         out_specs=pl.BlockSpec((1, 4), lambda i: (i, 0)), interpret=True)(x)
    xn = np.asarray(x)
    np.testing.assert_array_equal(out, [xn[0, 0:8:2], xn[1, 1:8:2]])


def test_ds_follows_python_slice_semantics():
    # As upstream (which is ``jax.ds``): ds(j) is :j, ds(None) is :, ds(i, n, s) is i:i+n:s.
    assert pl.ds is pl.dslice
    assert pl.ds(None) == slice(None)
    assert (pl.ds(3).start, pl.ds(3).size) == (0, 3)
    s = pl.ds(2, 5, 2)
    assert (s.start, s.size, s.stride) == (2, 5, 2)


# --------------------------------------------------------------------------------------
# pl.load / pl.store / pl.swap with masks


def test_masked_load_and_store():
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.full(o_ref.shape, -1.0)
        mask = jnp.arange(8) < 5
        v = pl.load(x_ref, (pl.ds(0, 8),), mask=mask, other=100.0)
        pl.store(o_ref, (pl.ds(0, 8),), v * 2, mask=jnp.arange(8) % 2 == 0)

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    v = np.where(np.arange(8) < 5, np.arange(8.0), 100.0) * 2
    np.testing.assert_array_equal(out, np.where(np.arange(8) % 2 == 0, v, -1.0))


def test_store_takes_the_index_before_the_value_or_writes_the_whole_ref():
    """pl.store(ref, idx, val) is upstream's generic order (as pl.load/pl.swap);
    pl.store(ref, val) is pltpu.store/pltriton.store's whole-ref form."""
    x = jnp.arange(8, dtype=jnp.float32)

    def kernel(x_ref, o_ref, p_ref):
        pl.store(o_ref, x_ref[...] + 1)
        pl.store(p_ref, x_ref[...] * 0)
        pl.store(p_ref, (pl.ds(2, 3),), x_ref[pl.ds(0, 3)], mask=jnp.arange(3) != 1)

    whole, part = _call(kernel, (SDS((8,), jnp.float32),) * 2, x)
    np.testing.assert_array_equal(whole, np.arange(8) + 1)
    np.testing.assert_array_equal(part, [0, 0, 0, 0, 2, 0, 0, 0])


def test_swap_returns_the_previous_contents():
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, o_ref, old_ref):
        o_ref[...] = x_ref[...]
        old_ref[...] = pl.swap(o_ref, (pl.ds(0, 4),), x_ref[...] * 10)

    out, old = _call(kernel, (SDS((4,), jnp.float32), SDS((4,), jnp.float32)), x)
    np.testing.assert_array_equal(out, np.arange(4) * 10)
    np.testing.assert_array_equal(old, np.arange(4))


# --------------------------------------------------------------------------------------
# pl.when, pl.loop


def test_when_runs_its_body_only_where_the_condition_holds():
    def kernel(o_ref):
        o_ref[0] = 0

        @pl.when(pl.program_id(0) % 3 == 1)
        def _():
            o_ref[0] = 1

    out = pl.pallas_call(kernel, SDS((6,), jnp.int32), grid=(6,), in_specs=[],
                         out_specs=pl.BlockSpec((1,), lambda i: (i,)), interpret=True)()
    np.testing.assert_array_equal(out, [0, 1, 0, 0, 1, 0])


def test_when_with_a_python_bool_decides_at_trace_time():
    def kernel(o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        @pl.when(True)
        def _():
            o_ref[0] = 5

        @pl.when(False)
        def _():
            o_ref[1] = 5

    np.testing.assert_array_equal(_call(kernel, SDS((2,), jnp.int32)), [5, 0])


def test_loop_runs_the_body_for_every_index():
    def kernel(o_ref):
        @pl.loop(0, 8)
        def _(i):
            o_ref[i] = i * i

    np.testing.assert_array_equal(_call(kernel, SDS((8,), jnp.int32)), np.arange(8) ** 2)


def test_loop_with_step_and_traced_bounds():
    def kernel(o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)
        n = pl.num_programs(0) * 5  # traced upper bound: 10

        @pl.loop(1, n, step=3)
        def _(i):
            o_ref[i] = 1

    out = pl.pallas_call(kernel, SDS((10,), jnp.int32), grid=(2,), in_specs=[],
                         out_specs=pl.BlockSpec((10,), lambda i: (0,)), interpret=True)()
    np.testing.assert_array_equal(out, [int(i in (1, 4, 7)) for i in range(10)])


def test_loop_with_a_carry_returns_the_final_carry():
    x = jnp.arange(6, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        @pl.loop(0, 6, init_carry=jnp.float32(0))
        def total(i, acc):
            return acc + x_ref[i]

        o_ref[0] = total

    out = _call(kernel, SDS((1,), jnp.float32), x)
    np.testing.assert_array_equal(out, [15.0])


# --------------------------------------------------------------------------------------
# lax control flow touching refs


def test_fori_loop_writing_refs():
    def kernel(o_ref):
        def body(i, c):
            o_ref[i] = c
            return c * 2

        lax.fori_loop(0, 6, body, jnp.int32(1))

    np.testing.assert_array_equal(_call(kernel, SDS((6,), jnp.int32)), 2 ** np.arange(6))


def test_while_loop_reading_and_writing_refs():
    # Collatz steps of 6 written into the output until reaching 1.
    def kernel(o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        def cond(state):
            i, v = state
            return v != 1

        def body(state):
            i, v = state
            o_ref[i] = v
            return i + 1, jnp.where(v % 2 == 0, v // 2, 3 * v + 1)

        i, _ = lax.while_loop(cond, body, (jnp.int32(0), jnp.int32(6)))
        o_ref[15] = i

    out = _call(kernel, SDS((16,), jnp.int32))
    seq = [6, 3, 10, 5, 16, 8, 4, 2]
    np.testing.assert_array_equal(out[: len(seq)], seq)
    assert int(out[15]) == len(seq)


def test_while_loop_whose_condition_reads_a_ref():
    def kernel(o_ref):
        o_ref[0] = 0

        def cond(_):
            return o_ref[0] < 10

        def body(c):
            o_ref[0] = o_ref[0] + 3
            return c + 1

        o_ref[1] = lax.while_loop(cond, body, jnp.int32(0))

    np.testing.assert_array_equal(_call(kernel, SDS((2,), jnp.int32)), [12, 4])


def test_cond_branches_write_different_refs():
    x = jnp.arange(4, dtype=jnp.float32)

    def kernel(x_ref, a_ref, b_ref):
        a_ref[...] = jnp.zeros_like(a_ref)
        b_ref[...] = jnp.zeros_like(b_ref)
        pid = pl.program_id(0)

        def even():
            a_ref[...] = x_ref[...] + pid.astype(jnp.float32)

        def odd():
            b_ref[...] = x_ref[...] - pid.astype(jnp.float32)

        lax.cond(pid % 2 == 0, even, odd)

    spec = pl.BlockSpec((None, 4), lambda i: (i, 0))
    a, b = pl.pallas_call(
        kernel, (SDS((3, 4), jnp.float32), SDS((3, 4), jnp.float32)), grid=(3,),
        in_specs=[pl.BlockSpec((4,), lambda i: (0,))], out_specs=(spec, spec), interpret=True,
    )(x)
    xn = np.asarray(x)
    np.testing.assert_array_equal(a, [xn + 0, np.zeros(4), xn + 2])
    np.testing.assert_array_equal(b, [np.zeros(4), xn - 1, np.zeros(4)])


def test_cond_returning_values_and_switch():
    def kernel(o_ref):
        pid = pl.program_id(0)
        v = lax.cond(pid > 1, lambda: pid * 10, lambda: -pid)
        w = lax.switch(pid, [lambda: 100, lambda: 200, lambda: 300, lambda: 400])
        o_ref[0] = v + w

    out = pl.pallas_call(kernel, SDS((4,), jnp.int32), grid=(4,), in_specs=[],
                         out_specs=pl.BlockSpec((1,), lambda i: (i,)), interpret=True)()
    np.testing.assert_array_equal(out, [100, 199, 320, 430])


def test_scan_over_ref_rows():
    x = jnp.arange(5 * 3, dtype=jnp.float32).reshape(5, 3)

    def kernel(x_ref, o_ref, last_ref):
        def step(carry, i):
            new = carry + x_ref[i]
            o_ref[i] = new
            return new, jnp.sum(new)

        carry, sums = lax.scan(step, jnp.zeros((3,), jnp.float32), jnp.arange(5))
        last_ref[...] = jnp.concatenate([carry, sums[:2]])

    out, last = _call(kernel, (SDS((5, 3), jnp.float32), SDS((5,), jnp.float32)), x)
    cs = np.cumsum(np.asarray(x), axis=0)
    np.testing.assert_array_equal(out, cs)
    np.testing.assert_array_equal(last, np.concatenate([cs[-1], cs.sum(1)[:2]]))


def test_nested_loops_and_conditions():
    def kernel(o_ref):
        o_ref[...] = jnp.zeros_like(o_ref)

        @pl.loop(0, 4)
        def _(i):
            @pl.loop(0, 4)
            def _(j):
                @pl.when(j <= i)
                def _():
                    o_ref[i, j] = i * 4 + j

    out = _call(kernel, SDS((4, 4), jnp.int32))
    np.testing.assert_array_equal(out, np.tril(np.arange(16).reshape(4, 4)))


def test_jitted_helper_function_inside_a_kernel():
    @jax.jit
    def helper(ref, v):
        ref[...] = ref[...] + v

    def kernel(o_ref):
        o_ref[...] = jnp.ones_like(o_ref)
        helper(o_ref, 2.0)

    np.testing.assert_array_equal(_call(kernel, SDS((3,), jnp.float32)), [3, 3, 3])


# --------------------------------------------------------------------------------------
# jax.numpy and lax on blocks


def test_reductions_broadcasting_and_transcendentals_on_blocks():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)

    def kernel(x_ref, o_ref):
        v = x_ref[...]
        m = jnp.max(v, axis=1, keepdims=True)
        e = jnp.exp(v - m)
        o_ref[...] = e / jnp.sum(e, axis=1, keepdims=True) + jnp.mean(v) * 0

    spec = pl.BlockSpec((2, 16), lambda i: (i, 0))
    out = pl.pallas_call(kernel, SDS(x.shape, x.dtype), grid=(4,), in_specs=[spec],
                         out_specs=spec, interpret=True)(x)
    np.testing.assert_allclose(out, jax.nn.softmax(x, axis=1), rtol=1e-6, atol=1e-7)


def test_dot_transpose_iota_where_and_casts_on_blocks():
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)

    def kernel(a_ref, o_ref, i_ref):
        a = a_ref[...]
        g = lax.dot_general(a, a, (((0,), (0,)), ((), ())))  # a.T @ a
        rows = lax.broadcasted_iota(jnp.int32, (4, 4), 0)
        cols = lax.broadcasted_iota(jnp.int32, (4, 4), 1)
        o_ref[...] = jnp.where(rows >= cols, g, g.T * 0)
        i_ref[...] = (jnp.abs(a.T) * 10).astype(jnp.int32)

    o, i = _call(kernel, (SDS((4, 4), jnp.float32), SDS((4, 8), jnp.int32)), a)
    an = np.asarray(a)
    np.testing.assert_allclose(o, np.tril(an.T @ an), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(i, (np.abs(an.T) * 10).astype(np.int32))


def test_reshape_concatenate_and_lax_ops():
    x = jnp.arange(16, dtype=jnp.int32)

    def kernel(x_ref, o_ref):
        v = x_ref[...].reshape(4, 4)
        v = jnp.concatenate([v[:, 2:], v[:, :2]], axis=1)
        v = lax.rem(v, 5) + lax.shift_left(jnp.int32(1), 3)
        o_ref[...] = jnp.maximum(v, 9).reshape(16)

    out = _call(kernel, SDS((16,), jnp.int32), x)
    v = np.arange(16).reshape(4, 4)
    v = np.concatenate([v[:, 2:], v[:, :2]], axis=1) % 5 + 8
    np.testing.assert_array_equal(out, np.maximum(v, 9).reshape(16))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.uint8])
def test_arithmetic_in_several_dtypes(dtype):
    x = (jnp.arange(16) % 7).astype(dtype)

    def kernel(x_ref, o_ref):
        v = x_ref[...]
        o_ref[...] = v * v + v

    out = _call(kernel, SDS(x.shape, x.dtype), x)
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(x * x + x, np.float32))


def test_multiple_of_is_a_value_preserving_hint():
    x = jnp.arange(16, dtype=jnp.float32)

    def kernel(x_ref, o_ref):
        start = pl.multiple_of(pl.program_id(0) * 8, 8)
        o_ref[...] = x_ref[pl.ds(start, 8)] + 1

    out = pl.pallas_call(kernel, SDS((16,), jnp.float32), grid=(2,),
                         in_specs=[pl.no_block_spec],
                         out_specs=pl.BlockSpec((8,), lambda i: (i,)), interpret=True)(x)
    np.testing.assert_array_equal(out, np.arange(16) + 1)


def test_multiple_of_outside_kernels_returns_its_argument():
    np.testing.assert_array_equal(pl.multiple_of(jnp.arange(4) * 4, [4]), [0, 4, 8, 12])
    np.testing.assert_array_equal(jax.jit(lambda v: pl.multiple_of(v, 2))(jnp.int32(6)), 6)


def test_helpers_cdiv_align_to_next_power_of_2_strides_broadcast_to_reciprocal():
    assert pl.cdiv(10, 4) == 3 and pl.cdiv(8, 4) == 2
    np.testing.assert_array_equal(pl.cdiv(jnp.array([10, 8]), jnp.array([4, 4])), [3, 2])
    assert pl.align_to(10, 8) == 16 and pl.align_to(16, 8) == 16
    assert [pl.next_power_of_2(v) for v in (0, 1, 3, 8, 9)] == [1, 1, 4, 8, 16]
    assert pl.strides_from_shape((2, 3, 4)) == (12, 4, 1)

    def kernel(x_ref, o_ref):
        o_ref[...] = pl.broadcast_to(x_ref[...], (3, 4)) * pl.reciprocal(
            jnp.float32(4.0), approx=True)

    out = _call(kernel, SDS((3, 4), jnp.float32), jnp.arange(4, dtype=jnp.float32))
    np.testing.assert_allclose(out, np.broadcast_to(np.arange(4) / 4, (3, 4)))
