"""The ``toy`` backend: everything a backend declares, in one small module.

A real backend would lower to its compiler's input (Triton, Mosaic, ...) in ``lower``,
run its compiler in ``compile`` and run the generated code under an emulator in
``emulate``. The toy delegates all three to the core interpreter, which is what makes it
correct by construction, and a useful baseline for the faulty variants in ``faulty.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

import pallas as pl
from pallas.plugins import (
    Backend,
    KernelRequest,
    LoweringRequest,
    hookimpl,
    interpret_pallas_call,
    lower_with_interpreter,
)
from toy_pallas_backend import __version__

# Every conformance tag except the JAX transformations (which need rules in the core).
CAPABILITIES = frozenset({
    "elementwise", "broadcasting", "reductions", "indexing", "masking", "edge_blocks",
    "control_flow", "dot", "scratch", "aliasing", "multiple_outputs", "pytrees",
    "scalar_prefetch", "semaphores", "sequential_grid", "carry_across_blocks", "bf16", "f16", "int8", "uint32", "bool",
    "export", "kernels",
})


class ToyCompilerParams(pl.CompilerParams):
    """Passing an instance to ``pallas_call`` selects the toy backend."""

    BACKEND = "toy"


@dataclasses.dataclass(frozen=True)
class ToyArtifact:
    """What ``compile`` produces: a listing of the kernel, as a compiler would."""

    name: str
    grid: tuple
    source: str


class ToyBackend(Backend):
    """Lowers, compiles and emulates by delegating to the core interpreter."""

    def lower(self, request: LoweringRequest):
        return lower_with_interpreter(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                      grid_mapping=request.grid_mapping)

    def compile(self, request: KernelRequest) -> ToyArtifact:
        return ToyArtifact(name=request.name, grid=tuple(request.grid_mapping.grid),
                           source=str(request.jaxpr))

    def emulate(self, request: KernelRequest, *args):
        run = jax.jit(functools.partial(interpret_pallas_call, jaxpr=request.jaxpr,
                                        grid_mapping=request.grid_mapping))
        return run(*args)


TOY = ToyBackend(
    name="toy",
    version=__version__,
    platforms=("cpu",),
    compiler_params_type=ToyCompilerParams,
    capabilities=CAPABILITIES,
    levels=("lower", "compile", "emulate", "execute"),
    priority=-10,  # never chosen by default over the builtin interpreter backend
    package="toy-pallas-backend",
)


@hookimpl
def pallas_backends():
    return [TOY]
