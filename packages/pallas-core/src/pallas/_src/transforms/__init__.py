"""Transformation rules of ``pallas_call_p``: vmap, jvp, linearize/transpose, effects.

Each module registers its rules with JAX when imported; ``pallas/__init__.py`` imports
them all (``ad``, ``batching``, ``effects``). The JVP and transpose rules of the
kernel-side primitives are beside their definitions, in ``pallas._src.primitives``.
"""
