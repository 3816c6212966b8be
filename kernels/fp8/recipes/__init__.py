"""One file per FP8 training recipe, imported here in ladder order; each registers itself
in :mod:`kernels.fp8.recipe` (at import, so that ``torch.compile`` never meets an import)."""
from . import tensorwise, delayed, rowwise, blockwise, mxfp8  # noqa: F401
