"""The emulate level runs Blackwell's tensor memory and tensor cores as the generated
code drives them: ``tcgen05.alloc``/``dealloc``, ``tcgen05.mma`` from swizzled SMEM into
TMEM, commits to mbarriers, ``tcgen05.ld``/``st`` in their lane/column images; a kernel
that reads TMEM before the MMA it waits for has completed sees stale data (NaN)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu
from pallas_mosaic_gpu._src.executor import EmulationError, EmulationUnsupported
from pallas_mosaic_gpu._src.executor import ops_tcgen05 as T

pytest.importorskip("jax_plugins.xla_cuda13", reason="lowering for cuda needs jax-cuda13-plugin")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
F16, F32 = jnp.float16, jnp.float32
SWIZZLED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # for f16


@pytest.fixture(autouse=True)
def _blackwell(monkeypatch):
    monkeypatch.setenv("PALLAS_MOSAIC_GPU_TARGET", "sm_100a")


def _operands(k=64, n=128):
    a = jax.random.normal(jax.random.key(0), (128, k), F32).astype(F16)
    b = jax.random.normal(jax.random.key(1), (k, n), F32).astype(F16)
    return a, b


def _dot(a, b):
    return np.asarray(jnp.dot(a, b, preferred_element_type=F32))


def test_the_blackwell_matmul_example_matches_x_at_y_at_emulate(emulate):
    path = EXAMPLES / "mosaic_gpu_matmul_blackwell.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    spec = importlib.util.spec_from_file_location("emulated_blackwell_example", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    x, y = ex.inputs(128, 128, 128)  # two pipeline steps of four MMAs (K = 16 each)
    (got,) = emulate(lambda a, b: ex.matmul.__wrapped__(a, b), x, y)
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(ex.reference(x, y), np.float32), rtol=2e-2, atol=1e-1)


def _mma_kernel(*, accumulate_first=False, wait="before", roundtrip=False, n=128):
    """o = a @ b + a @ b: two MMAs into the second half of a (128, 256) TMEM buffer (a
    column view) and a commit, waited for ``"before"`` or ``"after"`` reading TMEM (or
    never: None); with ``roundtrip`` TMEM -> registers -> TMEM first."""

    def kernel(a_gmem, b_gmem, o_smem):
        def body(a, b, tma_bar, acc, done):
            plgpu.copy_gmem_to_smem(a_gmem, a, tma_bar.at[0])
            plgpu.copy_gmem_to_smem(b_gmem, b, tma_bar.at[0])
            plgpu.barrier_wait(tma_bar.at[0])
            half = acc.at[:, pl.ds(256 - n, n)]
            plgpu.tcgen05_mma(half, a, b, accumulate=accumulate_first)
            plgpu.tcgen05_mma(half, a, b, done)
            if wait == "before":
                plgpu.barrier_wait(done)
            if roundtrip:
                plgpu.async_store_tmem(half, plgpu.async_load_tmem(half) * 2)
                plgpu.commit_tmem()
            o_smem[...] = plgpu.async_load_tmem(half)
            plgpu.wait_load_tmem()
            if wait == "after":
                plgpu.barrier_wait(done)

        pl.run_scoped(body, plgpu.SMEM((128, 64), F16, transforms=SWIZZLED),
                      plgpu.SMEM((64, n), F16, transforms=SWIZZLED),
                      plgpu.Barrier(num_arrivals=2), plgpu.TMEM((128, 256), F32),
                      plgpu.Barrier(orders_tensor_core=True))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, n), F32),
                          in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)] * 2,
                          backend="mosaic_gpu")


def test_mmas_into_a_tmem_column_view_and_a_register_round_trip(emulate):
    a, b = _operands()
    (got,) = emulate(_mma_kernel(roundtrip=True), a, b)
    np.testing.assert_allclose(np.asarray(got), 4 * _dot(a, b), rtol=1e-3, atol=1e-2)


def test_accumulating_into_tmem_no_mma_wrote_reads_garbage(emulate):
    a, b = _operands()
    (got,) = emulate(_mma_kernel(accumulate_first=True), a, b)
    assert np.isnan(np.asarray(got)).all()


def test_reading_tmem_before_waiting_for_the_mmas_commit_sees_stale_data(emulate):
    # The MMAs complete when someone waits on their commit's barrier (or the block
    # ends): TMEM read before that still holds what it held (never written: NaN).
    a, b = _operands()
    (got,) = emulate(_mma_kernel(wait="after"), a, b)
    assert np.isnan(np.asarray(got)).all()


def test_freeing_tmem_before_the_mmas_into_it_complete_is_an_error(emulate):
    a, b = _operands()
    with pytest.raises(EmulationError, match="outside every allocation"):
        emulate(_mma_kernel(wait=None), a, b)


@pytest.mark.parametrize("shape,num,rows,cols", [
    ("32x32b", 4, 32, 4), ("16x64b", 2, 16, 4), ("16x128b", 2, 16, 8),
    ("16x256b", 8, 16, 64)])
def test_each_tmem_access_shape_covers_its_image_once(shape, num, rows, cols):
    nregs = T._REGS_PER_REP[shape] * num
    r, c = T._image(shape, nregs)
    assert r.shape == (32, nregs) and r.max() + 1 == rows and c.max() + 1 == cols
    assert len({(int(i), int(j)) for i, j in zip(r.ravel(), c.ravel())}) == rows * cols


def test_tmem_allocations_are_checked():
    t = T.Tmem()
    assert t.alloc(128) == 0 and t.alloc(256) == 256 and t.alloc(128) == 128
    with pytest.raises(EmulationError, match="wait forever"):
        t.alloc(32)
    with pytest.raises(EmulationError, match="not an allocation of that size"):
        t.dealloc(0, 256)
    t.dealloc(0, 128)
    with pytest.raises(EmulationError, match="outside every allocation"):
        t.check(0, 64, "a load")
    t.relinquished = True
    with pytest.raises(EmulationError, match="after tcgen05.relinquish_alloc_permit"):
        t.alloc(32)
    with pytest.raises(EmulationError, match="power of two"):
        T.Tmem().alloc(48)


def test_an_mma_form_the_executor_does_not_run_is_unsupported_naming_it():
    text = ("{ .reg .b32 a_desc_low, a_desc_high, b_desc_low, b_desc_high; .reg .b64 a_desc;"
            " .reg .b64 b_desc; add.s32 a_desc_low, $1, 0; add.s32 b_desc_low, $2, 0; "
            "mov.b64 b_desc, {b_desc_low, 0}; mov.b64 a_desc, {a_desc_low, 0}; "
            "tcgen05.mma.cta_group::1.kind::f16 [$0], [$1], b_desc, $3, $4; }")  # A in TMEM
    with pytest.raises(EmulationUnsupported, match=r"tcgen05\.mma\.cta_group::1\.kind::f16"):
        T._tcgen05_mma(None, re.fullmatch(r".*tcgen05\.mma.*", text, re.S))
    with pytest.raises(EmulationUnsupported, match="M = 64"):
        T.mma(None, 0, 0, 0, (1 << 4) | (16 << 17) | (4 << 24), False, "f16")
    with pytest.raises(EmulationUnsupported, match=r"cta_group::2 with M = 128"):
        T.pair_mma(None, 0, 0, 0, (1 << 4) | (16 << 17) | (8 << 24), False, "f16")


@pytest.mark.parametrize("transforms", [SWIZZLED, (plgpu.TilingTransform((8, 8)),)],
                         ids=["swizzle128", "unswizzled"])
def test_a_tmem_copy_from_smem_lands_each_row_in_its_lane(emulate, transforms):
    """``plgpu.async_copy_smem_to_tmem`` lowers to ``tcgen05.cp`` (128x256b from 128-byte
    swizzled SMEM, 128x128b per 16-byte column of unswizzled (8, 8) tiles); the executor
    decodes its SMEM descriptor and fills TMEM lane by lane: read back, the matrix is
    the one copied in."""
    def kernel(x_gmem, y_gmem):
        def body(smem, tma_bar, done, tmem):
            plgpu.copy_gmem_to_smem(x_gmem, smem, tma_bar)
            plgpu.barrier_wait(tma_bar)
            plgpu.async_copy_smem_to_tmem(smem, tmem)
            plgpu.tcgen05_commit_arrive(done)
            plgpu.barrier_wait(done)
            y_gmem[...] = plgpu.async_load_tmem(tmem)

        pl.run_scoped(body, plgpu.SMEM((128, 128), F16, transforms=transforms),
                      plgpu.Barrier(), plgpu.Barrier(orders_tensor_core=True),
                      plgpu.TMEM((128, 128), F16, packed=True))

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), F16),
                       in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
                       out_specs=pl.BlockSpec(memory_space=plgpu.GMEM), backend="mosaic_gpu")
    x = jnp.arange(128 * 128, dtype=jnp.float32).reshape(128, 128).astype(F16)
    (got,) = emulate(f, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x))
