"""GPU kernels written with the primitives of ``pallas_mosaic_gpu`` (``plgpu``):
warpgroups of one block (and warps of one warpgroup) that specialise and wait for each
other, TMA copies with
mbarrier pipelines and bulk async-groups, and ``wgmma`` matmuls from swizzled SMEM tiles.

They are registered only when pallas-mosaic-gpu is installed, and run for a backend
that claims their tags (``warpgroups``, ``tma_pipelines``, ``wgmma``, ``clusters``). The expected
numbers are GPU interpret mode's: at level ``interpret`` the suite binds the case to
``interpret=True``, which these cases turn into ``plgpu.InterpretParams()`` (every
thread of every block concurrently, with GPU memory and barrier semantics), compared
with the plain-JAX reference; a backend's levels are then compared with those numbers.
Kernels over a mesh of warpgroups are ``plgpu.kernel``s (a ``pallas_call`` has one
warpgroup per block), bound to the same mode through :func:`call_options`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pallas as pl
from pallas.plugins import LevelUnsupportedError
from pallas_conformance.registry import call_options, case, randn, sds

plgpu = None
try:  # the Mosaic GPU frontend; without it there are no GPU cases
    import pallas_mosaic_gpu as plgpu
except ImportError:  # pragma: no cover - depends on the installed packages
    pass

GMEM_SPEC = None if plgpu is None else pl.BlockSpec(memory_space=plgpu.GMEM)
TOL16 = {"float16": (2e-2, 2e-2), "bfloat16": (5e-2, 5e-2)}


def _mode(pallas_call) -> dict:
    """``interpret=plgpu.InterpretParams()`` (GPU interpret mode) when the suite asks for
    the interpreter, else the backend the suite bound."""
    kw = call_options(pallas_call)
    if kw.get("interpret"):
        return dict(interpret=plgpu.InterpretParams())
    return dict(backend=kw.get("backend"))


def _kernel(pallas_call, body, out_type, **kw):
    """``plgpu.kernel`` in the mode the suite bound ``pallas_call`` to. A mesh of
    warpgroups runs on the mosaic_gpu backend or in GPU interpret mode; any other
    backend cannot take it (reported unsupported, never run elsewhere)."""
    mode = _mode(pallas_call)
    if mode.get("backend") not in (None, "mosaic_gpu"):
        raise LevelUnsupportedError(
            f"a plgpu.kernel over a mesh of warpgroups runs on the mosaic_gpu backend (or "
            f"in GPU interpret mode), not on backend {mode['backend']!r}")
    return plgpu.kernel(body, out_type=out_type, interpret=mode.get("interpret"), **kw)


def _swizzled(dtype, swizzle: int) -> tuple:
    """The SMEM layout wgmma reads: tiles of (8, one swizzled row), swizzled."""
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle))


# --- warpgroups -------------------------------------------------------------------------


def producer_consumer(pallas_call, x):
    """Two warpgroups of one block: warpgroup 0 loads the tile with TMA, adds 1 and
    arrives on a barrier; warpgroup 1 waits on it, doubles the tile into its own buffer
    and stores it with TMA."""

    def body(x_gmem, o_gmem, tile, out, loaded, ready):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 1)
        def _():
            plgpu.barrier_wait(ready.at[0])
            out[...] = tile[...] * 2.0
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(x_gmem, tile, loaded.at[0])
            plgpu.barrier_wait(loaded.at[0])
            tile[...] = tile[...] + 1.0
            plgpu.barrier_arrive(ready.at[0])

    return _kernel(pallas_call, body, sds(x.shape, x.dtype), num_threads=2, thread_name="wg",
                   scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.SMEM(x.shape, x.dtype),
                                  plgpu.Barrier(num_barriers=1),
                                  plgpu.Barrier(num_barriers=1)])(x)


def warps_relay(pallas_call, x):
    """Warps of one warpgroup waiting for each other (``pl.core_map`` over a
    ``plgpu.WarpMesh``): warp 0 loads 16-row tiles into two SMEM slots with TMA once warp 1
    has freed them, warp 1 waits for each load, stores the slot with TMA and frees it for
    the next load into it."""
    steps, rows = x.shape[0] // 16, 16

    def body(x_gmem, o_gmem, slots, loaded, free):
        @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
        def _():
            warp = jax.lax.axis_index("warp")

            @pl.when(warp == 0)
            def _():
                def load(i, c):
                    @pl.when(i >= 2)
                    def _():
                        plgpu.barrier_wait(free.at[i % 2])

                    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * rows, rows)],
                                            slots.at[i % 2], loaded.at[i % 2])
                    return c

                jax.lax.fori_loop(0, steps, load, 0)

            @pl.when(warp == 1)
            def _():
                def store(i, c):
                    plgpu.barrier_wait(loaded.at[i % 2])
                    plgpu.copy_smem_to_gmem(slots.at[i % 2], o_gmem.at[pl.ds(i * rows, rows)])
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                    @pl.when(i + 2 < steps)  # a later load reuses the slot
                    def _():
                        plgpu.barrier_arrive(free.at[i % 2])

                    return c

                jax.lax.fori_loop(0, steps, store, 0)

    return _kernel(pallas_call, body, sds(x.shape, x.dtype),
                   scratch_types=[plgpu.SMEM((2, rows, x.shape[1]), x.dtype),
                                  plgpu.Barrier(num_barriers=2),
                                  plgpu.Barrier(num_barriers=2)])(x)


def rows_per_warpgroup(pallas_call, x):
    """A grid of 2 blocks x 2 warpgroups: each warpgroup copies its own 8 rows of the
    block's 16 into its slot of a block-wide buffer, squares them and stores them back;
    ``lax.axis_index`` of the grid and thread axes."""
    rows = x.shape[0] // 4

    def body(x_gmem, o_gmem):
        wg = jax.lax.axis_index("wg")
        part = pl.ds((jax.lax.axis_index("b") * 2 + wg) * rows, rows)

        def scoped(bufs, bars):
            buf = bufs.at[wg]
            plgpu.copy_gmem_to_smem(x_gmem.at[part], buf, bars.at[wg])
            plgpu.barrier_wait(bars.at[wg])
            buf[...] = buf[...] * buf[...] - 1.0
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf, o_gmem.at[part])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped, plgpu.SMEM((2, rows, x.shape[1]), x.dtype),
                      plgpu.Barrier(num_barriers=2), collective_axes="wg")

    return _kernel(pallas_call, body, sds(x.shape, x.dtype), grid=(2,), grid_names=("b",),
                   num_threads=2, thread_name="wg")(x)


# --- TMA pipelines ----------------------------------------------------------------------


def pipeline_sub(pallas_call, x, y):
    """``plgpu.emit_pipeline`` over a (2, 2) grid of (16, 128) blocks of GMEM operands:
    TMA loads into a two-slot ring per operand, x - y, TMA stores of the output blocks."""
    bm, bn = 16, 128

    def kernel(x_gmem, y_gmem, o_gmem):
        def step(_, x_smem, y_smem, o_smem):
            o_smem[...] = x_smem[...] - y_smem[...]

        spec = plgpu.BlockSpec((bm, bn), lambda i, j: (i, j))
        plgpu.emit_pipeline(step, grid=(x.shape[0] // bm, x.shape[1] // bn),
                            in_specs=[spec, spec], out_specs=[spec],
                            max_concurrent_steps=2)(x_gmem, y_gmem, o_gmem)

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype),
                       in_specs=[GMEM_SPEC, GMEM_SPEC], out_specs=GMEM_SPEC,
                       **_mode(pallas_call))(x, y)


def double_buffered_sum(pallas_call, x):
    """A hand-written double-buffered loop: while block k is summed, block k + 1 is
    already in flight into the other slot; each slot's barrier goes through one phase
    per use, so the waits alternate parities."""
    bm, n = 8, x.shape[0] // 8

    def kernel(x_gmem, o_ref):
        def scoped(slots, bars):
            def fetch(k):
                plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(k * bm, bm)], slots.at[k % 2],
                                        bars.at[k % 2])

            fetch(0)
            o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

            @pl.loop(0, n)
            def _(k):
                @pl.when(k + 1 < n)
                def _():
                    fetch(k + 1)

                plgpu.barrier_wait(bars.at[k % 2])
                o_ref[...] += slots[k % 2]

        pl.run_scoped(scoped, plgpu.SMEM((2, bm, x.shape[1]), x.dtype),
                      plgpu.Barrier(num_barriers=2))

    return pallas_call(kernel, out_shape=sds((bm, x.shape[1]), x.dtype),
                       in_specs=[GMEM_SPEC], **_mode(pallas_call))(x)


def bulk_group_stores(pallas_call, x):
    """Output rows stored by TMA from two SMEM slots in turn: before a slot is
    rewritten, ``wait_smem_to_gmem(1, wait_read_only=True)`` waits for the older bulk
    group (the store that read it); the last ones are waited for at the end."""
    bm, n = 8, x.shape[0] // 8

    def kernel(x_ref, o_gmem):
        def scoped(slots):
            @pl.loop(0, n)
            def _(k):
                slot = slots.at[k % 2]
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                slot[...] = x_ref[pl.ds(k * bm, bm), :] * (k + 1).astype(x.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(slot, o_gmem.at[pl.ds(k * bm, bm)])

            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped, plgpu.SMEM((2, bm, x.shape[1]), x.dtype))

    return pallas_call(kernel, out_shape=sds(x.shape, x.dtype), out_specs=GMEM_SPEC,
                       **_mode(pallas_call))(x)


def bulk_copy_of_a_dynamic_slice(pallas_call, start, x):
    """``copy_gmem_to_smem`` of a slice of a 1-D array at a start read at run time,
    promised in bounds: Mosaic GPU issues it as one bulk (non-tensor) copy that completes
    its bytes on the barrier."""
    size = 128

    def body(start_ref, x_gmem, o_ref, smem, barrier):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(start_ref[...], size)], smem, barrier,
                                oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
        plgpu.barrier_wait(barrier)
        o_ref[...] = smem[...]

    return _kernel(pallas_call, body, sds((size,), x.dtype),
                   scratch_types=[plgpu.SMEM((size,), x.dtype), plgpu.Barrier()])(start, x)


def transposed_register_layout(pallas_call):
    """A (128, 64) f16 iota in the WGMMA register layout, cast to WGMMA_TRANSPOSED and
    stored through a transposed view of the (64, 128) output: the cast permutes the
    16-bit halves of registers between threads (PTX byte permutes)."""
    shape = (128, 64)

    def body(o_ref):
        layout = plgpu.Layout.WGMMA
        iota = plgpu.broadcasted_iota(jnp.float16, shape, 0, layout=layout) * shape[1]
        iota += plgpu.broadcasted_iota(jnp.float16, shape, 1, layout=layout)
        plgpu.transpose_ref(o_ref, (1, 0))[...] = plgpu.layout_cast(
            iota, plgpu.Layout.WGMMA_TRANSPOSED)

    return pallas_call(body, out_shape=sds(shape[::-1], jnp.float16),
                       out_specs=plgpu.BlockSpec(transforms=_swizzled(jnp.float16, 128)),
                       **_mode(pallas_call))()


def chained_warp_specialized_pipelines(pallas_call, x):
    """Three ``emit_pipeline_warp_specialized`` pipelines sharing their allocations
    (``pipeline_state`` START, STEADY, STOP, a traced value in a loop), then one on its
    own: each adds every (64, 64) block of x into one SMEM sum. The memory warpgroup
    refills slots across pipeline boundaries (waiting for the previous pipeline's
    releases) and drains them only at STOP."""
    blk = 64

    def body(x_gmem, o_gmem, acc):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            acc[...] = jnp.zeros_like(acc)

        def add(_, x_smem):
            acc[...] += x_smem[...]

        def pipeline(state):
            return plgpu.emit_pipeline_warp_specialized(
                add, grid=(x.shape[0] // blk, x.shape[1] // blk), memory_registers=40,
                max_concurrent_steps=2, num_compute_wgs=1, wg_axis="wg",
                in_specs=[pl.BlockSpec((blk, blk), lambda i, j: (i, j))],
                pipeline_state=state)

        def scope(allocs):
            @pl.loop(0, 3)
            def _(i):
                state = jnp.where(i > 0, plgpu.PipelinePipeline.STEADY,
                                  plgpu.PipelinePipeline.START)
                pipeline(jnp.where(i == 2, plgpu.PipelinePipeline.STOP, state))(
                    x_gmem, allocations=allocs)

            pipeline(None)(x_gmem, allocations=allocs)

        pl.run_scoped(scope, pipeline(None).get_allocations(x_gmem), collective_axes="wg")

        @pl.when(wg == 0)
        def _():
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(acc, o_gmem)
            plgpu.wait_smem_to_gmem(0)

    return _kernel(pallas_call, body, sds((blk, blk), x.dtype), num_threads=2,
                   thread_name="wg", scratch_types=[plgpu.SMEM((blk, blk), x.dtype)])(x)


# --- wgmma ------------------------------------------------------------------------------


def _wgmma_matmul(pallas_call, x, y, *, swizzle, transpose_b=False, bk=64, epilogue=None):
    """``x @ y`` (or ``x @ y.T`` with ``transpose_b``) in (64, N) output tiles: the K
    blocks are pipelined into swizzled SMEM and accumulated with wgmma; the tile stored
    is ``epilogue(acc, block index)`` (default: the accumulator read)."""
    m, k = x.shape
    n = y.shape[0] if transpose_b else y.shape[1]
    bm, bn = 64, n
    bk = min(bk, swizzle // jnp.dtype(x.dtype).itemsize)
    t = _swizzled(x.dtype, swizzle)

    def kernel(x_gmem, y_gmem, o_ref):
        mi = pl.program_id(0)

        def with_acc(acc):
            def step(_, x_smem, y_smem):
                b = plgpu.transpose_ref(y_smem, (1, 0)) if transpose_b else y_smem
                plgpu.wgmma(acc, x_smem, b)
                plgpu.wgmma_wait(0)

            y_spec = plgpu.BlockSpec((bn, bk), lambda kk: (0, kk), transforms=t) \
                if transpose_b else plgpu.BlockSpec((bk, bn), lambda kk: (kk, 0), transforms=t)
            plgpu.emit_pipeline(
                step, grid=(k // bk,), max_concurrent_steps=2,
                in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (mi, kk), transforms=t),
                          y_spec])(x_gmem, y_gmem)
            o_ref[...] = acc[...] if epilogue is None else epilogue(acc, mi)

        pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

    return pallas_call(kernel, out_shape=sds((m, n), jnp.float32), grid=(m // bm,),
                       in_specs=[GMEM_SPEC, GMEM_SPEC],
                       out_specs=pl.BlockSpec((bm, bn), lambda i: (i, 0)),
                       **_mode(pallas_call))(x, y)


def wgmma_matmul_f16(pallas_call, x, y):
    """f16 x @ y: 128-byte swizzled tiles, B N-major (as stored), two K steps."""
    return _wgmma_matmul(pallas_call, x, y, swizzle=128)


def wgmma_matmul_bf16_transposed(pallas_call, x, y):
    """bf16 x @ y.T: 64-byte swizzled tiles, B read K-major through transpose_ref."""
    return _wgmma_matmul(pallas_call, x, y, swizzle=64, transpose_b=True)


def wgmma_cond_on_the_accumulator(pallas_call, x, y):
    """A ``lax.cond`` whose branches read the wgmma accumulator (arrays in the WGMMA
    register layout) and return it scaled or shifted: even output tiles get
    ``2 * x @ y``, odd ones ``x @ y - 1``. The branch results keep the WGMMA layout."""
    def epilogue(acc, mi):
        return jax.lax.cond(mi % 2 == 0, lambda: acc[...] * 2.0, lambda: acc[...] - 1.0)

    return _wgmma_matmul(pallas_call, x, y, swizzle=128, epilogue=epilogue)


def wgmma_blockspec_transforms(pallas_call, x, y):
    """One wgmma straight from the pallas_call's operands: both ``plgpu.BlockSpec``s carry
    ``transforms=(TilingTransform((8, 64)), SwizzleTransform(128))``, so the blocks land
    tiled and swizzled in SMEM (the TMA copies apply the layout) and feed the tensor
    cores without an emit_pipeline; the accumulator is a ``run_scoped`` ``plgpu.ACC``."""
    m, n = x.shape[0], y.shape[1]
    t = _swizzled(x.dtype, 128)

    def kernel(x_smem, y_smem, o_ref):
        def with_acc(acc):
            plgpu.wgmma(acc, x_smem, y_smem)
            plgpu.wgmma_wait(0)
            return acc[...]

        o_ref[...] = pl.run_scoped(with_acc, plgpu.ACC((m, n), jnp.float32))

    return pallas_call(kernel, out_shape=sds((m, n), jnp.float32),
                       in_specs=[plgpu.BlockSpec(x.shape, lambda: (0, 0), transforms=t),
                                 plgpu.BlockSpec(y.shape, lambda: (0, 0), transforms=t)],
                       out_specs=pl.BlockSpec((m, n), lambda: (0, 0)),
                       **_mode(pallas_call))(x, y)


def wgmma_warp_specialized(pallas_call, x, y, *, a_in_registers=False, delay_release=0):
    """A warp-specialised f16 matmul (``emit_pipeline_warp_specialized``): one warpgroup
    issues the TMA loads, the other waits for them, runs wgmma and releases the slots,
    then stores its tile with TMA. With ``a_in_registers`` the compute warpgroup loads
    its x slot into registers (``x_smem[...]``) and passes wgmma that array. With
    ``delay_release=1`` each step's wgmma is awaited only at the next step, and its slot
    released then."""
    m, k = x.shape
    n = y.shape[1]
    bm, bn, bk = 64, n, 64
    t = _swizzled(x.dtype, 128)

    def body(x_gmem, y_gmem, o_gmem, o_smem):
        mi = jax.lax.axis_index("m")

        def step(_, x_smem, y_smem, acc):
            plgpu.wgmma(acc, x_smem[...] if a_in_registers else x_smem, y_smem)
            plgpu.wgmma_wait(delay_release)
            return acc

        def compute(eval_pipeline):
            def with_acc(acc):
                eval_pipeline(acc)
                plgpu.wgmma_wait(0)
                o_smem[...] = acc[...]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(mi * bm, bm)])
                plgpu.wait_smem_to_gmem(0)

            pl.run_scoped(with_acc, plgpu.ACC((bm, bn), jnp.float32))

        plgpu.emit_pipeline_warp_specialized(
            step, grid=(k // bk,), memory_registers=40, wg_axis="wg", num_compute_wgs=1,
            max_concurrent_steps=2, compute_context=compute,
            in_specs=[plgpu.BlockSpec((bm, bk), lambda kk: (mi, kk), transforms=t,
                                      delay_release=delay_release),
                      plgpu.BlockSpec((bk, bn), lambda kk: (kk, 0), transforms=t,
                                      delay_release=delay_release)],
        )(x_gmem, y_gmem)

    return _kernel(pallas_call, body, sds((m, n), jnp.float32), grid=(m // bm,),
                   grid_names=("m",), num_threads=2, thread_name="wg",
                   scratch_types=[plgpu.SMEM((bm, bn), jnp.float32)])(x, y)


def wgmma_a_in_registers_warp_specialized(pallas_call, x, y):
    """The warp-specialised matmul with A loaded from its swizzled pipeline slot into
    registers. The register load swizzles by offsets from the slot's start, TMA and
    wgmma by address bits: they agree only when every swizzled slot starts on a whole
    swizzle atom (1024 bytes for a 128-byte swizzle), which Mosaic GPU's lowering once
    missed (each row then read A's two K-halves swapped)."""
    return wgmma_warp_specialized(pallas_call, x, y, a_in_registers=True)


def wgmma_delay_release_warp_specialized(pallas_call, x, y):
    """The warp-specialised matmul with ``delay_release=1``: the memory warpgroup may
    refill a slot only once the step after its use has awaited that step's wgmma; the
    last step's slot is never released (the pipeline's barrier phases must balance)."""
    return wgmma_warp_specialized(pallas_call, x, y, delay_release=1)


def cluster_multicast(pallas_call, x):
    """Clusters of two blocks: each cluster loads its 64 rows of x once, the copy split
    between its blocks and multicast to both (``collective_axes``); block ``c`` of
    cluster ``g`` writes ``2 x + c``; the blocks then meet on a ``plgpu.ClusterBarrier``
    (each arrives on the other's mbarrier) before exiting."""
    f32 = jnp.float32

    def body(x_gmem, o_gmem, x_smem, o_smem, tma, bye):
        c, g = jax.lax.axis_index("x"), jax.lax.axis_index("g")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(g * 64, 64)], x_smem, tma.at[0],
                                collective_axes="x")
        plgpu.barrier_wait(tma.at[0])
        o_smem[...] = x_smem[...] * 2.0 + c.astype(f32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[g, c])
        plgpu.wait_smem_to_gmem(0)
        plgpu.barrier_arrive(bye.at[0])
        plgpu.barrier_wait(bye.at[0])

    n = x.shape[0] // 64
    return _kernel(pallas_call, body, sds((n, 2, 64, x.shape[1]), f32), grid=(n,),
                   grid_names=("g",), cluster=(2,), cluster_names=("x",), num_threads=1,
                   thread_name="wg",
                   scratch_types=dict(x_smem=plgpu.SMEM((64, x.shape[1]), f32),
                                      o_smem=plgpu.SMEM((64, x.shape[1]), f32),
                                      tma=plgpu.Barrier(),
                                      bye=plgpu.ClusterBarrier(collective_axes=("x",))))(x)


