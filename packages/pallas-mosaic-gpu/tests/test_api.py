"""The public surface against upstream's 92 names: every one is provided, with
upstream's parameter names."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import pallas_mosaic_gpu as plgpu

REFERENCE = Path(__file__).resolve().parents[4] / "shared/reference/upstream-api-jax-0.10.2.md"


def _upstream():
    if not REFERENCE.exists():
        pytest.skip("shared/reference is not beside the repository")
    text = REFERENCE.read_text().split("## `jax.experimental.pallas.mosaic_gpu`")[1]
    text = text.split("\n## ")[0]
    return dict(re.findall(r"^- `(\w+)` \(\w+\) `(.*?)`$", text, re.M))


def test_upstream_has_92_names():
    assert len(_upstream()) == 92


def test_every_upstream_name_is_provided():
    assert [n for n in _upstream() if not hasattr(plgpu, n)] == []


def _params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [p.name for p in sig.parameters.values() if p.name != "self"]


@pytest.mark.parametrize("name", sorted(_upstream()) if REFERENCE.exists() else [])
def test_parameter_names_match_upstream(name):
    upstream = _upstream()[name]
    ours = _params(getattr(plgpu, name))
    if ours is None or upstream.startswith("(value, names=None"):  # enums
        return
    theirs = re.findall(r"(?:^\(|, )\*?(\w+)(?=[:=,)])", upstream)
    if theirs == ["args"]:  # a base class taking anything
        return
    # The reference truncates long signatures: compare the common prefix.
    assert ours[:len(theirs)] == theirs[:len(ours)], (ours, theirs)
