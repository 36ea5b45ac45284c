"""Every import of pallas-core *internals* (``pallas._src``), in one place.

The public contract is ``pallas`` and ``pallas.plugins``; the few internals used here
are listed so that a change in pallas-core is a change to this file (see the package
README: these are the core changes pallas-tpu asks for).
"""

from __future__ import annotations

from pallas._src.interpreter.grid_runner import interpret_pallas_call  # for emulate()
from pallas._src.interpreter.rules import interpret_rules  # to extend two core rules
from pallas._src.jax_compat import axis_index_p
from pallas._src.memory import is_semaphore_space  # not exported by pallas.plugins
from pallas._src.pallas_call import lower_with_interpreter  # for force_tpu_interpret_mode
from pallas._src.primitives.grid import num_programs_p, program_id_p
from pallas._src.primitives.hints import multiple_of_p
from pallas._src.primitives.load_store import load_p, swap_p
from pallas._src.primitives.scoped import fresh_cell, run_scoped_p
from pallas._src.primitives.semaphores import (
    semaphore_read_p,
    semaphore_signal_p,
    semaphore_wait_p,
)

__all__ = [
    "axis_index_p", "fresh_cell", "interpret_pallas_call", "interpret_rules", "is_semaphore_space", "load_p", "lower_with_interpreter", "multiple_of_p",
    "num_programs_p", "program_id_p", "run_scoped_p", "semaphore_read_p",
    "semaphore_signal_p", "semaphore_wait_p", "swap_p",
]


def debug_prims():
    from pallas._src.primitives import debug

    return {n: getattr(debug, n) for n in dir(debug) if n.endswith("_p")}
