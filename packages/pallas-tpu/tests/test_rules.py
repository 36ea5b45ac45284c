"""pallas-tpu's rule tables: keyed by primitive, complete over pallas-core's primitives,
and pallas-core's interpreter rules changed only through explicit overrides."""

from pallas import plugins
from pallas_tpu._src.lowering.rules import RULES


def test_every_core_primitive_has_a_mosaic_rule_or_a_reason():
    assert RULES.missing(plugins.PRIMITIVES) == []
    for p in plugins.PRIMITIVES:
        assert p in RULES or RULES.unsupported_reason(p), p.name


def test_the_rules_are_pallas_tpus_own():
    assert {owner for p in RULES for owner in RULES.owners(p)} == {"pallas_tpu"}


def test_core_interpreter_rules_are_overridden_not_replaced():
    import pallas_tpu  # noqa: F401 - registers the rules

    for p in (plugins.semaphore_signal_p, plugins.axis_index_p):
        assert plugins.interpret_rules.owners(p) == ["pallas", "pallas_tpu"]
