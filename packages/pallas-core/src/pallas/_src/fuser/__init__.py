"""The internals of :mod:`pallas.fuser`: block-spec propagation, fusion and its rules."""
