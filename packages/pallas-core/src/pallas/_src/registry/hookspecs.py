"""The backend contract, as pluggy hook specifications: a backend author's one file.

A backend package registers a module in the entry-point group ``pallas.backends``::

    [project.entry-points."pallas.backends"]
    triton = "pallas_triton.plugin"

That module implements some of the hooks below, each marked ``@pallas.plugins.hookimpl``.
The core loads every entry point once, at first use (``pallas.plugins.list_backends()``,
backend selection; a backend asked for by name loads only the entry point of that name,
if it provides the backend, until something needs them all), checks that each marked function names a hook declared here (a
misspelled hook is a load error naming the plugin, never silently ignored), then calls
the hooks plugin by plugin so that a failure is reported under the plugin's name.

What a backend object does is :class:`pallas.plugins.Backend`'s contract:

- ``lower(request: LoweringRequest) -> list[ir.Value]``: the MLIR of one ``pallas_call``;
- ``validate(request: KernelRequest) -> None``: trace-time checks, clear errors;
- ``compile(request: KernelRequest)``: the real compiler on CPU (level ``compile``);
- ``emulate(request: KernelRequest, *arrays) -> list[Array]``: the generated code run
  under an emulator (level ``emulate``);
- ``interpret(request: KernelRequest, *arrays) -> list[Array]``: the kernel jaxpr under
  the backend's interpret rules (level ``backend_interpret``).

Rules (interpreter and lowering) are kept in :class:`pallas.plugins.RuleTable` objects
keyed by primitive; see ``docs/backend-authors.md``, "Adding a primitive".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pallas._src.registry.backend import Backend

PROJECT = "pallas"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def pallas_backends() -> Sequence[Backend]:
    """Returns the backends this plugin provides.

    Called once per discovery. Each returned object must be a
    :class:`pallas.plugins.Backend` with a unique ``name``; ``platforms`` are the JAX
    platforms it lowers for (``"cuda"``, ``"tpu"``, ...), ``capabilities`` the
    conformance tags it claims, ``levels`` the conformance levels it provides.

    :return: a list of :class:`pallas.plugins.Backend` (may be empty, e.g. when the
        plugin's toolchain is missing; raise instead to have that reported).
    """


@hookspec
def pallas_interpret_rules() -> Mapping[Any, Callable[..., list]]:
    """Returns interpreter rules for the plugin's own primitives.

    Each rule is ``rule(ctx: KernelContext, eqn: JaxprEqn, invals: list) -> list``
    (``ctx`` the interpreter's :class:`pallas.plugins.KernelContext`, refs arriving as
    :class:`pallas.plugins.Cell`), so kernels using the primitives also run with
    ``interpret=True``. The rules join ``pallas.plugins.interpret_rules`` under the
    plugin's name; a rule for a primitive that already has one from another package is
    a load error (change another package's rule with ``interpret_rules.override``).
    Registering rules next to the primitives' definitions (with
    ``pallas.plugins.register_interpret_rule``) is equivalent and works before discovery.

    :return: ``{primitive: rule}``, keyed by primitive objects.
    """
