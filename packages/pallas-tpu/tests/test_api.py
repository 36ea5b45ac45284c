"""The public surface: upstream's 66 names, types, CompilerParams, TpuInfo, the plugin."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas as pl
import pallas.plugins
import pallas_tpu as pltpu

REFERENCE = Path(__file__).resolve().parents[4] / "shared/reference/upstream-api-jax-0.10.2.md"


def _upstream_names():
    if not REFERENCE.exists():
        pytest.skip("shared/reference is not beside the repository")
    text = REFERENCE.read_text().split("## `jax.experimental.pallas.tpu`")[1].split("\n## ")[0]
    return re.findall(r"^- `(\w+)`", text, re.M)


def test_all_upstream_names_present():
    names = _upstream_names()
    assert len(names) == 66
    missing = [n for n in names if not hasattr(pltpu, n)]
    assert not missing
    assert set(names) == set(pltpu.UPSTREAM_NAMES)


def test_unimplemented_names_are_listed_in_readme():
    from pallas_tpu._src.unimplemented import NAMES

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for n in NAMES:
        assert f"`{n}`" in readme, n


def test_memory_spaces_make_memory_refs():
    r = pltpu.VMEM((8, 128), jnp.float32)
    assert isinstance(r, pl.MemoryRef)
    assert r.shape == (8, 128) and r.dtype == jnp.float32
    assert r.memory_space is pltpu.MemorySpace.VMEM
    for f, space in [(pltpu.SMEM, "SMEM"), (pltpu.HBM, "HBM"), (pltpu.CMEM, "CMEM"),
                     (pltpu.VMEM_SHARED, "VMEM_SHARED")]:
        assert f((4,), jnp.int32).memory_space is pltpu.MemorySpace[space]
    assert pltpu.MemorySpace.VMEM((2,), jnp.bfloat16).dtype == jnp.bfloat16
    assert pltpu.SEMAPHORE((2,), None).memory_space.is_semaphore


def test_semaphore_types():
    s = pltpu.SemaphoreType.DMA((2,))
    assert s.shape == (2,) and s.dtype == jnp.int32 and s.memory_space.is_semaphore
    assert pltpu.SemaphoreType.REGULAR.get_memory_ref().shape == ()
    assert pltpu.SemaphoreType.BARRIER(()).memory_space is pltpu.SemaphoreType.BARRIER


def test_compiler_params():
    p = pltpu.CompilerParams(dimension_semantics=("parallel", pltpu.ARBITRARY),
                             vmem_limit_bytes=1 << 20, flags={"xla_tpu_foo": True})
    assert p.BACKEND == "mosaic_tpu"
    assert p.dimension_semantics == (pltpu.PARALLEL, pltpu.ARBITRARY)
    assert p.flags_dict == {"xla_tpu_foo": True}
    assert isinstance(p, pl.CompilerParams)
    hash(p)
    with pytest.raises(ValueError, match="dimension_semantics"):
        pltpu.CompilerParams(dimension_semantics=("sideways",))
    assert {s.value for s in pltpu.GridDimensionSemantics} >= {
        "parallel", "arbitrary", "core_parallel", "subcore_parallel"}


def test_prefetch_scalar_grid_spec_is_cores():
    assert pltpu.PrefetchScalarGridSpec is pl.PrefetchScalarGridSpec


@pytest.mark.parametrize("chip,cores,vmem,hbm_per_core", [
    (pltpu.ChipVersion.TPU_V2, 1, 16 << 20, 8_000_000_000),
    (pltpu.ChipVersion.TPU_V4, 2, 16 << 20, 17_200_000_000),
    (pltpu.ChipVersion.TPU_V5E, 1, 128 << 20, 17_200_000_000),
    (pltpu.ChipVersion.TPU_V5P, 2, 64 << 20, 51_500_000_000),
    (pltpu.ChipVersion.TPU_V6E, 1, 128 << 20, 34_400_000_000),
    (pltpu.ChipVersion.TPU_7X, 1, 64 << 20, 103_000_000_000),
])
def test_tpu_info_figures_are_per_tensorcore(chip, cores, vmem, hbm_per_core):
    info = pltpu.get_tpu_info_for_chip(chip, cores)
    assert isinstance(info, pltpu.TpuInfo)
    assert info.num_cores == cores and info.num_lanes == 128 and info.num_sublanes == 8
    assert info.vmem_capacity_bytes == vmem
    assert info.hbm_capacity_bytes == hbm_per_core
    assert info.bf16_ops_per_second > 10**13
    with pytest.raises(ValueError, match="num_tensor_cores_per_logical_device"):
        pltpu.get_tpu_info_for_chip(chip, cores + 1)


def test_every_chip_upstream_knows_has_figures_and_a_core_layout():
    for chip in pltpu.ChipVersion:
        info = pltpu.get_tpu_info_for_chip(chip, 1)
        assert info.is_lite == chip.is_lite
        assert info.is_split_chip == (chip.num_physical_tensor_cores_per_chip == 2)
        assert info.is_matmul_supported("float32", "float32")
        if chip.supports_megacore:
            mega = pltpu.get_tpu_info_for_chip(chip, 2)
            assert mega.is_megacore and not mega.is_split_chip
        else:
            with pytest.raises(ValueError, match="Lite chips and dual-core chips"):
                pltpu.get_tpu_info_for_chip(chip, 2)


def test_old_chips_answer_no_for_matmuls_they_lack():
    v3 = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V3, 1)
    assert not v3.is_matmul_supported(jnp.bfloat16, jnp.bfloat16)
    assert v3.int8_ops_per_second == 0 and v3.sparse_core is None
    v5e = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V5E, 1)
    assert v5e.is_matmul_supported(jnp.int8, jnp.uint8)
    assert not v5e.is_matmul_supported(jnp.int8, jnp.bfloat16)


def test_v6e_has_256_wide_mxu():
    assert pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V6E, 1).mxu_column_size == 256
    assert pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V5E, 1).mxu_column_size == 128


def test_is_tpu_device_on_cpu():
    assert pltpu.is_tpu_device() is False
    with pytest.raises(ValueError, match="get_tpu_info_for_chip"):
        pltpu.get_tpu_info()


def test_plugin_is_discovered_through_its_entry_point():
    backends = {b.name: b for b in pallas.plugins.list_backends()}
    assert "mosaic_tpu" in backends, pallas.plugins.load_failures()
    b = backends["mosaic_tpu"]
    assert b.package == "pallas-tpu" and "tpu" in b.platforms
    assert b.compiler_params_type is pltpu.CompilerParams
    assert pallas.plugins.select_backend("tpu").name == "mosaic_tpu"
    assert pallas.plugins.select_backend("cpu").name == "interpret"
    assert pallas.plugins.select_backend(
        "tpu", compiler_params=pltpu.CompilerParams()).name == "mosaic_tpu"


def test_selecting_the_backend_on_cpu_runs_tpu_interpret_mode():
    def k(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 2

    f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       compiler_params=pltpu.CompilerParams())
    np.testing.assert_array_equal(f(jnp.zeros((8, 128))), 2)


def test_force_tpu_interpret_mode_runs_on_cpu():
    def k(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       compiler_params=pltpu.CompilerParams())
    with pltpu.force_tpu_interpret_mode():
        out = f(jnp.zeros((8, 128)))
    np.testing.assert_array_equal(out, 1)
    pltpu.set_tpu_interpret_mode()
    try:
        np.testing.assert_array_equal(f(jnp.ones((8, 128))), 2)
    finally:
        pltpu.reset_tpu_interpret_mode_state()


def test_interpret_params():
    p = pltpu.InterpretParams(uninitialized_memory="zero")
    hash(p)
    with pytest.raises(ValueError, match="dma_execution_mode"):
        pltpu.InterpretParams(dma_execution_mode="sometimes")

    def k(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3

    out = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         interpret=pltpu.InterpretParams())(jnp.ones((8, 128)))
    np.testing.assert_array_equal(out, 3)


def test_memory_space_like_takes_shape_and_dtype_from_an_array():
    x = jnp.zeros((8, 128), jnp.bfloat16)
    ref = pltpu.VMEM.like(x)
    assert (ref.shape, ref.dtype, ref.memory_space) == ((8, 128), jnp.bfloat16, pltpu.VMEM)
    assert pltpu.SMEM.like(jax.ShapeDtypeStruct((4,), jnp.int32)).shape == (4,)


@pytest.mark.parametrize("at, priority, add, printed", [
    (lambda i: (i, pl.ds(0, 8), pl.ds(0, 128)), 0, False, r"dma_start\(p0\) (\w+)\[(\w+),:,:\]"),
    (lambda i: (0, pl.ds(i, 8), pl.ds(0, 128)), 0, False, r"dma_start\(p0\) (\w+)\[0,(\w+):\2\+8,:\]"),
    (lambda i: (i, pl.ds(2, 4), pl.ds(0, 100)), 0, False, r"dma_start\(p0\) (\w+)\[(\w+),2:6,:100\]"),
    (lambda i: (i, pl.ds(2, 6), pl.ds(4, 100)), 1, True,
     r"dma_start\(p1, add\) (\w+)\[(\w+),2:,4:104\]"),
])
def test_a_dma_prints_as_a_copy(at, priority, add, printed):
    # As upstream prints it (its PrettyPrintingTest): the source view -> the destination,
    # then the semaphore.
    def f(x, i):
        def body(x_ref):
            def inner(v_ref, sem):
                pltpu.async_copy(x_ref.at[at(i)], v_ref, sem, priority=priority,
                                 add=add).wait()

            pl.run_scoped(inner, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

        return pl.run_state(body)(x)

    text = str(jax.make_jaxpr(f)(jnp.zeros((2, 8, 128), jnp.float32), 1))
    assert re.search(printed + r" -> \w+\[\.\.\.\] \w+$", text, re.M), text


def test_a_bare_semaphore_type_is_an_out_shape():
    # As upstream: out_shape=pltpu.SemaphoreType.DMA is one DMA semaphore (DMA(())); it
    # was refused ("must be shape-and-dtype-like").
    def start(x_hbm, y_hbm, sem):
        pltpu.make_async_copy(x_hbm, y_hbm, sem).start()

    def finish(x_hbm, y_hbm, sem, out):
        del out
        pltpu.make_async_copy(x_hbm, y_hbm, sem).wait()

    anyspec, semspec = pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.SEMAPHORE)

    @jax.jit
    def copy(x):
        y, sem = pl.pallas_call(start, in_specs=[anyspec], out_specs=[anyspec, semspec],
                                out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                                           pltpu.SemaphoreType.DMA])(x)
        return pl.pallas_call(finish, in_specs=[anyspec, anyspec, semspec], out_specs=anyspec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              input_output_aliases={1: 0})(x, y, sem)

    x = jnp.arange(8 * 128.0).reshape(8, 128)
    np.testing.assert_array_equal(np.asarray(copy(x)), np.asarray(x))
    with pl.emulate_device("tpu:v5e"):
        np.testing.assert_array_equal(np.asarray(copy(x)), np.asarray(x))


def test_an_unused_copy_descriptor_is_reported(caplog):
    # As upstream: a make_async_copy never started nor waited for is logged as an error
    # (the kernel meant a copy that never happens); used ones are not.
    x = jnp.arange(8 * 128.0).reshape(8, 128)
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)

    def call(kernel):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct.like(x), in_specs=[hbm],
                              out_specs=hbm, scratch_shapes=[pltpu.SemaphoreType.DMA])(x)

    def dropped(x_hbm, o_hbm, sem):
        pltpu.make_async_copy(x_hbm, o_hbm, sem)

    def used(x_hbm, o_hbm, sem):
        copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        copy.start()
        copy.wait()

    with caplog.at_level("ERROR"):
        call(dropped)
    assert [r.getMessage() for r in caplog.records if "was not used" in r.getMessage()]
    caplog.clear()
    with caplog.at_level("ERROR"):
        np.testing.assert_array_equal(np.asarray(call(used)), np.asarray(x))
    assert not caplog.records


def test_has_side_effects_takes_a_bool_or_a_side_effect_type():
    assert pltpu.CompilerParams(has_side_effects=pltpu.SideEffectType.PURE).has_side_effects \
        is pltpu.SideEffectType.PURE
    with pytest.raises(ValueError, match="Invalid side effect type: 'invalid'"):
        pltpu.CompilerParams(has_side_effects="invalid")
