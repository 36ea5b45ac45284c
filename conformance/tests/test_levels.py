"""The level runner: comparison, claims, unsupported and skipped statuses."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import pallas.plugins
from pallas.plugins import Backend
from pallas_conformance import FAIL, PASS, SKIPPED, UNSUPPORTED, CaseRunner, get_case
from pallas_conformance.levels import Mismatch, claimed_tags, compare, pallas_call_eqns


@pytest.fixture
def fake_backends():
    """Registers in-process backends for one test (discovery is tested elsewhere)."""
    pallas.plugins.reset()
    made = {}

    def make(name, **kw):
        b = Backend(name=name, version="0", **kw)
        pallas.plugins.register_backend(b)
        made[name] = b
        return b

    yield make
    pallas.plugins.reset()


def test_compare_checks_values_dtypes_shapes_structure():
    c = get_case("elementwise/add_f32")
    x = jnp.ones((2, 3), jnp.float32)
    compare(c, x, x + 1e-7)
    with pytest.raises(Mismatch, match="1 of 6 elements differ"):
        compare(c, x.at[1, 2].set(2.0), x)
    with pytest.raises(Mismatch, match="dtype"):
        compare(c, x.astype(jnp.bfloat16), x)
    with pytest.raises(Mismatch, match="shape"):
        compare(c, x[:1], x)
    with pytest.raises(Mismatch, match="structure"):
        compare(c, (x, x), [x, x])
    i = jnp.arange(4, dtype=jnp.int32)
    with pytest.raises(Mismatch):  # integers are exact
        compare(c, i + 1, i)
    compare(c, jnp.array([jnp.nan]), jnp.array([jnp.nan]))


def test_interpreter_level_passes_and_reports_unclaimed(monkeypatch):
    r = CaseRunner(None)
    assert r.run(get_case("elementwise/add_f32"), "interpret").status == PASS
    b = pallas.plugins.get_backend("interpret")
    monkeypatch.setattr(b, "capabilities", frozenset({"elementwise"}))
    res = r.run(get_case("vmap/batch_axis0"), "interpret")
    assert res.status == UNSUPPORTED and "vmap" in res.detail


def test_unclaimed_tags_and_levels_are_unsupported(fake_backends):
    b = fake_backends("partial", platforms=("cpu",), capabilities=frozenset({"elementwise"}),
                      levels=("lower",))
    r = CaseRunner(b)
    assert r.run(get_case("dot/f32_to_f32"), "lower").status == UNSUPPORTED
    res = r.run(get_case("elementwise/add_f32"), "compile")
    assert res.status == UNSUPPORTED and "does not provide level" in res.detail
    # Claimed and provided, but lower() is not implemented: a failure, with the reason.
    res = r.run(get_case("elementwise/add_f32"), "lower")
    assert res.status == FAIL and "does not implement lower" in res.detail


def test_unreachable_levels_are_skipped(fake_backends):
    b = fake_backends("far_away", platforms=("no_such_platform",),
                      capabilities=frozenset({"*"}), levels=("lower", "execute"))
    r = CaseRunner(b)
    res = r.run(get_case("elementwise/add_f32"), "lower")
    assert res.status == SKIPPED and "does not know platform" in res.detail
    res = r.run(get_case("elementwise/add_f32"), "execute")
    assert res.status == SKIPPED and "no no_such_platform device" in res.detail


def test_star_claims_every_tag_for_third_parties(fake_backends):
    b = fake_backends("everything", platforms=("cpu",), capabilities=frozenset({"*"}))
    assert "vmap" in claimed_tags(b)
    b2 = fake_backends("aliased", platforms=("cpu",), capabilities=frozenset({"matmul"}))
    assert claimed_tags(b2) == {"dot"}


def test_pallas_call_eqns_are_found_in_nested_jaxprs():
    import jax

    from pallas_conformance.levels import bound

    c = get_case("kernels/flash_attention_bwd_causal")
    f = jax.jit(bound(c, interpret=True))
    eqns = pallas_call_eqns(jax.make_jaxpr(f)(*c.make_inputs()))
    assert len(eqns) == 3  # forward, dq, dk/dv


def test_interpret_backend_levels():
    r = CaseRunner(pallas.plugins.get_backend("interpret"))
    assert r.levels() == ("interpret", "lower", "execute")
    for level in r.levels():
        assert r.run(get_case("kernels/softmax_f32"), level).status == PASS


def test_explicit_interpret_capabilities_replace_the_default(monkeypatch):
    from pallas_conformance import INTERPRET_CAPABILITIES, interpreter_claims

    b = pallas.plugins.get_backend("interpret")
    assert interpreter_claims() == INTERPRET_CAPABILITIES  # while the core says "*"
    monkeypatch.setattr(b, "capabilities", frozenset({"elementwise", "dot"}))
    assert interpreter_claims() == {"elementwise", "dot"}
    res = CaseRunner(None).run(get_case("reductions/sum_axis1_2d_f32"), "interpret")
    assert res.status == UNSUPPORTED and "reductions" in res.detail


def test_a_level_the_backend_cannot_take_for_a_kernel_is_unsupported_not_failed(
        fake_backends):
    class Partial(Backend):
        def lower(self, request):
            return pallas.plugins.lower_with_interpreter(
                request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                grid_mapping=request.grid_mapping)

        def emulate(self, request, *args):
            raise pallas.plugins.LevelUnsupportedError("op 'foo.bar' is not executed")

    b = Partial(name="partial_emu", version="0", platforms=("cpu",),
                capabilities=frozenset({"elementwise"}), levels=("lower", "emulate"))
    pallas.plugins.register_backend(b)
    res = CaseRunner(b).run(get_case("elementwise/add_f32"), "emulate")
    assert res.status == UNSUPPORTED
    assert "foo.bar" in res.detail


def test_compile_level_passes_options_and_records_targets_skips_unreachable(fake_backends):
    class Rejected(Exception):
        target = "chip-b"

    seen = []

    def compile_(request):
        seen.append(dict(request.options))
        if request.options.get("chip") == "b":
            raise Rejected("no")
        if request.options.get("chip") == "missing":
            raise pallas.plugins.LevelUnreachableError("pip install the-compiler")
        return type("Artifact", (), {"target": "chip-a"})()

    b = fake_backends("compiling", platforms=("cpu",), capabilities=frozenset({"*"}),
                      levels=("lower", "compile"))
    b.compile = compile_
    case = get_case("elementwise/add_f32")
    for chip, status in (("a", PASS), ("b", FAIL), ("missing", SKIPPED)):
        r = CaseRunner(b, compile_options={"chip": chip})
        res = r.run(case, "compile")
        assert res.status == status, res
        assert seen[-1]["chip"] == chip
    assert r.run(case, "compile").detail == "pip install the-compiler"
    r = CaseRunner(b, compile_options={"chip": "a"})
    r.run(case, "compile")
    r2 = CaseRunner(b, compile_options={"chip": "b"})
    r2.run(case, "compile")
    assert (r.compile_targets, r2.compile_targets) == ({"chip-a"}, {"chip-b"})
