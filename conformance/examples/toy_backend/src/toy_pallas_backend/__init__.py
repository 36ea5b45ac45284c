"""An example third-party Pallas backend (see README.md)."""

__version__ = "0.1.0"
