"""The catalogue, one module per tag family. Importing this package registers every case."""

from pallas_conformance.cases import (
    aliasing,
    broadcasting,
    control_flow,
    dot,
    elementwise,
    indexing,
    kernels,
    outputs,
    prefetch,
    reductions,
    scratch,
    semaphores,
    transforms,
)
