"""Normalization layers as fused Triton ops: :func:`kernels.rms_norm` and
:func:`kernels.add_rms_norm` (:mod:`.ops`), whose kernels and launch settings are
:mod:`.rms_norm_kernels`'."""
