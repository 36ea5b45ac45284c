"""``pallas.state``: JAX's Ref (state) types and primitives, as pallas-core pins them.

A kernel reads and writes its Refs through JAX's state machinery: Ref avals and their
views (``ref.at[...]``, ``ref.reshape``, ``ref.bitcast``), the read and write effects,
the indexers, and the ``get``/``swap``/``addupdate`` primitives. JAX keeps them in its
private modules; backends take them from here, so that moving to a new JAX changes them
in pallas-core's compat module alone.
"""

from pallas._src.jax_compat import (
    AbstractRef,
    BitcastTransform,
    NDIndexer,
    ReadEffect,
    ReshapeTransform,
    Slice,
    TransformedRef,
    WriteEffect,
    addupdate_p,
    get_p,
    swap_p,
    transform_type,
)

__all__ = [
    "AbstractRef", "BitcastTransform", "NDIndexer", "ReadEffect", "ReshapeTransform",
    "Slice", "TransformedRef", "WriteEffect", "addupdate_p", "get_p", "swap_p",
    "transform_type",
]
