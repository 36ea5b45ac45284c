"""Autotuning of Pallas kernels: configs timed or modelled, winners cached (``pallas.tuning``)."""
