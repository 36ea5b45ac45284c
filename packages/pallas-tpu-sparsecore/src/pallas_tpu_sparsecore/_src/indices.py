"""``plsc.Indices``: the index vector of a gather/scatter DMA, with an optional value
that marks entries to skip."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Indices:
    """Indices of an indexed DMA (``x_hbm.at[plsc.Indices(idx, ignored_value=-1)]``).

    Attributes:
      values: the indices (an array or a ref).
      ignored_value: if not None, entries equal to it are skipped (nothing is copied).
    """

    values: Any
    ignored_value: int | None = dataclasses.field(default=None, metadata=dict(static=True))
