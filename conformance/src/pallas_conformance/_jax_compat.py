"""The only private-JAX import of pallas-conformance (ported with each JAX release)."""

from __future__ import annotations


def is_known_platform(platform: str) -> bool:
    """Whether JAX knows ``platform`` here (built in, or registered by a PJRT plugin such
    as ``jax-cuda13-plugin``), which lowering for it needs."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - a JAX that moved it: assume it is known
        return True
    return bool(xla_bridge.is_known_platform(platform))
