"""Memory spaces make typed buffers; TMEM options and barrier counts are validated."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_mosaic_gpu as plgpu


def test_memory_spaces_make_memory_refs():
    r = plgpu.SMEM((128, 64), jnp.float16)
    assert isinstance(r, pl.MemoryRef)
    assert r.shape == (128, 64) and r.dtype == jnp.float16
    assert r.memory_space is plgpu.MemorySpace.SMEM and r.transforms == ()
    assert plgpu.GMEM((4,), jnp.int32).memory_space is plgpu.MemorySpace.GMEM
    assert plgpu.REGS((2,), jnp.float32).memory_space is plgpu.MemorySpace.REGS
    assert str(plgpu.TMEM) == "tmem"
    like = plgpu.SMEM.like(plgpu.GMEM((3, 5), jnp.bfloat16))
    assert like.shape == (3, 5) and like.dtype == jnp.bfloat16


def test_tmem_packing_and_collective():
    acc = plgpu.TMEM((128, 128), jnp.float32)
    assert acc.packed is False and acc.collective is False
    assert plgpu.TMEM((128, 128), jnp.float16, packed=True, collective=True).collective
    with pytest.raises(ValueError, match="narrower than 32-bit"):
        plgpu.TMEM((128, 128), jnp.float16)
    with pytest.raises(ValueError, match="transforms are not supported for TMEM"):
        plgpu.TMEM((128, 128), jnp.float32, transforms=(object(),))
    with pytest.raises(ValueError, match="only supported for TMEM"):
        plgpu.SMEM((128, 128), jnp.float32, packed=True)


def test_barrier_counts_are_validated():
    assert plgpu.Barrier(num_arrivals=2, num_barriers=3).num_barriers == (3,)
    assert plgpu.Barrier(num_barriers=[2, 2]).num_barriers == (2, 2)
    with pytest.raises(ValueError, match="Num arrivals must be at least 1, but got 0"):
        plgpu.Barrier(num_arrivals=0)
    with pytest.raises(ValueError, match="num_barriers"):
        plgpu.Barrier(num_barriers=0)
    cb = plgpu.ClusterBarrier(collective_axes=("x",), num_barriers=2)
    assert cb.num_barriers == (2,) and cb.num_arrivals == 1
    with pytest.raises(ValueError, match="not arrays"):
        plgpu.Barrier().get_array_aval()
