"""What the generated code costs, where upstream's Pallas emits the same: the thread that
issues single-thread operations is chosen once per kernel, SMEM holds no reduction
scratch a kernel does not reduce with, and a kernel is built once per ``pallas_call``
although it is checked at trace time and lowered later."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jaxlib.mlir import ir

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.backend import params
from pallas_mosaic_gpu._src.executor.launch import module_of
from pallas_mosaic_gpu._src.lowering import build
from pallas_mosaic_gpu._src.lowering import kernel as kernel_mod

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

F32 = jnp.float32
X = jax.ShapeDtypeStruct((32, 128), F32)


def _pipelined(body=None):
    """Two inputs and an output in (8, 128) blocks over a grid of 4: TMA copies and
    barrier arrivals at every step."""

    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = body(x_ref[...], y_ref[...]) if body else x_ref[...] - y_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=X, grid=(4,), in_specs=[spec, spec],
                          out_specs=spec, backend="mosaic_gpu")


def _built(f, *args):
    (eqn,) = [e for e in jax.make_jaxpr(f)(*args).jaxpr.eqns
              if e.primitive is pl.pallas_call_p]
    req = pallas.plugins.KernelRequest.from_params(eqn.params, eqn.params["compiler_params"])
    return build(req.jaxpr, req.grid_mapping, params(req.compiler_params), "k")


def test_the_issuing_thread_is_chosen_once_per_kernel():
    # Each copy and arrival is predicated on one thread of the warpgroup; choosing it
    # broadcasts the warp index across the warp (shfl.sync): once, at the kernel's entry
    # (the other one is Mosaic GPU's, choosing who initialises the barriers).
    text = str(module_of(_built(_pipelined(), X, X)))
    assert text.count("cp.async.bulk.tensor") >= 3  # two loads and a store per step
    assert text.count("nvvm.shfl.sync") == 2


def test_a_kernel_of_several_warpgroups_broadcasts_its_warp_index_once_more():
    # Its warpgroup index and its issuing thread, each computed once at the entry (and
    # Mosaic GPU's barrier initialisation).
    def kernel(x_gmem, o_gmem, buf, bars):
        wg = jax.lax.axis_index("wg")
        rows = pl.ds(wg * 16, 16)

        @pl.when(wg < 2)
        def _():
            for _ in range(3):
                plgpu.copy_gmem_to_smem(x_gmem.at[rows], buf.at[wg], bars.at[wg])
                plgpu.barrier_wait(bars.at[wg])
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(buf.at[wg], o_gmem.at[rows])
            plgpu.wait_smem_to_gmem(0)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((32, 128), F32), num_threads=2,
                     thread_name="wg",
                     scratch_types=[plgpu.SMEM((2, 16, 128), F32),
                                     plgpu.Barrier(num_barriers=2)])
    text = str(module_of(_built(f, X)))
    assert text.count("nvvm.shfl.sync") == 3


def test_smem_has_reduction_scratch_only_when_the_kernel_reduces():
    plain = _built(_pipelined(), X, X)
    reducing = _built(_pipelined(
        lambda x, y: x - jax.lax.broadcast_in_dim(y.sum(axis=1), (8, 128), [0])), X, X)
    blocks = 3 * 8 * 128 * 4
    assert plain.smem_bytes < blocks + 1024  # its three blocks and their barriers
    assert reducing.smem_bytes >= plain.smem_bytes + kernel_mod.REDUCTION_SCRATCH_BYTES


def test_a_pallas_call_is_built_once_from_trace_to_lowering(monkeypatch):
    built = []
    real = kernel_mod._build
    monkeypatch.setattr(kernel_mod, "_build", lambda *a: built.append(a) or real(*a))
    f = _pipelined(lambda x, y: x * y + 1.0)  # a kernel no other test builds
    jax.jit(f).trace(X, X).lower(lowering_platforms=("cuda",))
    assert len(built) == 1
    # A different kernel is built anew.
    jax.jit(_pipelined(lambda x, y: x * y + 2.0)).trace(X, X).lower(
        lowering_platforms=("cuda",))
    assert len(built) == 2


def _first_blocks(n_gmem, x_gmem, o_gmem, acc):
    """The sum of ``n_gmem[0]`` (traced) blocks of 64 rows of x, from block 1."""
    acc[...] = jnp.zeros((64, 128), F32)

    def step(_, x_smem):
        acc[...] += x_smem[...]

    plgpu.emit_pipeline(step, grid=(n_gmem[0],),
                        in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))],
                        max_concurrent_steps=2)(x_gmem.at[pl.ds(64, 192)])
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(acc, o_gmem)
    plgpu.wait_smem_to_gmem(0)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_pipeline_over_a_traced_grid_fills_its_slots_in_a_loop(steps):
    # As upstream: the first min(slots, steps) fetches are one copy in a loop, not one
    # per slot; fewer steps than slots (1) and more (3) both sum the right blocks.
    from pallas_mosaic_gpu._src.executor import run_kernel

    f = plgpu.kernel(_first_blocks, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     scratch_types=[plgpu.SMEM((64, 128), F32)])
    n = jnp.asarray([steps], jnp.int32)
    x = jnp.arange(256 * 128, dtype=F32).reshape(256, 128) / 1024
    k = _built(f, n, x)
    # One fetch in the prologue, one refill in the loop, the output's store.
    assert str(module_of(k)).count("cp.async.bulk.tensor") == 3
    (out,) = run_kernel(k, [n, x])
    want = sum(x[64 * (i + 1):64 * (i + 2)] for i in range(steps))
    assert jnp.allclose(out, want)


def test_barriers_pack_after_the_swizzled_buffers_with_no_padding():
    tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    tile = jax.ShapeDtypeStruct((64, 64), jnp.float16)

    def kernel(x_gmem, o_gmem):
        def body(a, bar, b):  # a barrier between two swizzled buffers
            plgpu.copy_gmem_to_smem(x_gmem, a, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            b[...] = a[...]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(b, o_gmem)
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(body, plgpu.SMEM((64, 64), jnp.float16, transforms=tr),
                      plgpu.Barrier(), plgpu.SMEM((64, 64), jnp.float16, transforms=tr))

    k = _built(plgpu.kernel(kernel, out_type=tile), tile)
    assert k.smem_bytes == 2 * 64 * 64 * 2 + 8  # the two tiles and one mbarrier


def _loads(read_between: bool):
    """Three TMA loads of x's rows into three slots, back to back or each after a read
    of the previous slot, then the sum of the slots stored."""

    def kernel(x_gmem, o_gmem, buf, bars, acc):
        acc[...] = jnp.zeros((16, 128), F32)
        for s in range(3):
            if read_between and s:
                plgpu.barrier_wait(bars.at[s - 1])
                acc[...] += buf[s - 1]
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(16 * s, 16)], buf.at[s], bars.at[s])
        for s in (2,) if read_between else range(3):
            plgpu.barrier_wait(bars.at[s])
        acc[...] += buf[2] if read_between else buf[0] + buf[1] + buf[2]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(acc, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((16, 128), F32),
                        scratch_types=[plgpu.SMEM((3, 16, 128), F32),
                                       plgpu.Barrier(num_barriers=3),
                                       plgpu.SMEM((16, 128), F32)])


@pytest.mark.parametrize("read_between", [False, True])
def test_a_tma_load_synchronises_the_warpgroup_only_after_memory_was_touched(read_between):
    # A TMA load first synchronises the warpgroup (no thread still reads its slot); back
    # to back loads share the first one's synchronisation, a read between them does not.
    from pallas_mosaic_gpu._src.executor import run_kernel

    x = jnp.arange(48 * 128, dtype=F32).reshape(48, 128) / 1024
    k = _built(_loads(read_between), x)
    text = str(module_of(k))
    plain = str(module_of(_built(_loads(False), x)))
    if read_between:
        assert text.count("bar.sync") > plain.count("bar.sync")
    assert text.count("cp.async.bulk.tensor") == 4
    (out,) = run_kernel(k, [x])
    assert jnp.allclose(out, x[:16] + x[16:32] + x[32:])


def test_a_fori_loop_over_traced_bounds_is_an_scf_for():
    # As upstream: lax.fori_loop(jnp.int32(0), n, ...) (a while loop in the jaxpr) is an
    # scf.for from 0 to n, with the rest of its carry as the loop's.
    from pallas_mosaic_gpu._src.executor import run_kernel

    def kernel(n_gmem, x_gmem, o_gmem, n_smem, acc, bar):
        plgpu.copy_gmem_to_smem(n_gmem, n_smem, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        acc[...] = jnp.zeros((16, 128), F32)

        def step(i, c):
            acc[...] += x_gmem[...] * i.astype(F32)
            return c + 1

        count = jax.lax.fori_loop(jnp.int32(1), n_smem[0], step, jnp.int32(0))
        acc[...] += jnp.full((16, 128), count, F32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(acc, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((16, 128), F32),
                     scratch_types=[plgpu.SMEM((128,), jnp.int32), plgpu.SMEM((16, 128), F32),
                                    plgpu.Barrier()])
    n = jnp.full((128,), 4, jnp.int32)
    x = jnp.ones((16, 128), F32)
    k = _built(f, n, x)
    text = str(module_of(k))
    assert "scf.for" in text and "scf.while" not in text
    (out,) = run_kernel(k, [n, x])
    assert jnp.allclose(out, (1 + 2 + 3) + 3)


def _for_loops(module) -> list:
    """The ``loop_annotation`` attribute (as text, or None) of each ``scf.for``."""
    found = []

    def visit(op):
        if op.name == "scf.for":
            attrs = op.attributes
            found.append(str(attrs["loop_annotation"]) if "loop_annotation" in attrs
                         else None)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def test_a_pipelines_step_loop_tells_llvm_not_to_unroll_it_and_other_loops_do_not():
    # The pipeline's scf.for carries llvm.br's own `loop_annotation` attribute (the name
    # that becomes !llvm.loop metadata on the back edge, "llvm.loop.unroll.disable"); a
    # kernel author's fori_loop carries none: LLVM decides, as upstream.
    def kernel(n_gmem, x_gmem, o_gmem, acc):
        _first_blocks(n_gmem, x_gmem, o_gmem, acc)
        jax.lax.fori_loop(jnp.int32(0), jnp.int32(3),
                          lambda i, c: acc.__setitem__(..., acc[...] * 2.0), None)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     scratch_types=[plgpu.SMEM((64, 128), F32)])
    x = jnp.zeros((256, 128), F32)
    module = module_of(_built(f, jnp.asarray([3], jnp.int32), x))
    # The slot prologue (a traced grid), the steps, the author's loop.
    assert _for_loops(module) == [
        None, "#llvm.loop_annotation<unroll = <disable = true>>", None]


def test_reading_an_accumulator_first_waits_for_its_wgmma_groups():
    # As upstream's accumulator read: PTX leaves the registers undefined until
    # wgmma.wait_group, and ptxas, left to insert the wait itself, put it after code
    # that may already reuse the operands' SMEM (and cost registers).
    from pallas_mosaic_gpu._src.executor import run_kernel

    tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def kernel(a_gmem, b_gmem, o_smem):
        def body(a, b, bar, acc):
            plgpu.copy_gmem_to_smem(a_gmem, a, bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, bar.at[0])
            plgpu.barrier_wait(bar.at[0])
            plgpu.wgmma(acc, a, b)  # no wgmma_wait: the read below waits
            o_smem[...] = acc[...]

        pl.run_scoped(body, plgpu.SMEM((64, 64), jnp.float16, transforms=tr),
                      plgpu.SMEM((64, 64), jnp.float16, transforms=tr),
                      plgpu.Barrier(num_arrivals=2), plgpu.ACC((64, 64)))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 64), F32),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                       backend="mosaic_gpu")
    a = (jnp.arange(64 * 64, dtype=F32).reshape(64, 64) % 7 - 3).astype(jnp.float16)
    k = _built(f, a, a.T)
    text = str(module_of(k))
    assert text.rindex("nvvm.wgmma.wait.group.sync.aligned 0") > \
        text.rindex("nvvm.wgmma.commit.group.sync.aligned")
    (out,) = run_kernel(k, [a, a.T])
    assert jnp.array_equal(out, jnp.dot(a, a.T, preferred_element_type=F32))


@pytest.mark.parametrize("slots", [2, 3])
def test_a_pipeline_carries_its_slot_instead_of_dividing_the_step(slots):
    # As upstream: the slot is a counter carried through the loop, the step's index over
    # a 1-D grid is the step itself, the refilled slot a mask of the step when the ring
    # is a power of two: no signed remainder, and LLVM cannot tie the slot to the body's
    # test of the step (transposed_ragged_dot_mgpu kept slot 0's SMEM addresses in
    # registers for it).
    from pallas_mosaic_gpu._src.executor import run_kernel

    def kernel(n_gmem, x_gmem, o_gmem, acc):
        acc[...] = jnp.zeros((64, 128), F32)

        def step(idx, x_smem):
            acc[...] += x_smem[...] * (idx[0] + 1).astype(F32)

        plgpu.emit_pipeline(step, grid=(n_gmem[0],),
                            in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))],
                            max_concurrent_steps=slots)(x_gmem)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(acc, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     scratch_types=[plgpu.SMEM((64, 128), F32)])
    n = jnp.asarray([4], jnp.int32)
    x = jnp.arange(256 * 128, dtype=F32).reshape(256, 128) / 1024
    k = _built(f, n, x)
    # A 3-slot ring divides once, for the slot the step refills.
    assert str(module_of(k)).count("arith.remsi") == (0 if slots == 2 else 1)
    (out,) = run_kernel(k, [n, x])
    assert jnp.allclose(out, sum((i + 1) * x[64 * i:64 * (i + 1)] for i in range(4)))


def test_a_kernel_without_output_blocks_ends_without_a_fence():
    # The fence and warpgroup barrier after the body order its SMEM writes before the
    # output blocks' copies; a plgpu.kernel writing GMEM itself has none to order.
    f = plgpu.kernel(_first_blocks, out_type=jax.ShapeDtypeStruct((64, 128), F32),
                     scratch_types=[plgpu.SMEM((64, 128), F32)])
    n = jnp.asarray([3], jnp.int32)
    text = str(module_of(_built(f, n, jnp.zeros((256, 128), F32))))
    assert text.count("nvvm.fence.proxy") == 1  # the body's own commit_smem
