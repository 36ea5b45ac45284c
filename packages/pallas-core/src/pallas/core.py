"""``pallas.core``: the core types of the programming model as one module (upstream keeps
them in ``jax._src.pallas.core``, with ``pallas_export_experimental``), and the explicit
grid environment.

``grid_env([GridAxis(index, size), ...])`` makes ``pl.program_id``/``pl.num_programs``
return the given values while a kernel body is traced inside another loop (for
example one step of a pipeline standing for a grid point).
"""

from pallas import CostEstimate, MemoryRef, MemorySpace, pallas_export_experimental
from pallas._src.block_spec import BlockSpec
from pallas._src.grid_spec import BlockMapping, GridSpec, PrefetchScalarGridSpec
from pallas._src.primitives.grid import GridAxis, grid_env

__all__ = [
    "BlockMapping", "BlockSpec", "CostEstimate", "GridAxis", "GridSpec", "MemoryRef",
    "MemorySpace", "PrefetchScalarGridSpec", "grid_env", "pallas_export_experimental",
]
