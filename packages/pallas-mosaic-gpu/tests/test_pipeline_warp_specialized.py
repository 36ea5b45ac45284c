"""``emit_pipeline_warp_specialized``: slots released ``delay_release`` steps late (by the
pipeline or, with ``manual_consumed_barriers``, by the body), traced grids, and the
register split ``memory_registers`` asks for (``setmaxnreg``), in GPU interpret mode
with race detection (whose barrier checks see every unbalanced release) and at the
emulate level (the generated module executed), checked against plain JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu import interpret as gpu_interpret

IP = plgpu.InterpretParams
F32 = jnp.float32


def _tiled_add(m, n, *, delay, slots, static=True, manual=False, num_compute_wgs=1):
    """x + y in (32 * wgs, 64) blocks; each compute warpgroup adds its own rows."""
    bm, bn = 32, 64
    spec = plgpu.BlockSpec((num_compute_wgs * bm, bn), lambda i, j: (i, j),
                           delay_release=delay)
    out_spec = plgpu.BlockSpec((num_compute_wgs * bm, bn), lambda i, j: (i, j))

    def body(idx, x_smem, y_smem, o_smem, *consumed):
        rows = pl.ds(jax.lax.axis_index("wg") * bm, bm)
        o_smem[rows] = x_smem[rows] + y_smem[rows]
        if manual:  # the body releases the slot of step - delay, from step `delay` on
            step = idx[0] * (n // bn) + idx[1]

            @pl.when(step >= delay)
            def _():
                for b in consumed:
                    plgpu.barrier_arrive(b)

    def kernel(*refs):
        grid = (m // (num_compute_wgs * bm), n // bn)
        if not static:
            grid = tuple(jnp.asarray(g, jnp.int32) for g in grid)
        plgpu.emit_pipeline_warp_specialized(
            body, grid=grid, max_concurrent_steps=slots, manual_consumed_barriers=manual,
            num_compute_wgs=num_compute_wgs, memory_registers=40, wg_axis="wg",
            in_specs=[spec, spec], out_specs=[out_spec])(*refs)

    return kernel


@pytest.mark.parametrize("delay,slots,static,manual", [
    (1, 2, True, False), (2, 3, False, False), (1, 2, True, True)])
def test_delay_release_adds_tiles_without_races(delay, slots, static, manual):
    m, n = 64, 128
    kernel = _tiled_add(m, n, delay=delay, slots=slots, static=static, manual=manual)
    x = jax.random.uniform(jax.random.key(0), (m, n), F32)
    y = jax.random.uniform(jax.random.key(1), (m, n), F32)
    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((m, n), F32), num_threads=2,
                     thread_name="wg", interpret=IP(detect_races=True))
    np.testing.assert_allclose(f(x, y), x + y, rtol=1e-6)
    assert not gpu_interpret.get_races().races_found


def test_a_pipeline_of_fewer_steps_than_slots_releases_what_it_can():
    """Two steps, three slots, delay 2: no step is ever released, nothing is awaited."""
    kernel = _tiled_add(32, 128, delay=2, slots=3)
    x = jnp.arange(32 * 128, dtype=F32).reshape(32, 128)
    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(x.shape, F32), num_threads=2,
                     thread_name="wg", interpret=IP(detect_races=True))
    np.testing.assert_array_equal(f(x, x), 2 * x)


def _wgmma_delayed(m=64, k=256, n=64):
    """The pattern delay_release exists for: each step's wgmma is awaited only at the
    next step (``wgmma_wait(1)``), so its operands' slot stays unreleased one step
    longer. (GPU interpret mode computes a wgmma when issued, so only the emulate level
    could see a slot refilled under an unfinished one.)"""
    t = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def kernel(a_gmem, b_gmem, o_gmem, o_smem):
        def step(_, a_smem, b_smem, acc):
            plgpu.wgmma(acc, a_smem, b_smem)
            plgpu.wgmma_wait(1)
            return acc

        def compute(eval_pipeline):
            def with_acc(acc):
                eval_pipeline(acc)
                plgpu.wgmma_wait(0)
                o_smem[...] = acc[...]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, o_gmem)
                plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(with_acc, plgpu.ACC((m, n), F32))

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(k // 64,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            max_concurrent_steps=2, compute_context=compute,
            in_specs=[plgpu.BlockSpec((m, 64), lambda kk: (0, kk), transforms=t,
                                      delay_release=1),
                      plgpu.BlockSpec((64, n), lambda kk: (kk, 0), transforms=t,
                                      delay_release=1)],
        )(a_gmem, b_gmem)

    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float16)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.float16)
    return kernel, (a, b), jax.ShapeDtypeStruct((m, n), F32), [plgpu.SMEM((m, n), F32)]


def _chained(m=128, n=128, blk=64, manual=False):
    """Three pipelines sharing allocations (START, STEADY, STOP, the state a traced
    value), then one on its own (``pipeline_state=None``), each adding every block of
    x into one SMEM sum: the memory warpgroup refills slots across pipeline boundaries
    and drains only after STOP."""
    def body(x_ref, o_gmem, acc):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            acc[...] = jnp.zeros_like(acc)

        def add(_, x_smem, *consumed):
            acc[...] += x_smem[...]
            for b in consumed:
                plgpu.barrier_arrive(b)

        spec = pl.BlockSpec((blk, blk), lambda i, j: (i, j))

        def pipeline(state):
            return plgpu.emit_pipeline_warp_specialized(
                add, grid=(m // blk, n // blk), memory_registers=40, max_concurrent_steps=2,
                num_compute_wgs=1, wg_axis="wg", manual_consumed_barriers=manual,
                in_specs=[spec], pipeline_state=state)

        def scope(allocs):
            @pl.loop(0, 3)
            def _(i):
                state = jnp.where(i > 0, plgpu.PipelinePipeline.STEADY,
                                  plgpu.PipelinePipeline.START)
                state = jnp.where(i == 2, plgpu.PipelinePipeline.STOP, state)
                pipeline(state)(x_ref, allocations=allocs)

            pipeline(None)(x_ref, allocations=allocs)

        pl.run_scoped(scope, pipeline(None).get_allocations(x_ref), collective_axes="wg")

        @pl.when(wg == 0)
        def _():
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(acc, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    x = jax.random.randint(jax.random.key(0), (m, n), -10, 15, jnp.int32)
    want = 4 * x.reshape(m // blk, blk, n // blk, blk).sum((0, 2))
    return body, x, jax.ShapeDtypeStruct((blk, blk), jnp.int32), \
        [plgpu.SMEM((blk, blk), jnp.int32)], want


@pytest.mark.parametrize("manual", [False, True])
def test_chained_pipelines_share_slots_without_races(manual):
    body, x, out_type, scratch, want = _chained(manual=manual)
    f = plgpu.kernel(body, out_type=out_type, num_threads=2, thread_name="wg",
                     scratch_types=scratch, interpret=IP(detect_races=True))
    np.testing.assert_array_equal(f(x), want)
    assert not gpu_interpret.get_races().races_found


def test_pipeline_state_needs_shared_allocations_and_whole_rounds_of_slots():
    x = jnp.zeros((16, 128), F32)

    def kernel(x_gmem):
        _ws(pipeline_state=plgpu.PipelinePipeline.START)(x_gmem)

    f = plgpu.kernel(kernel, out_type=(), num_threads=2, thread_name="wg", interpret=IP())
    with pytest.raises(ValueError, match="automatic allocation"):
        jax.make_jaxpr(f)(x)
    with pytest.raises(NotImplementedError, match="divisible by max_concurrent_steps=2"):
        _ws(grid=(3,), pipeline_state=plgpu.PipelinePipeline.START)


# --- emulate: the generated module executed ---------------------------------------------


def _emulate(kernel, args, out_type, scratch=()):
    pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs "
                        "jax-cuda13-plugin")
    import pallas.plugins

    def f(*xs):
        return plgpu.kernel(kernel, out_type=out_type, num_threads=2, thread_name="wg",
                            scratch_types=list(scratch))(*xs)

    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns
              if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    (out,) = pallas.plugins.get_backend("mosaic_gpu").emulate(req, *args)
    return np.asarray(out)


@pytest.mark.parametrize("manual", [False, True])
def test_delay_release_at_emulate(manual):
    m, n = 64, 128
    x = jax.random.uniform(jax.random.key(0), (m, n), F32)
    y = jax.random.uniform(jax.random.key(1), (m, n), F32)
    kernel = _tiled_add(m, n, delay=1, slots=2, manual=manual)
    np.testing.assert_allclose(_emulate(kernel, (x, y), jax.ShapeDtypeStruct((m, n), F32)),
                               x + y, rtol=1e-6)


def test_chained_pipelines_at_emulate():
    body, x, out_type, scratch, want = _chained(manual=True)
    np.testing.assert_array_equal(_emulate(body, (x,), out_type, scratch), want)


def test_a_delayed_wgmma_pipeline_at_emulate_and_in_interpret_mode():
    kernel, (a, b), out_type, scratch = _wgmma_delayed()
    want = jnp.dot(a, b, preferred_element_type=F32)
    np.testing.assert_allclose(_emulate(kernel, (a, b), out_type, scratch), want,
                               rtol=1e-3, atol=1e-3)
    f = plgpu.kernel(kernel, out_type=out_type, num_threads=2, thread_name="wg",
                     scratch_types=scratch, interpret=IP(detect_races=True))
    np.testing.assert_allclose(f(a, b), want, rtol=1e-3, atol=1e-3)
    assert not gpu_interpret.get_races().races_found


def _ws(**kw):
    args = dict(grid=(2,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
                in_specs=[plgpu.BlockSpec((8, 128), lambda i: (i, 0))])
    return plgpu.emit_pipeline_warp_specialized(lambda *a: None, **{**args, **kw})


@pytest.mark.parametrize("bad", [41, 16, 264, 40.0, True])
def test_memory_registers_outside_setmaxnreg_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"memory_registers=.*multiple of 8 in \[24, 256\]"):
        _ws(memory_registers=bad)


@pytest.mark.parametrize("n,action,match", [
    (41, "increase", r"n=41\): must be a multiple of 8 in \[24, 256\]"),
    (264, "decrease", r"n=264\)"), (40, "up", r"action='up'\): must be 'increase'")])
def test_set_max_registers_refuses_what_setmaxnreg_cannot_take(n, action, match):
    with pytest.raises(ValueError, match=match):
        plgpu.set_max_registers(n, action=action)


def test_compute_warpgroups_share_what_the_memory_warpgroup_leaves():
    from pallas_mosaic_gpu._src.pipeline_ws import _compute_registers

    # (512 - memory) / compute warpgroups, at most 256, a multiple of 8 (upstream's split).
    assert [_compute_registers(40, w) for w in (1, 2, 3)] == [256, 232, 152]
    with pytest.raises(ValueError, match="num_compute_wgs=20.*below setmaxnreg's minimum"):
        _ws(num_compute_wgs=20)


def test_inputs_must_share_one_delay_release():
    specs = [plgpu.BlockSpec((8, 128), lambda i: (i, 0), delay_release=d) for d in (0, 1)]
    with pytest.raises(NotImplementedError, match="same delay_release.*\\[0, 1\\]"):
        _ws(in_specs=specs, max_concurrent_steps=2)
    with pytest.raises(ValueError, match="max_concurrent_steps=2, delay_release=2"):
        _ws(in_specs=[plgpu.BlockSpec((8, 128), lambda i: (i, 0), delay_release=2)])


def test_the_pipeline_must_run_once_in_compute_context():
    x = jnp.zeros((16, 128), F32)

    def kernel(x_gmem):
        _ws(compute_context=lambda run: None)(x_gmem)

    f = plgpu.kernel(kernel, out_type=(), num_threads=2, thread_name="wg",
                     interpret=IP())
    with pytest.raises(ValueError, match="not called in `compute_context`"):
        jax.make_jaxpr(f)(x)
