"""Wording of the API errors users see, in upstream's words (upstream's tests and users
match on them), with this project's extra detail (paths, shapes) appended."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax


def func_src_info(fn: Any) -> str:
    """``"name at file.py:line"`` for a Python function, else its name."""
    while hasattr(fn, "func") and not hasattr(fn, "__code__"):  # functools.partial
        fn = fn.func
    name = getattr(fn, "__name__", None) or type(fn).__name__
    code = getattr(fn, "__code__", None)
    if code is None:
        return name
    return f"{name} at {code.co_filename.split('/')[-1]}:{code.co_firstlineno}"


class _Leaf:
    def __repr__(self) -> str:
        return "pytree leaf"


_LEAF = _Leaf()


_LEAF_DEF = jax.tree_util.tree_structure(0)


def _is_leaf_node(x: Any, is_leaf: Callable[[Any], bool]) -> bool:
    return x is _LEAF or is_leaf(x) or jax.tree_util.tree_structure(x) == _LEAF_DEF


def _describe(x: Any, is_leaf: Callable[[Any], bool]) -> str:
    if _is_leaf_node(x, is_leaf):
        return "pytree leaf"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of length {len(x)}"
    if isinstance(x, dict):
        return f"dict with keys {list(x)}"
    return type(x).__name__


def _children(x: Any) -> list[tuple[Any, Any]]:
    """The (key, child) pairs one level below the pytree node ``x``."""
    pairs, _ = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    return [(path[0], child) for path, child in pairs]


def _differences(path: tuple, a: Any, b: Any,
                 is_leaf: Callable[[Any], bool]) -> Iterator[tuple[tuple, str, str, str]]:
    if a is None and b is None:
        return  # an absent operand (an empty pytree) and no spec for it
    a_leaf, b_leaf = _is_leaf_node(a, is_leaf), b is _LEAF
    if a_leaf and b_leaf:
        return
    if a_leaf or b_leaf:
        yield path, _describe(a, is_leaf), _describe(b, is_leaf), "one is a leaf and the other is not"
        return
    sequences = isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))
    if not sequences and type(a) is not type(b):
        yield path, _describe(a, is_leaf), _describe(b, is_leaf), "their Python types differ"
        return
    if sequences and len(a) != len(b):
        yield path, _describe(a, is_leaf), _describe(b, is_leaf), "the lengths do not match"
        return
    if isinstance(a, dict) and set(a) != set(b):
        yield path, _describe(a, is_leaf), _describe(b, is_leaf), "the keys do not match"
        return
    ka, kb = _children(a), _children(b)
    if len(ka) != len(kb):
        yield path, _describe(a, is_leaf), _describe(b, is_leaf), "the children do not match"
        return
    for (key, ca), (_, cb) in zip(ka, kb):
        yield from _differences((*path, key), ca, cb, is_leaf)


def tree_mismatches(specs: Any, treedef: Any,
                    is_leaf: Callable[[Any], bool]) -> list[tuple[tuple, str, str, str]]:
    """Where the pytree ``specs`` (leaves by ``is_leaf``) differs from ``treedef``'s
    structure; lists and tuples count as the same kind of node."""
    dummy = jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves)
    return list(_differences((), specs, dummy, is_leaf))


def leaves_up_to(specs: Any, treedef: Any, is_leaf: Callable[[Any], bool]) -> list:
    """The leaves of ``specs`` (by ``is_leaf``), one per leaf of ``treedef``, once
    :func:`tree_mismatches` found none: a ``None`` standing for an absent (``None``)
    operand gives no leaf, as it stands for no operand."""
    dummy = jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves)

    def walk(a, b):
        if b is _LEAF:
            return [a]
        if b is None:
            return []
        return [x for (_, ca), (_, cb) in zip(_children(a), _children(b)) for x in walk(ca, cb)]

    return walk(specs, dummy)


def tree_mismatch_message(what1: str, what2: str, errors: list) -> str:
    """Upstream's 'Pytree for X and Y do not match' message for ``tree_mismatches``."""
    lines = [f"Pytree for {what1} and {what2} do not match. "
             f"There are {len(errors)} mismatches, including:"]
    for path, thing1, thing2, why in errors:
        where = f"at {jax.tree_util.keystr(path)}, " if path else ""
        lines.append(f"    * {where}{what1} is a {thing1} but {what2} is a {thing2}, so {why}")
    return "\n".join(lines)
