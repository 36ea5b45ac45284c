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
