"""The catalogue, one module per tag family. Importing this package registers every case."""

from pallas_conformance.cases import (
    aliasing,
    atomics,
    broadcasting,
    control_flow,
    control_flow_more,
    dot,
    dot_more,
    elementwise,
    elementwise_more,
    indexing,
    indexing_more,
    kernels,
    operands_more,
    outputs,
    prefetch,
    reductions,
    reductions_more,
    scratch,
    semaphores,
    transforms,
)
