"""The proof that the suite can fail: a third-party backend installed through a real
entry point passes, and each deliberately wrong variant is reported failed for exactly
the cases its planted fault affects, and no others."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import pallas.plugins
from pallas_conformance import FAIL, PASS, UNSUPPORTED, get_case, pallas_call_eqns, run_suite
from pallas_conformance.levels import bound

# A spread of cases: int32, bf16 and f32 outputs, dots (also nested in loops), whole
# kernels, and cases the toy does not claim.
CASES = [
    "elementwise/add_f32", "elementwise/add_i32", "elementwise/add_bf16",
    "elementwise/cast_to_bf16_f32", "elementwise/cast_to_f32_bf16",
    "elementwise/cast_to_i32_f32", "elementwise/greater_i32",
    "reductions/argmax_axis1_2d_f32", "reductions/sum_axis1_2d_i32",
    "dot/f32_to_f32", "dot/bf16_to_f32", "dot/bf16_to_bf16", "dot/i8_to_i32",
    "dot/accumulate_over_grid_in_scratch_bf16",
    "indexing/ds_static", "indexing/masked_load_other", "scratch/int32_counter",
    "control_flow/while_loop_data_dependent", "multiple_outputs/two_dtypes",
    "kernels/flash_attention_fwd_causal", "kernels/softmax_bf16", "kernels/paged_attention",
    "vmap/batch_axis0", "grad/jvp", "shard_map/rows",
]
UNCLAIMED = {"vmap/batch_axis0", "grad/jvp", "shard_map/rows"}
BACKEND_LEVELS = ("lower", "compile", "emulate", "execute")


def _cases():
    return [get_case(n) for n in CASES]


def _pallas_call_eqns(case):
    args = case.make_inputs()
    return pallas_call_eqns(jax.make_jaxpr(bound(case, backend="toy"))(*args))


def _out_dtypes(case):
    return {jnp.dtype(a.dtype) for e in _pallas_call_eqns(case) for a in e.params["out_avals"]}


def _has_dot(case):
    return any("dot_general" in pallas.plugins.primitive_names(e.params["jaxpr"]) for e in _pallas_call_eqns(case))


def _failed(report):
    return {r.case for r in report.results if r.status == FAIL}


def _failed_levels(report):
    return {r.level for r in report.results if r.status == FAIL}


def test_toy_is_discovered_through_its_entry_point(toy_backend):
    assert {"toy", "toy_off_by_one", "toy_wrong_dtype", "toy_cant_lower"} <= set(toy_backend)
    toy = toy_backend["toy"]
    assert toy.package == "toy-pallas-backend"
    assert type(toy).__module__ == "toy_pallas_backend.plugin"


def test_correct_toy_passes_every_claimed_case(toy_backend):
    report = run_suite("toy", levels=BACKEND_LEVELS, cases=_cases())
    assert report.ok, report.to_markdown()
    for r in report.results:
        expected = UNSUPPORTED if r.case in UNCLAIMED else PASS
        assert r.status == expected, (r.case, r.level, r.status, r.detail)


def test_off_by_one_fails_exactly_the_int32_outputs(toy_backend):
    claimed = [c for c in _cases() if c.name not in UNCLAIMED]
    expected = {c.name for c in claimed if jnp.dtype(jnp.int32) in _out_dtypes(c)}
    assert {"elementwise/add_i32", "reductions/argmax_axis1_2d_f32", "dot/i8_to_i32",
            "multiple_outputs/two_dtypes"} <= expected
    report = run_suite("toy_off_by_one", levels=BACKEND_LEVELS, cases=_cases())
    assert not report.ok
    assert _failed(report) == expected
    # Wrong numbers show where numbers are compared, not at lower/compile.
    assert _failed_levels(report) == {"emulate", "execute"}
    detail = next(r.detail for r in report.failed if r.case == "elementwise/add_i32")
    assert "differ from the interpreter" in detail


def test_wrong_dtype_fails_exactly_the_bf16_outputs(toy_backend):
    claimed = [c for c in _cases() if c.name not in UNCLAIMED]
    expected = {c.name for c in claimed if jnp.dtype(jnp.bfloat16) in _out_dtypes(c)}
    assert {"elementwise/add_bf16", "dot/bf16_to_bf16", "kernels/softmax_bf16"} <= expected
    report = run_suite("toy_wrong_dtype", levels=BACKEND_LEVELS, cases=_cases())
    assert _failed(report) == expected
    assert _failed_levels(report) == {"emulate"}
    assert all("dtype float32 differs" in r.detail for r in report.failed)


def test_cant_lower_fails_exactly_the_dot_kernels(toy_backend):
    claimed = [c for c in _cases() if c.name not in UNCLAIMED]
    expected = {c.name for c in claimed if _has_dot(c)}
    assert {"dot/f32_to_f32", "kernels/flash_attention_fwd_causal",
            "kernels/paged_attention"} <= expected
    report = run_suite("toy_cant_lower", levels=BACKEND_LEVELS, cases=_cases())
    assert _failed(report) == expected
    assert _failed_levels(report) == {"lower", "compile", "execute"}
    for r in report.failed:
        assert "dot_general is not implemented" in r.detail, r


def test_faults_in_unclaimed_cases_are_not_failures(toy_backend):
    report = run_suite("toy_cant_lower", levels=BACKEND_LEVELS,
                       cases=[get_case(n) for n in sorted(UNCLAIMED)])
    assert report.ok
    assert {r.status for r in report.results} == {UNSUPPORTED}


@pytest.mark.parametrize("variant,case", [
    ("toy_off_by_one", "elementwise/add_i32"),
    ("toy_wrong_dtype", "dot/bf16_to_bf16"),
    ("toy_cant_lower", "dot/bf16_to_bf16"),
])
def test_cli_exit_status_for_faulty_variants(toy_backend, variant, case, tmp_path, capsys):
    from pallas_conformance.cli import main

    out = tmp_path / "r.json"
    code = main(["--backend", variant, "-k", case, "--report", str(out)])
    assert code == 1
    assert "FAIL" in capsys.readouterr().out
    assert json.loads(out.read_text())["ok"] is False
    assert main(["--backend", "toy", "-k", case]) == 0
