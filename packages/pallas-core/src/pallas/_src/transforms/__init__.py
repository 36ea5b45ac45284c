"""Transformation rules of ``pallas_call_p``: vmap, jvp, linearize/transpose, effects.

Each module registers its rules with JAX when imported; ``pallas/__init__.py`` imports
them all (see :func:`register_all`).
"""


def register_all() -> None:
    """Imports every transformation module, which registers its rules."""
    from pallas._src.transforms import ad, batching, effects, ref_transposes  # noqa: F401
