"""The built-in ``interpret`` backend: the reference interpreter as a CPU backend.

Registered through pallas-core's own ``pallas.backends`` entry point, so it is found by
the same discovery as every other backend.
"""

from __future__ import annotations

from pallas.__about__ import __version__
from pallas._src.interpreter.lowering import lower_with_interpreter
from pallas._src.registry.backend import Backend
from pallas._src.registry.hookspecs import hookimpl
from pallas._src.registry.requests import LoweringRequest


class InterpretBackend(Backend):
    """Lowers ``pallas_call`` to plain HLO that interprets the kernel."""

    def lower(self, request: LoweringRequest):
        return lower_with_interpreter(request.ctx, *request.grid_bounds, *request.in_nodes,
                                      jaxpr=request.jaxpr, grid_mapping=request.grid_mapping)


INTERPRET = InterpretBackend(
    name="interpret",
    version=__version__,
    platforms=("cpu",),
    capabilities=frozenset({"*"}),
    levels=("lower", "execute"),
    priority=0,
    package="pallas-core",
)


@hookimpl
def pallas_backends():
    return [INTERPRET]
