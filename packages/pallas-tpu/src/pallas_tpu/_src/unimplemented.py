"""Upstream names that pallas-tpu does not implement yet.

Each exists so that ``import pallas_tpu as pltpu`` exposes the full upstream surface,
and fails loudly, naming itself and the backend, when used. They are listed in the
package README. Never silently wrong.
"""

from __future__ import annotations

import functools

BACKEND = "mosaic_tpu"
PACKAGE = "pallas-tpu"


class NotImplementedInBackend(NotImplementedError):
    """A pallas-tpu name that exists for compatibility but is not implemented yet."""


def _message(name: str) -> str:
    return (
        f"pltpu.{name} is not implemented yet in {PACKAGE} (Pallas backend "
        f"{BACKEND!r}); see the pallas-tpu README for the list of unimplemented names"
    )


def not_implemented(name: str):
    """A function stub that raises NotImplementedError naming ``name`` and the backend."""

    def stub(*args, **kwargs):
        raise NotImplementedInBackend(_message(name))

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"Not implemented yet in {PACKAGE}: raises NotImplementedError."
    return stub


def not_implemented_class(name: str):
    """A class stub whose construction raises NotImplementedError."""

    def __init__(self, *args, **kwargs):  # noqa: N807
        raise NotImplementedInBackend(_message(name))

    return type(name, (), {"__init__": __init__,
                           "__doc__": f"Not implemented yet in {PACKAGE}."})


NAMES: list[str] = []


@functools.cache
def names() -> tuple[str, ...]:
    return tuple(NAMES)
