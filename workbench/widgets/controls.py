"""Pickers every widget shares, filled from the rung registry and the op spec.

Ops, rungs, dtypes and shape presets are read from :mod:`kernels.registry` each time an
op is chosen, so a new rung or preset appears in every widget without touching this code.
"""
from __future__ import annotations

import ipywidgets as w
import torch

import kernels

from ..harness.table import dtype_label

# Largest dimension a correctness check runs at. The interpreter costs ~0.7 ms per program
# instance; on a GPU the float64 reference, computed on the CPU, is the slow part.
CHECK_CAP = {"interpreter": 64, "gpu": 1024}


def to_dtype(value) -> torch.dtype:
    """A torch dtype from a dtype or its name ("bfloat16", "torch.float16")."""
    if isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).replace("torch.", ""), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {value!r}")
    return found


def check_shape(shape: tuple) -> tuple[tuple, str | None]:
    """The shape a correctness check runs at here, and a note when it had to shrink."""
    here = "interpreter" if kernels.backend.current().is_interpreter else "gpu"
    cap = CHECK_CAP[here]
    small = tuple(min(d, cap) for d in shape)
    if small == tuple(shape):
        return small, None
    why = ("the CPU interpreter is slow" if here == "interpreter"
           else "the float64 reference runs on the CPU")
    return small, (f"correctness checked at {'x'.join(map(str, small))}, not "
                   f"{'x'.join(map(str, shape))}: each dimension is capped at {cap} ({why})")


def op_picker(op: str) -> w.Dropdown:
    return w.Dropdown(options=list(kernels.ops()), value=op, description="op")


def dtype_picker(op: str) -> w.Dropdown:
    return w.Dropdown(options=dtype_options(op), description="dtype")


def dtype_options(op: str) -> list[str]:
    return [dtype_label(d) for d in kernels.spec(op).dtypes]


def rung_options(op: str, keep=lambda rung: True) -> list[tuple[str, object]]:
    """(title, rung) pairs in ladder order; the value is the Rung itself."""
    return [(r.title, r) for r in kernels.variants(op) if keep(r)]


def resolve_rung(op: str, which):
    """A Rung from a Rung, a number, a label ("v2") or a name."""
    return which if isinstance(which, kernels.registry.Rung) else kernels.get(op, which)


def choose_rung(picker: w.Dropdown, op: str, which) -> None:
    """Select ``which`` in ``picker``, adding it first when it is a hand-made Rung."""
    rung = resolve_rung(op, which)
    if rung not in [value for _, value in picker.options]:
        picker.options = [*picker.options, (f"{rung.title} (custom)", rung)]
    picker.value = rung


class ShapePicker:
    """A preset dropdown (the op's benchmark shapes) and one slider per dimension.

    The sliders hold the shape; the preset follows them, showing "custom" when the
    sliders match no preset, so either control can be used and they never disagree.
    """

    CUSTOM = "custom"

    def __init__(self, op: str, shape: tuple | None = None):
        self.preset = w.Dropdown(description="preset")
        self.sliders: list[w.IntSlider] = []
        self.box = w.VBox()
        self._syncing = False
        self.preset.observe(self._preset_changed, "value")
        self.load(op, shape)

    def load(self, op: str, shape: tuple | None = None) -> None:
        spec = kernels.spec(op)
        self._presets = dict(spec.bench_shapes)
        shapes = [*self._presets.values(), *spec.smoke_shapes]
        top = max(max(s) for s in shapes)
        # A dimension's floor is the least any listed shape uses: 1 for sizes, 0 for a flag
        # such as attention's causal.
        self.sliders = [w.IntSlider(min=min(1, *(s[i] for s in shapes)), max=top, description=name,
                                    continuous_update=False)
                        for i, name in enumerate(spec.shape_names)]
        for slider in self.sliders:
            slider.observe(self._slider_changed, "value")
        self._syncing = True
        self.preset.options = [self.CUSTOM, *self._presets]
        self._syncing = False
        self.box.children = [self.preset, *self.sliders]
        self.set(shape or spec.smoke_shapes[1 % len(spec.smoke_shapes)])

    @property
    def value(self) -> tuple:
        return tuple(s.value for s in self.sliders)

    def set(self, shape) -> None:
        """Set the shape from a tuple or a preset name."""
        shape = self._presets[shape] if isinstance(shape, str) else tuple(shape)
        if len(shape) != len(self.sliders):
            names = ", ".join(s.description for s in self.sliders)
            raise ValueError(f"shape {shape} needs {len(self.sliders)} dimensions ({names})")
        for dim, slider in zip(shape, self.sliders):
            if not slider.min <= dim <= slider.max:
                raise ValueError(f"{slider.description}={dim} is outside "
                                 f"{slider.min}..{slider.max}")
        self._syncing = True
        for dim, slider in zip(shape, self.sliders):
            slider.value = dim
        self._syncing = False
        self._slider_changed()

    def _slider_changed(self, _change=None) -> None:
        if self._syncing:
            return
        named = [name for name, s in self._presets.items() if s == self.value]
        self._syncing = True
        self.preset.value = named[0] if named else self.CUSTOM
        self._syncing = False

    def _preset_changed(self, change) -> None:
        if not self._syncing and change["new"] != self.CUSTOM:
            self.set(self._presets[change["new"]])
