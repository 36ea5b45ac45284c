"""``import pallas_tpu_sparsecore as plsc`` exposes upstream ``jax.experimental.pallas.tpu_sc``:
its 24 names, with upstream's parameters in order (from
``reference/upstream-api-jax-0.10.2.md``); the SparseCore figures, meshes and plugin."""

from __future__ import annotations

import collections
import inspect
import re
from pathlib import Path

import pytest

import pallas.plugins
import pallas_tpu as pltpu
import pallas_tpu_sparsecore as plsc

_CANDIDATES = [
    Path(__file__).resolve().parents[3] / "reference" / "upstream-api-jax-0.10.2.md",
    Path(__file__).resolve().parents[4] / "shared" / "reference" / "upstream-api-jax-0.10.2.md",
]
REFERENCE = next((p for p in _CANDIDATES if p.exists()), None)


def _reference_entries() -> list[tuple[str, str, str]]:
    if REFERENCE is None:
        pytest.skip("reference/upstream-api-jax-0.10.2.md is not available")
    text = REFERENCE.read_text()
    section = text.split("## `jax.experimental.pallas.tpu_sc` ->", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `(\w+)` \(([^)]*)\)(?: `(.*)`)?$", section, re.M)


def _param_names(signature: str) -> list[str]:
    """Parameter names of a rendered signature such as ``(a, b: 'int' = 1, *, c)``; a
    signature the reference truncated (``...``) yields the names before the cut."""
    truncated = signature.endswith("...")
    if ") ->" in signature:
        inner = signature.split(") ->")[0][1:]
    else:
        inner = signature[1:] if truncated else signature[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in inner:  # split on top-level commas only
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    if truncated:
        parts = parts[:-1]
    names = []
    for part in parts:
        part = part.strip()
        if part and part not in ("*", "/"):
            names.append(part.split(":")[0].split("=")[0].strip().lstrip("*"))
    return names


def test_the_24_upstream_names_exist_and_are_exported():
    names = [n for n, _, _ in _reference_entries()]
    assert len(names) == 24
    assert sorted(names) == sorted(plsc.UPSTREAM_NAMES)
    for n in names:
        assert hasattr(plsc, n) and n in plsc.__all__, n


def test_functions_take_upstreams_parameters_in_order():
    for name, kind, sig in _reference_entries():
        if kind != "function":
            continue
        got = list(inspect.signature(getattr(plsc, name)).parameters)
        want = _param_names(sig)
        assert got[: len(want)] == want, name
        if not sig.endswith("..."):
            assert got == want, name


def test_classes_take_upstreams_fields():
    assert plsc.Indices(1, ignored_value=-1).ignored_value == -1
    assert {f.value for f in plsc.PackFormat} == {"compressed", "interleaved"}
    m = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")
    assert (m.num_cores, m.num_subcores) == (2, 16)  # TPU7x, the default target chip
    assert plsc.ScalarSubcoreMesh(axis_name="c").num_cores == 2


def test_sparse_core_info_per_chip():
    assert plsc.DEFAULT_CHIP is pltpu.ChipVersion.TPU_7X
    got = {c: plsc.get_sparse_core_info_for_chip(c) for c in ("v5p", "v6e", "7x", "8i")}
    assert [(i.num_cores, i.num_subcores, i.num_lanes) for i in got.values()] == [
        (4, 16, 8), (2, 16, 8), (2, 16, 16), (1, 4, 16)]
    # The figures are pallas-tpu's: one table for the TensorCore and SparseCore facts.
    assert got["v5p"] is pltpu.get_tpu_info_for_chip("v5p", 1).sparse_core
    with pytest.raises(ValueError, match="has no SparseCores.*v5p, v6e, 7, 7x, 8i"):
        plsc.get_sparse_core_info_for_chip("v5e")


def test_target_chip_and_environment_choose_the_figures(monkeypatch):
    assert plsc.get_sparse_core_info().num_lanes == 16
    with plsc.target_chip("v5p") as info:
        assert info.num_cores == 4 and plsc.get_sparse_core_info().num_lanes == 8
        assert plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s").num_cores == 4
    monkeypatch.setenv("PALLAS_SPARSECORE_CHIP", "v6e")
    assert plsc.get_sparse_core_info().num_lanes == 8
    monkeypatch.setenv("PALLAS_SPARSECORE_CHIP", "v9")
    with pytest.raises(ValueError, match="PALLAS_SPARSECORE_CHIP='v9'.*unknown TPU chip"):
        plsc.get_sparse_core_info()


def test_supported_shapes_follow_the_lanes():
    import jax.numpy as jnp

    assert plsc.supported_shapes(jnp.float32) == [(16,)]
    assert plsc.supported_shapes(jnp.bfloat16) == [(32,), (2, 16)]
    assert plsc.supported_shapes(jnp.int8) == [(64,), (4, 16)]
    assert plsc.supported_shapes(jnp.float64) == []


def test_meshes_as_upstream():
    v = plsc.VectorSubcoreMesh(core_axis_name="x", subcore_axis_name="y", num_cores=2,
                               num_subcores=1)
    assert v.shape == collections.OrderedDict({"x": 2, "y": 1}) and v.size == 2
    assert v.dimension_semantics == [pltpu.CORE_PARALLEL, pltpu.SUBCORE_PARALLEL]
    assert v.default_memory_space is pltpu.MemorySpace.HBM
    assert v.core_type is pltpu.CoreType.SC_VECTOR_SUBCORE
    s = plsc.ScalarSubcoreMesh(axis_name="x", num_cores=1)
    assert s.shape == collections.OrderedDict({"x": 1})
    assert s.dimension_semantics == [pltpu.CORE_PARALLEL]
    assert s.core_type is pltpu.CoreType.SC_SCALAR_SUBCORE


def test_plugin_is_discovered_through_its_entry_point():
    b = pallas.plugins.get_backend("mosaic_sparsecore")
    assert b.platforms == ("tpu", "cpu") and b.package == "pallas-tpu-sparsecore"
    assert "sparsecore" in b.capabilities
    # Never the default backend of a platform: plain TPU kernels keep mosaic_tpu.
    assert pallas.plugins.select_backend("tpu").name == "mosaic_tpu"
    assert pallas.plugins.select_backend("tpu", compiler_params=plsc.CompilerParams()).name \
        == "mosaic_sparsecore"


def test_compiler_params_carry_the_chip():
    p = plsc.CompilerParams(chip="v5p")
    assert p.chip is pltpu.ChipVersion.TPU_V5P and isinstance(p, pltpu.CompilerParams)
    with pytest.raises(ValueError, match="no SparseCores"):
        plsc.CompilerParams(chip="v4")
