"""The development workspace (hatch.toml) installs every package of the repository.

The members are listed one by one (so that pallas-mosaic-gpu can bring its ``compile``
extra, pip's CUDA tools); a package missing from the list would silently go untested.
"""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _members() -> set[str]:
    env = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]
    return {m if isinstance(m, str) else m["path"] for m in env["workspace"]["members"]}


def test_every_package_is_a_workspace_member():
    packages = {f"packages/{p.parent.name}" for p in ROOT.glob("packages/*/pyproject.toml")}
    assert packages | {"conformance"} == _members()


def test_mosaic_gpu_is_installed_with_its_pip_cuda_tools():
    env = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]
    gpu = [m for m in env["workspace"]["members"]
           if isinstance(m, dict) and m["path"] == "packages/pallas-mosaic-gpu"]
    assert gpu and "compile" in gpu[0]["features"]


def test_tpu_backends_are_installed_with_libtpu():
    """pallas-tpu's (and pallas-tpu-sparsecore's) compile level needs libtpu, the real TPU
    compiler, which the workspace installs through their ``compile`` extra."""
    env = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]["default"]
    for path in ("packages/pallas-tpu", "packages/pallas-tpu-sparsecore"):
        tpu = [m for m in env["workspace"]["members"]
               if isinstance(m, dict) and m["path"] == path]
        assert tpu and "compile" in tpu[0]["features"], path
    assert env["env-vars"]["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
