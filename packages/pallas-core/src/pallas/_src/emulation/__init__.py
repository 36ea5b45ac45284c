"""Emulated devices: a CPU host running kernels as a TPU or GPU would (see ``device``
for the device and ``call`` for how a ``pallas_call`` runs on it)."""
