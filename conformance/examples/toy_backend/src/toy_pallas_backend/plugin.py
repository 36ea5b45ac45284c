"""The ``toy`` backend: everything a backend declares, in one small module.

A real backend would build its compiler's input (Triton source, a Mosaic module, ...)
once in ``build``, emit it in ``lower``, run its compiler on it in ``compile`` and run it
under an emulator in ``emulate``. The toy's ``build`` writes a listing of the kernel (what
``compile`` returns) and it delegates the rest to the core interpreter, which is what
makes it correct by construction, and a useful baseline for the faulty variants in
``faulty.py``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

import pallas as pl
from pallas.plugins import (
    Backend,
    KernelArtifact,
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
    """Builds a listing once per kernel; lowers and emulates through the interpreter."""

    def build(self, request: KernelRequest) -> KernelArtifact:
        """The first stage, once per kernel (at trace time when the toy is chosen
        explicitly): the checks a real backend makes would go here, then the listing
        every later stage shares. The payload holds no reference to the jaxpr."""
        listing = ToyArtifact(name=request.name, grid=tuple(request.grid_mapping.grid),
                              source=str(request.jaxpr))
        return KernelArtifact(backend=self.name, payload=listing,
                              compiler_params=self.compiler_params_of(request))

    def lower(self, request: LoweringRequest):
        self.artifact(request)  # the trace-time build, handed over by the core
        return lower_with_interpreter(request.ctx, *request.in_nodes, jaxpr=request.jaxpr,
                                      grid_mapping=request.grid_mapping)

    def compile(self, request: KernelRequest) -> ToyArtifact:
        return self.artifact(request).payload

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
