"""Finding ptxas and libdevice for the compile level: from CUDA_ROOT, NVIDIA's pip
packages or a CUDA toolkit, and, when they are missing, an error naming the pip
packages to install (XLA would abort the process instead)."""

from __future__ import annotations

import os

import pytest

from pallas_mosaic_gpu import compiler
from pallas_mosaic_gpu._src import toolchain


def _root(path, *tools):
    for tool in tools:
        os.makedirs(os.path.dirname(path / tool), exist_ok=True)
        (path / tool).write_bytes(b"")
    return str(path)


@pytest.fixture
def nothing_installed(monkeypatch, tmp_path):
    """No CUDA_ROOT, no pip toolchain, and empty system toolkit folders."""
    monkeypatch.delenv("CUDA_ROOT", raising=False)
    monkeypatch.setattr(toolchain, "pip_root", lambda tool: None)
    monkeypatch.setattr(toolchain, "SYSTEM_ROOTS", (str(tmp_path / "usr-local-cuda"),))
    return tmp_path


def test_a_cuda_root_with_ptxas_and_libdevice_is_used(nothing_installed, monkeypatch):
    root = _root(nothing_installed / "cuda", toolchain.PTXAS, toolchain.LIBDEVICE)
    monkeypatch.setenv("CUDA_ROOT", root)
    assert compiler.find_toolchain() == root


def test_the_pip_packages_come_before_a_system_toolkit(nothing_installed, monkeypatch):
    pip = _root(nothing_installed / "site-packages" / "nvidia" / "cu13",
                toolchain.PTXAS, toolchain.LIBDEVICE)
    system = _root(nothing_installed / "usr-local-cuda", toolchain.PTXAS, toolchain.LIBDEVICE)
    monkeypatch.setattr(toolchain, "pip_root", lambda tool: pip)
    assert compiler.find_toolchain() == pip
    monkeypatch.setattr(toolchain, "pip_root", lambda tool: None)
    assert compiler.find_toolchain() == system


def test_nothing_installed_names_both_pip_packages_and_the_extra(nothing_installed):
    with pytest.raises(compiler.ToolchainMissingError) as e:
        compiler.find_toolchain()
    msg = str(e.value)
    assert "nvidia-cuda-nvcc and nvidia-nvvm are not installed" in msg
    assert "pip install 'pallas-mosaic-gpu[compile]'" in msg
    assert "pip install nvidia-cuda-nvcc nvidia-nvvm" in msg
    assert "usr-local-cuda (no bin/ptxas, no nvvm/libdevice/libdevice.10.bc)" in msg


def test_ptxas_without_libdevice_names_only_the_missing_package(nothing_installed,
                                                                monkeypatch):
    pip = _root(nothing_installed / "cu13", toolchain.PTXAS)
    monkeypatch.setattr(toolchain, "pip_root",
                        lambda tool: pip if tool == toolchain.PTXAS else None)
    with pytest.raises(compiler.ToolchainMissingError,
                       match=r"package nvidia-nvvm is not installed.*"
                             r"cu13 \(no nvvm/libdevice/libdevice.10.bc\).*"
                             r"`pip install nvidia-nvvm`"):
        compiler.find_toolchain()


def test_pip_root_reads_the_installed_distribution(monkeypatch):
    import pytest as installed

    # Any installed distribution shows the lookup: pytest's file list holds pytest/__init__.py.
    tool = os.path.join("pytest", "__init__.py")
    monkeypatch.setitem(toolchain.PIP_PACKAGES, tool, "pytest")
    site = os.path.dirname(os.path.dirname(installed.__file__))
    assert toolchain.pip_root(tool) == os.path.normpath(site)
    monkeypatch.setitem(toolchain.PIP_PACKAGES, tool, "no-such-distribution-installed")
    assert toolchain.pip_root(tool) is None


def test_a_missing_cuda_plugin_names_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(compiler.ToolchainMissingError,
                       match=r"CUDA plugin.*pallas-mosaic-gpu\[compile\].*jax-cuda13-plugin==0.10.2"):
        toolchain.check_plugin()
