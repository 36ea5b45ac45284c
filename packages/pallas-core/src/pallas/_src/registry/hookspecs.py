"""The backend contract, as pluggy hook specifications.

A backend package registers a module in the entry-point group ``pallas.backends``::

    [project.entry-points."pallas.backends"]
    triton = "pallas_triton.plugin"

That module implements the hooks below with ``@pallas.plugins.hookimpl``. The core calls
``pallas_backends`` once, at first use, and registers every returned
:class:`~pallas.plugins.Backend`.
"""

from __future__ import annotations

import pluggy

PROJECT = "pallas"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def pallas_backends() -> list:
    """Returns the :class:`~pallas.plugins.Backend` objects this plugin provides.

    Each backend has a unique ``name``; ``platforms`` are the JAX platforms it lowers for
    (``"cuda"``, ``"tpu"``, ...); ``capabilities`` the conformance tags it claims.
    """


@hookspec
def pallas_interpret_rules() -> dict:
    """Returns ``{primitive: rule}`` interpreter rules for the plugin's own primitives.

    A rule is ``rule(ctx, eqn, invals) -> list`` (see ``pallas._src.interpreter.rules``),
    so kernels using the backend's primitives also run with ``interpret=True``.
    """
