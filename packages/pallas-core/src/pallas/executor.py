"""The MLIR-on-NumPy executor, for backends that generate MLIR: run the module a custom
call carries on CPU, op by op with MLIR semantics (the conformance level ``emulate``).

One engine for every such backend: :class:`Compiler` compiles a region into a
:class:`Plan` of closures with the rules of an :class:`OpRuleTable`; :func:`run` executes
it on the backend's machine. :data:`UPSTREAM` holds the rules of the upstream dialects
(``func``, ``arith``, ``math``, ``scf``). A backend makes its own table with
``OpRuleTable(name, parent=UPSTREAM)``, registers its dialect's ops there (and any
upstream op its execution model changes, e.g. SIMT ``scf``), subclasses
:class:`Compiler` for its value model, and supplies the execution model (the grid and
DMAs, the threads and barriers) as the ``machine`` every rule receives. See "The
executor API" in ``docs/backend-authors.md``.
"""

from pallas._src.executor import rules_arith, rules_math, rules_scf  # noqa: F401 - rules
from pallas._src.executor.engine import (
    UPSTREAM,
    Compiler,
    OpRuleTable,
    Plan,
    cast,
    elementwise,
    run,
)
from pallas._src.executor.errors import ExecutorError, ExecutorUnsupported
from pallas._src.executor.rules_arith import constant_array
from pallas._src.executor.rules_math import (
    TRANSCENDENTALS,
    register_float_functions,
    widened,
)
from pallas._src.executor.rules_scf import MAX_WHILE_STEPS
from pallas._src.executor.types import (
    INT4,
    as_unsigned,
    bits,
    dtype_of,
    elem_and_shape,
    int_array_attr,
    is_float,
    register_element_type,
    scalar_dtype,
    unsigned,
    vshape,
)

__all__ = [
    "INT4", "MAX_WHILE_STEPS", "TRANSCENDENTALS", "UPSTREAM", "Compiler", "ExecutorError",
    "ExecutorUnsupported", "OpRuleTable", "Plan", "as_unsigned", "bits", "cast",
    "constant_array", "dtype_of", "elem_and_shape", "elementwise", "int_array_attr",
    "is_float", "register_element_type", "register_float_functions", "run", "scalar_dtype",
    "unsigned",
    "vshape", "widened",
]
