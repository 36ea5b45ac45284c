"""A kernel's VMEM footprint at trace time (``pallas_tpu.compiler.vmem_footprint``) and
the check against the chip's scoped VMEM limit: blocks x buffers, whole operands,
scratch, padded to the (8, 128) tiling; checked against libtpu's own figure."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu import compiler

S = jax.ShapeDtypeStruct
MiB = 1 << 20


def _scale(x, rows=128, cols=None, chip=None, limit=None):
    cols = cols or x.shape[1]
    spec = pl.BlockSpec((rows, cols), lambda i: (i, 0))
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
        out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // rows,), in_specs=[spec],
        out_specs=spec, backend="mosaic_tpu",
        compiler_params=pltpu.CompilerParams(chip=chip, vmem_limit_bytes=limit))(x)


def _bias(x, b):
    # The bias block's index never changes: one buffer.
    spec = pl.BlockSpec((128, 256), lambda i: (i, 0))
    return pl.pallas_call(
        lambda x_ref, b_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + b_ref[0:1, :]),
        out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // 128,),
        in_specs=[spec, pl.BlockSpec((8, 256), lambda i: (0, 0))], out_specs=spec,
        backend="mosaic_tpu")(x, b)


def _matmul(a, b, bm=128, bk=128):
    def kernel(a_ref, b_ref, o_ref, acc, sem):
        del sem

        @pl.when(pl.program_id(1) == 0)
        def _():
            acc[...] = jnp.zeros_like(acc)

        acc[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc[...].astype(o_ref.dtype)

    (m, k), n = a.shape, b.shape[1]
    return pl.pallas_call(
        kernel, out_shape=S((m, n), a.dtype), grid=(m // bm, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, l: (i, l)),
                  pl.BlockSpec((bk, n), lambda i, l: (l, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i, l: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bm, n), jnp.float32), pltpu.SemaphoreType.DMA],
        backend="mosaic_tpu")(a, b)


KERNELS = {
    # name: (function, args, expected footprint in bytes)
    "scale_f32": (_scale, (S((512, 128), jnp.float32),), 2 * 2 * 128 * 128 * 4),
    # (40, 300) bf16, no grid: one buffer each, padded to (40, 384).
    "whole_bf16": (functools.partial(_scale, rows=40), (S((40, 300), jnp.bfloat16),),
                   2 * 40 * 384 * 2),
    "bias_constant_index": (_bias, (S((512, 256), jnp.float32), S((8, 256), jnp.float32)),
                            2 * 2 * 128 * 256 * 4 + 8 * 256 * 4),
    # bf16 blocks double-buffered, the f32 accumulator once, the semaphore not in VMEM.
    "matmul_bf16": (_matmul, (S((256, 512), jnp.bfloat16), S((512, 256), jnp.bfloat16)),
                    2 * 128 * 128 * 2 + 2 * 128 * 256 * 2 + 2 * 128 * 256 * 2
                    + 128 * 256 * 4),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_footprint_is_blocks_times_buffers_plus_scratch(name):
    f, args, want = KERNELS[name]
    (items,) = compiler.vmem_footprint(f, *args)
    assert sum(i.bytes for i in items) == want
    assert all(i.exact for i in items)


def test_buffers_follow_the_index_map_and_pipeline_mode():
    f, args, _ = KERNELS["bias_constant_index"]
    (items,) = compiler.vmem_footprint(f, *args)
    assert [(i.what, i.buffers) for i in items] == [("args[0]", 2), ("args[1]", 1),
                                                   ("outputs", 2)]


def test_too_large_blocks_are_refused_at_trace_time_naming_the_operands(lower_tpu):
    x = jnp.zeros((4096, 1024), jnp.float32)  # (2048, 1024) f32 blocks: 8 MiB each
    with pytest.raises(ValueError, match=(
            r"^Ran out of memory in memory space vmem: .*VMEM buffers need 32.00 MiB \(33554432 bytes\), more than the default scoped "
            r"VMEM limit of TPU v5e \(16.00 MiB\): args\[0\] float32\[2048, 1024\]: 8.00 MiB "
            r"x 2 buffers = 16.00 MiB; outputs .*Valid: smaller blocks.*vmem_limit_bytes")):
        lower_tpu(functools.partial(_scale, rows=2048, chip="v5e"), x)
    # v6e's default limit is 32 MiB; vmem_limit_bytes raises v5e's.
    lower_tpu(functools.partial(_scale, rows=2048, chip="v6e"), x)
    lower_tpu(functools.partial(_scale, rows=2048, chip="v5e", limit=40 * MiB), x)
    with pytest.raises(ValueError, match=r"more than vmem_limit_bytes \(8.00 MiB\)"):
        lower_tpu(functools.partial(_scale, rows=1024, chip="v6e", limit=8 * MiB), x)
    # No chip chosen and no TPU attached: nothing to check against at trace time.
    lower_tpu(functools.partial(_scale, rows=2048), x)


def test_the_refusal_describes_the_windows_as_the_compiler_does(lower_tpu):
    # A JaxRuntimeError too, as the compiler's VMEM OOM on a TPU, with its words for the
    # pipelined windows (upstream's test_vmem_oom_error_message_basics searches them).
    x = jnp.zeros((4096, 1024), jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        lower_tpu(functools.partial(_scale, rows=2048, chip="v5e"), x)
    assert isinstance(e.value, (ValueError, pltpu.errors.VmemOomError))
    for part in ("input window allocation for operator input 0",
                 "output window allocation for operator output 0",
                 "The window shape is f32[2048,1024], while the full shape is f32[4096,1024].",
                 "This allocation has 2 buffering levels."):
        assert part in str(e.value), part


def test_higher_rank_blocks_not_on_the_tiling_are_upper_bounds_left_out_of_the_check():
    # XLA tiles a (2, 10, 100) f32 buffer more tightly than (8, 128) (libtpu: 10240 B
    # for the whole (3, 10, 100) operand); the estimate must not refuse what compiles.
    (items,) = compiler.vmem_footprint(_scale3, S((4, 10, 100), jnp.float32))
    assert [i.exact for i in items] == [False, False]


def _scale3(x):
    spec = pl.BlockSpec((2, 10, 100), lambda i: (i, 0, 0))
    return pl.pallas_call(
        lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
        out_shape=S(x.shape, x.dtype), grid=(2,), in_specs=[spec], out_specs=spec,
        backend="mosaic_tpu")(x)


@pytest.mark.skipif(not compiler.libtpu_available(),
                    reason="libtpu is not installed (pallas-tpu[compile])")
def test_the_estimate_is_the_compilers_figure():
    for name in ("scale_f32", "whole_bf16", "matmul_bf16"):
        f, args, want = KERNELS[name]
        (k,) = pltpu.compile(f, *args, chip="v6e")
        assert k.vmem_bytes == want, name
    # pallas_tpu.compile refuses the too-large kernel before libtpu sees it.
    with pytest.raises(ValueError, match=r"limit of TPU v5e \(16.00 MiB\)"):
        pltpu.compile(functools.partial(_scale, rows=2048), S((4096, 1024), jnp.float32),
                      chip="v5e")
