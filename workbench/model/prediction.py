"""A modelled time for one rung at one shape, labelled as a model wherever it is printed."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prediction:
    """What the model says, and everything it was told.

    ``breakdown`` holds the time each resource would take alone over the whole launch
    (seconds); ``bound`` names the one that sets the time. ``inputs`` maps each input
    and assumption to ``(value, source)``: a spec field, a source tag of
    ``machine.yaml``, the compiled kernel, or ``"assumption"``.
    """

    op: str
    rung: str
    shape: tuple[int, ...]
    dtype: str
    gpu: str
    time_s: float
    tflops: float
    bound: str
    breakdown: dict[str, float] = field(repr=False)
    inputs: dict[str, tuple] = field(repr=False)
    label: str = "model"

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape))
        return (f"Prediction[{self.label}]({self.op} {self.rung} {shape} {self.dtype} on {self.gpu}: "
                f"{self.time_s * 1e3:.4g} ms, {self.tflops:.4g} TFLOP/s, {self.bound} bound)")

    def row(self) -> dict:
        """One table row; the label is a column, so no table shows the time without it."""
        return {"label": self.label, "op": self.op, "rung": self.rung,
                "shape": "x".join(map(str, self.shape)), "dtype": self.dtype, "gpu": self.gpu,
                "ms": round(self.time_s * 1e3, 4), "TFLOP/s": round(self.tflops, 1), "bound": self.bound}

    def table(self) -> list[dict]:
        """The breakdown, resource by resource, then the inputs with their sources."""
        rows = [{"label": self.label, "item": name, "value": f"{seconds * 1e3:.4g} ms",
                 "source": "model"} for name, seconds in self.breakdown.items()]
        rows += [{"label": self.label, "item": name, "value": value, "source": source}
                 for name, (value, source) in self.inputs.items()]
        return rows


class NotCovered(NotImplementedError):
    """The model has no prediction for this request (op, rung, GPU, dtype or shape): the one
    error a caller treats as "no model". The message says what is covered."""
