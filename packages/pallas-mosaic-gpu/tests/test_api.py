"""The public surface against upstream's 92 names: present ones have upstream's
signature, and the README lists every name not provided yet."""

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


def _missing():
    return [n for n in _upstream() if not hasattr(plgpu, n)]


def test_upstream_has_92_names():
    assert len(_upstream()) == 92


def test_readme_lists_every_name_not_provided_yet():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("### Not provided yet")[1].split("\n#")[0]
    listed = set(re.findall(r"`(\w+)`", section))
    assert listed == set(_missing())


@pytest.mark.parametrize("name", ["CompilerParams", "GMEM", "SMEM", "TMEM", "REGS", "Barrier",
                                  "ClusterBarrier", "find_swizzle", "semaphore_signal",
                                  "semaphore_wait"])
def test_parameter_names_match_upstream(name):
    upstream = _upstream()[name]
    params = [p for p in inspect.signature(getattr(plgpu, name)).parameters.values()
              if p.name != "self"]
    ours = [p.name for p in params]
    theirs = re.findall(r"(?:^\(|, )\*?(\w+)(?=[:=,)])", upstream)
    assert theirs and ours
    assert ours[:len(theirs)] == theirs[:len(ours)], (ours, theirs)
