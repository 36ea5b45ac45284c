"""Where the compile level's CUDA tools come from: ptxas, libdevice and nvdisasm.

On a fresh machine they come from NVIDIA's pip packages (extra ``compile`` of this
package): ``nvidia-cuda-nvcc`` (``bin/ptxas``), ``nvidia-nvvm``
(``nvvm/libdevice/libdevice.10.bc``) and ``nvidia-cuda-nvdisasm`` (``bin/nvdisasm``),
which all unpack into one folder, ``site-packages/nvidia/cu13``. They are found through
their installed distributions' file lists, so any pip install (a venv, ``--user``,
``--target`` on ``PYTHONPATH``) is found. ``CUDA_ROOT`` (JAX's own override) or a
toolkit in ``/usr/local/cuda`` serves too.

The root found here is handed to XLA (``xla_gpu_cuda_data_dir``) and Mosaic GPU
(``MOSAIC_GPU_CUDA_ROOT``) for each compile, so the tools checked are the tools used:
XLA aborts the whole process when it cannot find libdevice, so a missing toolchain must
be caught here, with the names of the packages to install.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

# What the compile level needs from a CUDA root, and the pip package that provides it.
PTXAS = os.path.join("bin", "ptxas")
LIBDEVICE = os.path.join("nvvm", "libdevice", "libdevice.10.bc")
NVDISASM = os.path.join("bin", "nvdisasm")  # optional: SASS dumps; XLA warns without it
PIP_PACKAGES = {PTXAS: "nvidia-cuda-nvcc", LIBDEVICE: "nvidia-nvvm",
                NVDISASM: "nvidia-cuda-nvdisasm"}
REQUIRED = (PTXAS, LIBDEVICE)
PLUGIN = "jax-cuda13-plugin==0.10.2"
SYSTEM_ROOTS = ("/usr/local/cuda", "/opt/cuda")
INSTALL = "pip install 'pallas-mosaic-gpu[compile]'"


class ToolchainMissingError(RuntimeError):
    """ptxas, libdevice or the CUDA plugin cannot be found for the compile level."""


def pip_root(tool: str) -> str | None:
    """The CUDA root in which ``tool``'s pip package installed it, if it is installed."""
    try:
        files = importlib.metadata.files(PIP_PACKAGES[tool])
    except importlib.metadata.PackageNotFoundError:
        return None
    suffix = tool.replace(os.sep, "/")
    for f in files or ():
        if ("/" + f.as_posix()).endswith("/" + suffix):
            path = str(f.locate())
            if os.path.isfile(path):
                return os.path.normpath(path[: -len(suffix)])
    return None


def candidate_roots() -> list[tuple[str, str]]:
    """``(where from, CUDA root)`` in the order they are tried."""
    roots = []
    if os.environ.get("CUDA_ROOT"):
        roots.append(("CUDA_ROOT", os.environ["CUDA_ROOT"]))
    for tool in REQUIRED:
        root = pip_root(tool)
        if root and root not in [r for _, r in roots]:
            roots.append((f"pip package {PIP_PACKAGES[tool]}", root))
    roots += [("CUDA toolkit", r) for r in SYSTEM_ROOTS]
    return roots


def missing(root: str) -> list[str]:
    """The required tools ``root`` lacks (``bin/ptxas``, ``nvvm/libdevice/...``)."""
    return [t for t in REQUIRED if not os.path.isfile(os.path.join(root, t))]


def find_toolchain() -> str:
    """A CUDA root holding both ptxas and libdevice, or a ToolchainMissingError that
    says which pip packages to install."""
    roots = candidate_roots()
    for _, root in roots:
        if not missing(root):
            return root
    pip_missing = [PIP_PACKAGES[t] for t in REQUIRED if pip_root(t) is None]
    looked = "; ".join(f"{src} {root} (no {', no '.join(missing(root))})"
                       for src, root in roots)
    if pip_missing:
        need = (f"the pip package{'s' if len(pip_missing) > 1 else ''} "
                f"{' and '.join(pip_missing)} {'are' if len(pip_missing) > 1 else 'is'} "
                f"not installed")
        fix = f"`{INSTALL}` (or `pip install {' '.join(pip_missing)}`)"
    else:  # installed, but in different folders (say, one with --user)
        need = "nvidia-cuda-nvcc and nvidia-nvvm are installed in different folders"
        fix = (f"`pip install --force-reinstall {' '.join(PIP_PACKAGES[t] for t in REQUIRED)}`"
               " into one environment")
    raise ToolchainMissingError(
        "the Mosaic GPU compile level needs ptxas and libdevice (a CUDA 13 toolchain) in "
        f"one folder, and {need}. Looked in: {looked}. Install them with {fix}, or point "
        "CUDA_ROOT at a CUDA 13 toolkit.")


def check_plugin() -> None:
    """The CUDA PJRT plugin, which gives the compile-only device, is installed."""
    try:
        found = importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ImportError:
        found = False
    if not found:
        raise ToolchainMissingError(
            f"the Mosaic GPU compile level needs the CUDA plugin: `{INSTALL}` (or "
            f"`pip install {PLUGIN}`, extra `cuda` of pallas-mosaic-gpu, for lowering only)")
