"""``pallas-tpu[compile]`` installs the libtpu that jax 0.10.2's own ``tpu`` extra pins:
the compiler must match the jaxlib that packs the Mosaic module it compiles."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _libtpu(reqs, extra):
    found = [r for r in map(Requirement, reqs) if r.name == "libtpu"
             and (extra is None or r.marker is None or r.marker.evaluate({"extra": extra}))]
    assert len(found) == 1, reqs
    return found[0]


def test_compile_extra_pins_the_libtpu_of_jax_tpu_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = _libtpu(project["optional-dependencies"]["compile"], None)
    jax_pin = _libtpu(importlib.metadata.requires("jax"), "tpu")
    assert ours.specifier == jax_pin.specifier, (str(ours), str(jax_pin))


def test_the_installed_libtpu_satisfies_the_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = _libtpu(project["optional-dependencies"]["compile"], None)
    try:
        version = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        import pytest

        pytest.skip("libtpu is not installed (pip install 'pallas-tpu[compile]')")
    assert ours.specifier.contains(version), (version, str(ours))
