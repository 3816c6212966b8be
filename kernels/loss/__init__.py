"""Loss functions fused into Triton passes: :func:`kernels.cross_entropy` (:mod:`.ops`), whose
kernels and launch are :mod:`.cross_entropy_kernels`."""
