"""The TPU SparseCore backend of Pallas (``import pallas_tpu_sparsecore as plsc``).

The public surface mirrors upstream ``jax.experimental.pallas.tpu_sc`` (JAX 0.10.2)
name by name: subcore meshes, SparseCore figures, gathers/scatters, masked loads and
stores, the vector-subcore primitives and ``parallel_loop``. Kernels are written with
``pl.kernel(mesh=plsc.VectorSubcoreMesh(...))``, lower to Mosaic for SparseCore on any
machine, and run on CPU with ``interpret=True``.
"""

from pallas_tpu_sparsecore.__about__ import __version__
from pallas_tpu_sparsecore._src.compiler_params import CompilerParams
from pallas_tpu_sparsecore._src.indices import Indices
from pallas_tpu_sparsecore._src.info import (
    DEFAULT_CHIP,
    SparseCoreInfo,
    get_sparse_core_info,
    get_sparse_core_info_for_chip,
    supported_shapes,
    target_chip,
)
from pallas_tpu_sparsecore._src.mesh import ScalarSubcoreMesh, VectorSubcoreMesh
from pallas_tpu_sparsecore._src.primitives.control import (
    fetch_and_add,
    parallel_loop,
    subcore_barrier,
)
from pallas_tpu_sparsecore._src.primitives.gather import (
    addupdate_scatter,
    load_gather,
    store_scatter,
)
from pallas_tpu_sparsecore._src.primitives.memory import (
    addupdate,
    addupdate_compressed,
    load_expanded,
    store_compressed,
)
from pallas_tpu_sparsecore._src.primitives.vector import (
    PackFormat,
    all_reduce_ffs,
    all_reduce_population_count,
    bitcast,
    cummax,
    cumsum,
    pack,
    scan_count,
    sort_key_val,
    unpack,
)
from pallas_tpu_sparsecore.plugin import register_interpret_rules as _register_interpret_rules

_register_interpret_rules()

# The 24 names of upstream jax.experimental.pallas.tpu_sc (JAX 0.10.2).
UPSTREAM_NAMES = (
    "Indices", "PackFormat", "ScalarSubcoreMesh", "VectorSubcoreMesh", "addupdate",
    "addupdate_compressed", "addupdate_scatter", "all_reduce_ffs",
    "all_reduce_population_count", "bitcast", "cummax", "cumsum", "fetch_and_add",
    "get_sparse_core_info", "load_expanded", "load_gather", "pack", "parallel_loop",
    "scan_count", "sort_key_val", "store_compressed", "store_scatter", "subcore_barrier",
    "unpack",
)

__all__ = [*UPSTREAM_NAMES, "CompilerParams", "DEFAULT_CHIP", "SparseCoreInfo",
           "get_sparse_core_info_for_chip", "supported_shapes", "target_chip",
           "__version__"]
