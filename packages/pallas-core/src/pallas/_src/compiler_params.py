"""The base of every backend's ``CompilerParams``; the subclass names its backend."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class CompilerParams:
    """Backend options for ``pallas_call``. Passing an instance selects its backend.

    Subclasses set ``BACKEND`` to the backend name they belong to (e.g. ``"triton"``).
    """

    BACKEND: ClassVar[str | None] = None
