"""The real TPU compiler (libtpu) for a deviceless TPU: ``pallas_tpu.compile`` and the
``compile`` conformance level of the TPU backends.

``chips`` names the chips, ``export`` packs one kernel as a ``jax.export`` artifact,
``worker`` is the child process that compiles it with libtpu, ``client`` talks to that
child, ``results`` reads what the compiler produced (VMEM, the LLO's op mix).
"""
