"""The roofline model: attainable TFLOP/s = min(compute peak, bandwidth x intensity).

Units make the formula free of constants: TB/s x FLOP/byte = TFLOP/s. ``intensity`` is
either one number (FLOP per byte moved at ``level``) or a mapping level -> intensity for a
hierarchical roofline, where each cache level has its own traffic and so its own roof.
Every result of this module is a model number, never a measurement.
"""

from collections.abc import Mapping
from numbers import Real

from .registry import spec as _spec


def _intensities(intensity, level):
    items = intensity.items() if isinstance(intensity, Mapping) else [(level, intensity)]
    for lvl, value in items:
        if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
            raise ValueError(f"intensity at {lvl!r} must be a positive number of FLOP/byte, "
                             f"got {value!r}")
    return items


def roofs(gpu, intensity, dtype, level="hbm") -> dict:
    """Every roof at this intensity: ``"compute"`` first, then one per memory level."""
    gpu = _spec(gpu)
    out = {"compute": gpu.peak(dtype)}
    for lvl, value in _intensities(intensity, level):
        out[lvl] = gpu.bandwidth(lvl) * value
    return out


def attainable(gpu, intensity, dtype, level="hbm") -> float:
    """Model ceiling in TFLOP/s (TOPS for int8) for a kernel of this intensity."""
    return min(roofs(gpu, intensity, dtype, level).values())


def bound(gpu, intensity, dtype, level="hbm") -> str:
    """Name of the lowest roof: ``"compute"`` or a memory level. At the ridge: compute."""
    found = roofs(gpu, intensity, dtype, level)
    return min(found, key=found.get)


def percent_of_roof(gpu, intensity, dtype, measured_tflops, level="hbm") -> float:
    """How much of the model ceiling a measured kernel reaches, in percent."""
    if isinstance(measured_tflops, bool) or not isinstance(measured_tflops, Real) \
            or measured_tflops < 0:
        raise ValueError(f"measured_tflops must be a number >= 0, got {measured_tflops!r}")
    return 100.0 * measured_tflops / attainable(gpu, intensity, dtype, level)
