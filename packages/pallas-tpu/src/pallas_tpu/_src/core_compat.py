"""Every import of pallas-core used by pallas-tpu's backend machinery, in one place.

Everything here now comes from the public plugin API, ``pallas.plugins``; no pallas-core
internals (its private package) are imported. If pallas-tpu ever needs an internal again, it
is imported here and only here, so that a change in pallas-core is a change to this file.
"""

from __future__ import annotations

from pallas.plugins import (
    SelectedRef,  # pl.select_ref's result: a DMA operand picked at run time
    atomic_cas_p,
    atomic_rmw_p,
    axis_index_p,
    core_map_p,
    debug_check_p,
    debug_print_p,
    delay_p,
    dynamic_grid_dim,  # the marker of a grid size given at run time
    fresh_cell,
    get_global_p,
    interpret_pallas_call,  # for emulate()
    interpret_rules,  # to extend two core rules
    is_semaphore_space,
    load_p,
    lower_with_interpreter,  # for force_tpu_interpret_mode
    multiple_of_p,
    num_programs_p,
    program_id_p,
    run_scoped_p,
    semaphore_read_p,
    semaphore_signal_p,
    semaphore_wait_p,
    swap_p,
)

__all__ = [
    "SelectedRef", "atomic_cas_p", "atomic_rmw_p", "axis_index_p", "core_map_p", "debug_check_p",
    "debug_print_p", "debug_prims", "delay_p", "dynamic_grid_dim",
    "fresh_cell", "get_global_p", "interpret_pallas_call", "interpret_rules", "is_semaphore_space",
    "load_p", "lower_with_interpreter", "multiple_of_p", "num_programs_p", "program_id_p",
    "run_scoped_p", "semaphore_read_p", "semaphore_signal_p", "semaphore_wait_p", "swap_p",
]


def debug_prims():
    """pallas-core's debug primitives, by name."""
    return {"debug_check_p": debug_check_p, "debug_print_p": debug_print_p,
            "delay_p": delay_p}
