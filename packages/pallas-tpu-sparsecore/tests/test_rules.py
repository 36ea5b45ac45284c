"""The SparseCore lowering table: its own rules first, then pallas-tpu's (its parent),
with a rule or a declared reason for every pallas-core primitive."""

from pallas import plugins
from pallas_tpu import extend as tpx
from pallas_tpu_sparsecore._src.lowering.table import RULES


def test_every_core_primitive_has_a_rule_or_a_reason():
    assert RULES.missing(plugins.PRIMITIVES) == []


def test_sparsecore_rules_come_first_and_pallas_tpu_fills_the_rest():
    assert RULES.parent is tpx.RULES
    own = [p for p in RULES if RULES.owners(p) == ["pallas_tpu_sparsecore"]]
    assert own, "SparseCore registers rules of its own"
    assert plugins.program_id_p in RULES  # from pallas-tpu
