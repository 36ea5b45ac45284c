"""The MLIR-on-NumPy executor shared by the backends that generate MLIR (Mosaic TPU,
Mosaic GPU): one engine (plan compilation, the rule table, ``run``), one value model of
element types, and the rules of the upstream dialects (``func``, ``arith``, ``math``,
``scf``). The public surface is :mod:`pallas.executor`; a backend adds its own dialect's
rules and its execution model there, never here.

Layers, importing only downward: ``errors`` and ``types`` -> ``engine`` -> the rule
modules ``rules_arith``, ``rules_math``, ``rules_scf`` (which never import each other).
"""
