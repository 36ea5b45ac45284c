"""The catalogue's own properties: size, coverage of every tag, determinism."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas.plugins
from pallas_conformance import INTERPRET_CAPABILITIES, TAGS, all_cases, claimed_tags
from pallas_conformance.registry import TAG_ALIASES, Case, case, register


def test_at_least_150_cases():
    assert len(all_cases()) >= 150


def test_every_tag_has_cases():
    counts = collections.Counter(t for c in all_cases() for t in c.tags)
    assert set(counts) == set(TAGS), set(TAGS) - set(counts)


def test_names_follow_module_and_are_unique():
    names = [c.name for c in all_cases()]
    assert len(names) == len(set(names))
    modules = {n.split("/")[0] for n in names}
    assert {"elementwise", "broadcasting", "reductions", "indexing", "control_flow", "dot",
            "scratch", "aliasing", "multiple_outputs", "pytrees", "scalar_prefetch",
            "semaphores", "vmap", "grad", "shard_map", "export", "kernels"} <= modules


def test_elementwise_dtypes_covered():
    names = {c.name for c in all_cases()}
    for suffix in ("f32", "bf16", "f16", "i8", "i32", "u32", "bool"):
        assert any(n.startswith("elementwise/") and n.endswith(suffix) for n in names), suffix


def test_reductions_cover_each_axis():
    names = {c.name for c in all_cases()}
    for op in ("sum", "max", "min", "prod", "argmax"):
        for ax in ("axis0", "axis1"):
            assert f"reductions/{op}_{ax}_2d_f32" in names
    for ax in ("axis0", "axis1", "axis2"):
        assert f"reductions/sum_{ax}_3d_f32" in names


def test_whole_kernels_present():
    names = {c.name for c in all_cases()}
    for k in ("tiled_matmul_f32", "softmax_f32", "layer_norm_f32",
              "flash_attention_fwd_causal", "flash_attention_bwd_causal", "paged_attention"):
        assert f"kernels/{k}" in names


def test_inputs_are_deterministic():
    for c in all_cases()[::7]:
        a, b = c.make_inputs(), c.make_inputs()
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_tolerance_per_dtype():
    c = all_cases()[0]
    assert c.tolerance_for(jnp.int32) == (0.0, 0.0)
    assert c.tolerance_for(jnp.bfloat16) > c.tolerance_for(jnp.float32)


def test_register_rejects_unknown_tags_and_duplicates():
    with pytest.raises(ValueError, match="unknown tags"):
        register(Case("x/unknown", lambda p: None, lambda r: (), lambda: None,
                      frozenset({"teleport"})))
    existing = all_cases()[0]
    with pytest.raises(ValueError, match="duplicate"):
        case(existing.name, tags={"elementwise"}, inputs=lambda r: (),
             reference=lambda: None)(lambda p: None)


def test_interpreter_claims_are_known_tags():
    interp = pallas.plugins.get_backend("interpret")
    if "*" in interp.capabilities:
        assert claimed_tags(interp) == INTERPRET_CAPABILITIES
    assert INTERPRET_CAPABILITIES <= set(TAGS)
    assert TAG_ALIASES["matmul"] == "dot"
