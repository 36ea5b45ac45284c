"""Facts about a ``pallas_call`` that several of its transformation rules read: which
refs its kernel writes, and whether the call runs in the interpreter."""

from __future__ import annotations

import jax

from pallas._src import jax_compat as jc
from pallas._src.registry import registry


def written_refs(jaxpr) -> set[int]:
    """Indices of the kernel invars that the kernel writes (or accumulates into)."""
    pos = {v: k for k, v in enumerate(jaxpr.invars)}
    out = set()
    for e in jaxpr.effects:
        if isinstance(e, (jc.WriteEffect, jc.AccumEffect)):
            k = e.input if isinstance(e.input, int) else pos.get(e.input)
            if k is not None:
                out.add(k)
    return out


def is_interpreted(params) -> bool:
    """Whether the call runs in the interpreter: ``interpret=True``, or the backend chosen
    for the default platform is the built-in ``interpret`` backend (e.g. on CPU)."""
    if params["interpret"]:
        return True
    try:
        b = registry.select_backend(jax.default_backend(), params["backend"],
                                    params["compiler_params"])
    except Exception:  # noqa: BLE001 - no backend: not interpreted
        return False
    return b.name == "interpret"