def _cluster_multicast_ref(x):
    rows = x.reshape(-1, 1, 64, x.shape[1])
    return jnp.concatenate([rows * 2.0, rows * 2.0 + 1.0], axis=1)


def _dot(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def _register():
    f32 = jnp.float32
    case("gpu/warpgroups_producer_consumer", tags={"warpgroups", "tma_pipelines"},
         inputs=lambda rng: (randn(rng, (8, 128)),),
         reference=lambda x: (x + 1.0) * 2.0)(producer_consumer)
    case("gpu/warpgroups_own_rows", tags={"warpgroups", "tma_pipelines"},
         inputs=lambda rng: (randn(rng, (32, 128)),),
         reference=lambda x: x * x - 1.0)(rows_per_warpgroup)
    case("gpu/warps_wait_for_each_other", tags={"warpgroups", "tma_pipelines"},
         inputs=lambda rng: (randn(rng, (96, 128)),),
         reference=lambda x: x)(warps_relay)
    case("gpu/tma_emit_pipeline_sub", tags={"tma_pipelines"},
         inputs=lambda rng: (randn(rng, (32, 256)), randn(rng, (32, 256))),
         reference=jnp.subtract)(pipeline_sub)
    case("gpu/tma_double_buffered_sum", tags={"tma_pipelines"},
         inputs=lambda rng: (randn(rng, (32, 128)),),
         reference=lambda x: x.reshape(4, 8, 128).sum(0))(double_buffered_sum)
    case("gpu/tma_stores_in_bulk_groups", tags={"tma_pipelines"},
         inputs=lambda rng: (randn(rng, (24, 128)),),
         reference=lambda x: x * jnp.repeat(jnp.arange(1, 4, dtype=f32), 8)[:, None],
         )(bulk_group_stores)
    case("gpu/tma_bulk_copy_of_a_dynamic_slice", tags={"tma_pipelines"},
         inputs=lambda rng: (jnp.asarray(48, jnp.int32), randn(rng, (208,))),
         reference=lambda start, x: jax.lax.dynamic_slice(x, (start,), (128,)),
         )(bulk_copy_of_a_dynamic_slice)
    case("gpu/transposed_register_layout", tags={"wgmma", "f16"}, inputs=lambda rng: (),
         reference=lambda: jnp.arange(128 * 64, dtype=jnp.float16).reshape(128, 64).T,
         )(transposed_register_layout)
    case("gpu/ws_chained_pipelines", tags={"warpgroups", "tma_pipelines"},
         inputs=lambda rng: (randn(rng, (128, 128)),),
         reference=lambda x: 4 * x.reshape(2, 64, 2, 64).sum((0, 2)),
         tolerance={"float32": (1e-5, 1e-5)})(chained_warp_specialized_pipelines)
    case("gpu/cluster_multicast_load", tags={"clusters", "tma_pipelines"},
         inputs=lambda rng: (randn(rng, (128, 128)),),
         reference=_cluster_multicast_ref)(cluster_multicast)
    case("gpu/wgmma_matmul_f16_swizzle128", tags={"wgmma", "tma_pipelines", "f16"},
         inputs=lambda rng: (randn(rng, (64, 128), jnp.float16),
                             randn(rng, (128, 128), jnp.float16)),
         reference=_dot, tolerance={"float32": (1e-2, 1e-3)})(wgmma_matmul_f16)
    case("gpu/wgmma_blockspec_transforms_both_operands", tags={"wgmma", "f16"},
         inputs=lambda rng: (randn(rng, (64, 128), jnp.float16),
                             randn(rng, (128, 192), jnp.float16)),
         reference=_dot, tolerance={"float32": (1e-2, 1e-3)})(wgmma_blockspec_transforms)
    case("gpu/wgmma_cond_on_the_accumulator", tags={"wgmma", "tma_pipelines", "f16"},
         inputs=lambda rng: (randn(rng, (128, 128), jnp.float16),
                             randn(rng, (128, 64), jnp.float16)),
         reference=lambda x, y: jnp.where((jnp.arange(128) // 64 % 2 == 0)[:, None],
                                          2 * _dot(x, y), _dot(x, y) - 1),
         tolerance={"float32": (1e-2, 1e-3)})(wgmma_cond_on_the_accumulator)
    case("gpu/wgmma_transposed_b_bf16_swizzle64",
         tags={"wgmma", "tma_pipelines", "bf16"},
         inputs=lambda rng: (randn(rng, (64, 64), jnp.bfloat16),
                             randn(rng, (128, 64), jnp.bfloat16)),
         reference=lambda x, y: _dot(x, y.T), tolerance={"float32": (1e-2, 1e-3)},
         )(wgmma_matmul_bf16_transposed)
    case("gpu/wgmma_warp_specialized", tags={"wgmma", "warpgroups", "tma_pipelines", "f16"},
         inputs=lambda rng: (randn(rng, (128, 128), jnp.float16),
                             randn(rng, (128, 128), jnp.float16)),
         reference=_dot, tolerance={"float32": (1e-2, 1e-3)})(wgmma_warp_specialized)
    case("gpu/wgmma_a_in_registers_warp_specialized",
         tags={"wgmma", "warpgroups", "tma_pipelines", "f16"},
         inputs=lambda rng: (randn(rng, (64, 128), jnp.float16),
                             randn(rng, (128, 64), jnp.float16)),
         reference=_dot, tolerance={"float32": (1e-2, 1e-3)},
         )(wgmma_a_in_registers_warp_specialized)
    case("gpu/wgmma_ws_delay_release", tags={"wgmma", "warpgroups", "tma_pipelines", "f16"},
         inputs=lambda rng: (randn(rng, (64, 256), jnp.float16),
                             randn(rng, (256, 64), jnp.float16)),
         reference=_dot, tolerance={"float32": (1e-2, 1e-3)},
         )(wgmma_delay_release_warp_specialized)


if plgpu is not None:
    _register()
