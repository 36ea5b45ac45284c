"""Implementation modules of pallas-core; the public surface is :mod:`pallas`."""
