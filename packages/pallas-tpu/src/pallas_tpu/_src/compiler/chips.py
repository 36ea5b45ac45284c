"""The chips ``pallas_tpu.compile`` compiles for, and how one is chosen."""

from __future__ import annotations

import os
from typing import Any

# Chip -> the smallest deviceless topology libtpu builds for it (one host's chips; the
# kernel is compiled for the first device).
TOPOLOGIES = {
    "v4": "v4:2x2x1",
    "v5e": "v5e:2x2",
    "v5p": "v5p:2x2x1",
    "v6e": "v6e:2x2",
    "7x": "TPU7x:2x2x1",
}
CHIPS = tuple(TOPOLOGIES)
DEFAULT_CHIP = "v5e"
# The environment variable that picks the chip when neither ``chip=`` nor the kernel's
# ``CompilerParams(chip=...)`` does.
ENV_CHIP = "PALLAS_TPU_CHIP"

_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v5 lite": "v5e", "v6 lite": "v6e",
            "v6lite": "v6e", "tpu7x": "7x", "v7x": "7x", "7": "7x", "tpu v4": "v4",
            "tpu v5": "v5p", "tpu v5e": "v5e", "tpu v5p": "v5p", "tpu v6e": "v6e"}


def canonical_chip(chip: Any, *, what: str = "chip") -> str:
    """``"v5e"`` for ``"v5e"``, ``"V5E"``, ``pltpu.ChipVersion.TPU_V5E``, ``"TPU7x"``...;
    a ``ValueError`` naming the valid chips otherwise."""
    name = str(getattr(chip, "value", chip)).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in TOPOLOGIES:
        raise ValueError(f"{what}={chip!r} is not a chip pallas_tpu.compile compiles for; "
                         f"valid: {', '.join(CHIPS)}")
    return name


def resolve_chip(chip: Any = None, compiler_params: Any = None,
                 default: str = DEFAULT_CHIP) -> str:
    """The chip to compile for: ``chip`` if given, else the kernel's
    ``CompilerParams(chip=...)``, else ``$PALLAS_TPU_CHIP``, else ``default``."""
    if chip is not None:
        return canonical_chip(chip)
    from_params = getattr(compiler_params, "chip", None)
    if isinstance(compiler_params, dict):
        from_params = compiler_params.get("chip")
    if from_params is not None:
        return canonical_chip(from_params, what="CompilerParams(chip)")
    env = os.environ.get(ENV_CHIP)
    if env:
        return canonical_chip(env, what=f"${ENV_CHIP}")
    return canonical_chip(default)
