"""What the core hands a backend: one typed request per kind of call, and the artifact a
backend builds from one.

``Backend.validate``/``compile`` take a :class:`KernelRequest`, ``emulate`` and
``interpret`` a :class:`KernelRequest` plus the operand arrays, ``lower`` a
:class:`LoweringRequest` (a kernel request plus JAX's lowering context and operands).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pallas._src.compiler_params import CompilerParams
from pallas._src.cost import CostEstimate
from pallas._src.grid_spec import GridMapping
from pallas._src.registry.params import resolve_compiler_params


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelArtifact:
    """What a backend builds once from a kernel request (:meth:`Backend.build`), and the
    core hands to every later stage of the same kernel (``request.artifact``).

    Attributes:
      backend: the name of the backend that built it.
      compiler_params: the compiler params it was built with (the backend's type).
      payload: the backend's own product (a lowered kernel, generated source, ...), or
        None when validating was all there was to do. It must not refer to the request's
        jaxpr (the core keeps the artifact for as long as that jaxpr lives, no longer).
    """

    backend: str
    compiler_params: Any = None
    payload: Any = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelRequest:
    """One ``pallas_call``'s kernel, as the backend chosen for it receives it.

    Attributes:
      jaxpr: the kernel as a ``ClosedJaxpr`` over Refs, in the order scalar prefetch,
        inputs, outputs, scratch.
      grid_mapping: the resolved grid and block mappings (``.grid``,
        ``.block_mappings``, ``.num_scalar_prefetch``, ...).
      compiler_params: this backend's ``CompilerParams`` (its entry of the dict form,
        built into its ``compiler_params_type``), or ``None``.
      name: the kernel's name (``pallas_call(name=...)`` or the function's).
      out_avals: ``ShapedArray`` of each output.
      cost_estimate: the user's ``pl.CostEstimate``, if any.
      metadata: ``pallas_call(metadata=...)`` as sorted ``(key, value)`` pairs.
      options: level-specific options (e.g. ``compute_capability`` for ``compile``).
      debug: ``pallas_call(debug=True)``: the backend prints what it generates (upstream
        prints the Mosaic module, for example).
      artifact: what the backend built from this kernel (:meth:`Backend.build`), when a
        stage built it already; read it with ``backend.artifact(request)``.
    """

    jaxpr: Any  # jax.extend.core.ClosedJaxpr
    grid_mapping: GridMapping
    compiler_params: CompilerParams | Mapping[str, Any] | None = None
    name: str = "kernel"
    out_avals: tuple = ()
    cost_estimate: CostEstimate | None = None
    metadata: tuple | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    debug: bool = False
    artifact: KernelArtifact | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def for_backend(cls, backend: Any, params: Mapping[str, Any],
                    **options: Any) -> KernelRequest:
        """The request ``backend`` receives for a ``pallas_call_p`` equation's ``params``,
        its compiler params coerced to the backend's type (the core's one coercion,
        :func:`pallas.plugins.resolve_compiler_params`)."""
        return cls.from_params(
            params, resolve_compiler_params(backend, params.get("compiler_params")),
            **options)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], compiler_params: Any = None,
                    **options: Any) -> KernelRequest:
        """The request for a ``pallas_call_p`` equation's ``params`` (with the chosen
        backend's ``compiler_params``)."""
        return cls(jaxpr=params["jaxpr"], grid_mapping=params["grid_mapping"],
                   compiler_params=compiler_params, name=params.get("name") or "kernel",
                   out_avals=tuple(params.get("out_avals", ())),
                   cost_estimate=params.get("cost_estimate"),
                   metadata=params.get("metadata"), options=options,
                   debug=bool(params.get("debug", False)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoweringRequest(KernelRequest):
    """A kernel to lower, with JAX's lowering context.

    Attributes:
      ctx: JAX's ``mlir.LoweringRuleContext`` (``ctx.module_context.platforms`` are the
        platforms being lowered for).
      in_nodes: the operands' MLIR values.
      grid_bounds: the MLIR values (int32 scalars) of the grid's dynamic sizes, one per
        ``dynamic_grid_dim`` in ``grid_mapping.grid``, in order; empty for a static grid.
        Only backends that claim the ``dynamic_grid`` capability receive any. ``ctx``'s
        ``avals_in`` start with their avals, then those of ``in_nodes``.
      platform: the one platform this lowering is for (``"cuda"``, ``"rocm"``, ...).
        When a module is lowered for several platforms at once, ``ctx`` lists them all
        and the backend's ``lower`` is called once per platform it is chosen for.
    """

    ctx: Any  # jax.interpreters.mlir.LoweringRuleContext
    in_nodes: Sequence[Any] = ()
    grid_bounds: Sequence[Any] = ()
    platform: str | None = None

    @property
    def kernel(self) -> KernelRequest:
        """The same request without the lowering context."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(KernelRequest)}
        return KernelRequest(**fields)
