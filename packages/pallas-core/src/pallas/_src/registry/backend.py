"""The :class:`Backend` base class that plugins subclass or instantiate."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

LEVELS = ("lower", "compile", "backend_interpret", "emulate", "execute")


@dataclasses.dataclass
class Backend:
    """A Pallas backend: what it is, what it claims, and how it lowers.

    Subclasses override :meth:`lower` (required), and :meth:`compile`, :meth:`emulate`
    and :meth:`validate` where they have them.

    Attributes:
      name: unique backend name (``"triton"``, ``"mosaic_tpu"``, a third party's).
      version: the backend package's version.
      platforms: JAX platforms it lowers for.
      compiler_params_type: its ``CompilerParams`` subclass; passing an instance to
        ``pallas_call`` selects this backend.
      capabilities: conformance-catalogue tags the backend claims.
      levels: conformance levels it provides, among ``lower``, ``compile``,
        ``backend_interpret`` (the kernel jaxpr under the backend's own interpret rules:
        its semantics, not its generated code), ``emulate`` (the generated code
        executed), ``execute``.
      priority: used to choose between backends for the same platform (higher wins);
        an int, or a mapping from platform to int (platforms not listed get 0).
      package: the distribution that provides it (named in "not installed" errors).
    """

    name: str
    version: str
    platforms: tuple[str, ...]
    compiler_params_type: type | None = None
    capabilities: frozenset = frozenset()
    levels: tuple[str, ...] = ("lower",)
    priority: int | dict = 0
    package: str = ""

    def priority_for(self, platform: str) -> int:
        """This backend's priority when choosing a backend for ``platform``."""
        if isinstance(self.priority, dict):
            return int(self.priority.get(platform, 0))
        return int(self.priority)

    def lower(self, ctx: Any, *in_nodes: Any, jaxpr: Any, grid_mapping: Any,
              compiler_params: Any, cost_estimate: Any, name: str, metadata: Any,
              out_avals: Sequence[Any]) -> Sequence[Any]:
        """Emits MLIR for ``pallas_call`` on ``ctx.module_context.platforms``.

        ``ctx`` is JAX's ``LoweringRuleContext``; return the output MLIR values (usually
        the results of one custom call).
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement lower()")

    def validate(self, jaxpr: Any, grid_mapping: Any, compiler_params: Any) -> None:
        """Raises a clear error at trace time when the kernel cannot be supported."""

    def compile(self, jaxpr: Any, grid_mapping: Any, compiler_params: Any, **kw: Any) -> Any:
        """Runs the real compiler on CPU (conformance level ``compile``)."""
        raise NotImplementedError(f"backend {self.name!r} has no compile level")

    def emulate(self, jaxpr: Any, grid_mapping: Any, compiler_params: Any,
                *args: Any, **kw: Any) -> Any:
        """Runs the generated code under an emulator (conformance level ``emulate``)."""
        raise NotImplementedError(f"backend {self.name!r} has no emulate level")

    def interpret(self, jaxpr: Any, grid_mapping: Any, compiler_params: Any,
                  *args: Any, **kw: Any) -> Any:
        """Runs the kernel jaxpr under the backend's interpret rules (conformance level
        ``backend_interpret``); checks the backend's semantics, not its generated code."""
        raise NotImplementedError(f"backend {self.name!r} has no backend_interpret level")

    def describe(self) -> str:
        return f"{self.name} {self.version} ({', '.join(self.platforms)})"
