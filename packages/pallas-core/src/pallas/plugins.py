"""The backend plugin API: the contract, discovery and selection.

Backend authors need only this module: subclass :class:`Backend`, return instances from
a ``@hookimpl``-marked ``pallas_backends`` function, and register the module in the
``pallas.backends`` entry-point group.
"""

from pallas._src.interpreter.evaluator import Cell, KernelContext
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.mesh import CoreMesh, Mesh
from pallas._src.registry.backend import LEVELS, Backend
from pallas._src.registry.hookspecs import hookimpl, hookspec
from pallas._src.registry.registry import (
    ENTRY_POINT_GROUP,
    BackendLoadError,
    BackendNotFoundError,
    PluginLoadWarning,
    env_var,
    get_backend,
    list_backends,
    load_failures,
    register_backend,
    reset,
    select_backend,
)

__all__ = [
    "Backend", "BackendLoadError", "BackendNotFoundError", "Cell", "CoreMesh", "ENTRY_POINT_GROUP",
    "KernelContext", "LEVELS", "Mesh", "PluginLoadWarning", "env_var", "get_backend", "hookimpl",
    "hookspec", "list_backends", "load_failures", "register_backend",
    "register_interpret_rule", "reset", "select_backend",
]
