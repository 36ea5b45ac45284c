"""The reference interpreter: kernel-jaxpr evaluation and grid execution."""
