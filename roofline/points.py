"""``Point``: one kernel run placed on a roofline, ``point()`` to make one from raw counts, and
``ceiling_point()`` for where a kernel could be (the roof over its intensity), not where one is.

The ``source`` field is mandatory because a chart mixes numbers of different standing:
``measured`` here and now, ``recorded`` on a real GPU earlier (shipped with the package),
``model`` computed from a spec. Readers must always be able to tell them apart.
"""

from dataclasses import dataclass
from numbers import Real
from typing import Optional

from .dtypes import dtype_name
from .model import attainable
from .registry import spec as _spec

SOURCES = ("measured", "recorded", "model")


def _positive(field, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, Real) or \
            not (value >= 0 if allow_zero else value > 0):
        raise ValueError(f"{field} must be a {'non-negative' if allow_zero else 'positive'} "
                         f"number, got {value!r}")


@dataclass(frozen=True)
class Point:
    """A rung of a ladder at one shape and dtype: where it sits and how it was obtained.

    ``rung`` is the label drawn on the chart ("ref", "v3_mfma"...); ``intensity`` is FLOP per
    byte of minimum HBM traffic; ``tflops`` is TOPS for int8.
    """

    rung: str
    op: str
    shape: str
    dtype: str
    intensity: float
    tflops: float
    ms: Optional[float]
    source: str
    gpu: str
    date: Optional[str] = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        _positive("intensity", self.intensity)
        _positive("tflops", self.tflops, allow_zero=True)
        if self.ms is not None:
            _positive("ms", self.ms)


def point(gpu, name, flops, bytes_moved, ms, dtype, source, op="", shape="",
          date=None) -> Point:
    """A ``Point`` from a FLOP count, minimum bytes moved and a time in milliseconds."""
    _positive("flops", flops)
    _positive("bytes_moved", bytes_moved)
    _positive("ms", ms)
    if not isinstance(shape, str):
        shape = "x".join(str(s) for s in shape)
    return Point(rung=name, op=op, shape=shape, dtype=dtype, intensity=flops / bytes_moved,
                 tflops=flops / (ms * 1e-3) / 1e12, ms=ms, source=source,
                 gpu=_spec(gpu).name, date=date)


CEILING = " (ceiling)"
"""The suffix of a ceiling point's name: the point is the roof, not a kernel's speed."""


def ceiling_point(gpu, name, flops, bytes_moved, dtype, op="", shape="") -> Point:
    """``name`` at the roofline's ceiling over its intensity, ``min(peak, bandwidth x
    intensity)`` (source ``model``): where a kernel of these counts could be, not where one
    is. The name gets :data:`CEILING` added so that no chart reads it as a kernel's speed;
    ``ms`` is the time at that ceiling."""
    _positive("flops", flops)
    _positive("bytes_moved", bytes_moved)
    roof = attainable(gpu, flops / bytes_moved, dtype)
    return point(gpu, name + CEILING, flops, bytes_moved, flops / (roof * 1e9), dtype, "model", op=op,
                 shape=shape)
