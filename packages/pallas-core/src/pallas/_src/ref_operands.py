"""Refs as primitive operands: a (possibly ``ref.at[...]``-transformed) ref is bound as its
base ref followed by the flat leaves of its transforms, under a static layout that the
primitive keeps as a parameter. Backends' DMA, barrier and copy primitives share this."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from pallas._src import jax_compat as jc

# One entry per packed ref: (operand position of the base ref, number of transform
# leaves after it, the transforms' treedef), or None where no ref was given.
LayoutEntry = tuple[int, int, Any] | None


def ref_and_transforms(ref: Any) -> tuple[Any, tuple]:
    """(base ref, tuple of transforms) of a ref or a ``ref.at[...]`` view."""
    if isinstance(ref, jc.TransformedRef):
        return ref.ref, tuple(ref.transforms)
    return ref, ()


class RefOperands:
    """Packs several (transformed) refs, or None, into one operand list; ``spec`` is the
    static layout that :func:`unpack_ref_operands` reads back. ``wrap`` may rewrite the
    transforms before flattening (e.g. to make index arrays pytree leaves)."""

    def __init__(self, *refs: Any, wrap: Callable[[tuple], Any] | None = None):
        self.operands: list = []
        layout: list[LayoutEntry] = []
        for r in refs:
            if r is None:
                layout.append(None)
                continue
            base, transforms = ref_and_transforms(r)
            flat, tree = jax.tree_util.tree_flatten(
                wrap(transforms) if wrap is not None else transforms)
            layout.append((len(self.operands), len(flat), tree))
            self.operands += [base, *flat]
        self.spec: tuple[LayoutEntry, ...] = tuple(layout)


def unpack_ref_operands(spec: Sequence[LayoutEntry], operands: Sequence) -> list:
    """For each entry of ``spec``: (base, flat transform leaves, treedef), or None."""
    out = []
    for entry in spec:
        if entry is None:
            out.append(None)
            continue
        pos, n, tree = entry
        out.append((operands[pos], list(operands[pos + 1 : pos + 1 + n]), tree))
    return out


def ref_operands_end(spec: Sequence[LayoutEntry]) -> int:
    """The number of operands ``spec`` uses (operands after it are the primitive's own)."""
    return max((e[0] + 1 + e[1] for e in spec if e is not None), default=0)
