"""The fuser's rules, keyed by primitive object: pull, push, kernel-eval and usage.

A rule for a primitive is registered next to the others for it (see ``rules_*.py``), so
searching for the primitive's name finds every rule. Backends and users register rules
for their own primitives through the public decorators in :mod:`pallas.fuser`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# primitive -> rule(ctx, out_block_transform(s), **params) -> input transforms
pull_block_spec_rules: dict[Any, Callable[..., Any]] = {}
# primitive -> rule(ctx, *in_block_specs, **params) -> output block spec(s)
push_block_spec_rules: dict[Any, Callable[..., Any]] = {}
# primitive -> rule(ctx, *in_block_values, **params) -> output block value(s)
eval_rules: dict[Any, Callable[..., Any]] = {}
# primitive -> rule(ctx, out_usage(s), **params) -> input usages
usage_rules: dict[Any, Callable[..., Any]] = {}


def _register(table: dict, prim) -> Callable:
    if isinstance(prim, str):
        raise TypeError(
            f"pallas.fuser rules are keyed by primitive objects, not names; got {prim!r}")

    def wrapper(rule):
        table[prim] = rule
        return rule

    return wrapper


def register_pull_block_spec_rule(prim) -> Callable:
    """Registers how block specs of ``prim``'s outputs pull back to its inputs."""
    return _register(pull_block_spec_rules, prim)


def register_push_block_spec_rule(prim) -> Callable:
    """Registers how block specs of ``prim``'s inputs push forward to its outputs."""
    return _register(push_block_spec_rules, prim)


def register_eval_rule(prim) -> Callable:
    """Registers how ``prim`` computes one block of its output inside a kernel."""
    return _register(eval_rules, prim)


def register_usage_rule(prim) -> Callable:
    """Registers which inputs of ``prim`` are scalar-prefetch values (e.g. slice starts)."""
    return _register(usage_rules, prim)


def known(table: dict) -> str:
    """The names of the primitives a table has rules for, for error messages."""
    return ", ".join(sorted({getattr(p, "name", str(p)) for p in table}))
