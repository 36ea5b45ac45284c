"""The SparseCore lowering rule table: SparseCore rules first, then pallas-tpu's.

``rule(*prims)`` registers a SparseCore lowering rule (search a primitive's name to find
it). :data:`RULES` looks a primitive up here first and falls back to pallas-tpu's table
(through its public ``pallas_tpu.extend``), so arithmetic, control flow, DMAs and
semaphores lower as for a TensorCore unless SparseCore needs something else.
"""

from __future__ import annotations

import collections

from pallas_tpu import extend as tpx

SC_RULES: dict = {}
RULES = collections.ChainMap(SC_RULES, tpx.RULES)


def rule(*prims):
    """Registers the decorated function as the SparseCore lowering rule of ``prims``."""

    def register(f):
        for p in prims:
            SC_RULES[p] = f
        return f

    return register
