"""Unit roundoff per float dtype: the tests that bound errors in roundings count in it."""
from __future__ import annotations

import torch

UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}   # rounding's
