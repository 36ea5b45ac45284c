"""pallas.plugins.effect_primitive: a primitive with no results whose abstract evaluation
is its effects, fixed or computed from the avals and params."""

import jax
import jax.numpy as jnp

from pallas.plugins import effect_primitive, kernel_debug_effect
from pallas.state import ReadEffect, WriteEffect


def test_fixed_effects_no_results_in_the_jaxpr():
    p = effect_primitive("test_effect_fixed", {kernel_debug_effect})

    def f(x):
        assert p.bind(x, label="a") == []
        return x + 1

    closed = jax.make_jaxpr(f)(jnp.zeros(3, jnp.float32))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is p]
    assert eqn.outvars == []
    assert eqn.params == {"label": "a"}
    assert eqn.effects == {kernel_debug_effect}
    assert kernel_debug_effect in closed.jaxpr.effects


def test_effects_computed_from_avals_and_params():
    seen = []

    def effects(*avals, which, add):
        seen.append((avals, which, add))
        return [WriteEffect(which)] + ([ReadEffect(which)] if add else [])

    p = effect_primitive("test_effect_computed", effects)
    aval = jax.core.ShapedArray((2,), jnp.int32)
    assert p.multiple_results
    assert p.abstract_eval(aval, which=1, add=False) == ([], {WriteEffect(1)})
    assert p.abstract_eval(aval, aval, which=0, add=True) == (
        [], {WriteEffect(0), ReadEffect(0)})
    assert seen[0] == ((aval,), 1, False)


def test_fixed_effects_are_copied_and_each_eqn_gets_its_own_set():
    given = {kernel_debug_effect}
    p = effect_primitive("test_effect_copied", given)
    given.clear()  # the caller's set is not kept
    first = p.abstract_eval()[1]
    first.add("mutated")
    assert p.abstract_eval() == ([], {kernel_debug_effect})

