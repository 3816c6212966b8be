"""Alpha-beta (latency-bandwidth, Hockney) cost of each collective and algorithm.

A collective that sends ``steps`` messages one after another and pushes ``volume`` bytes
through each rank's link takes ``steps·alpha + volume·beta``: alpha is the fixed cost of
one message (launch, synchronisation, wire latency), beta the seconds per byte (1 / the
rank's unidirectional bandwidth). Fitting alpha and beta to timings of a few message sizes
and plugging a datasheet bandwidth into beta is enough to say which algorithm wins where:
the ring's 2(p-1) steps lose to a tree's 2·log2(p) for small messages, its optimal
2(p-1)/p·n volume wins for large ones. The reduction's arithmetic (gamma) is left out;
it runs at memory speed, far above link speed on a GPU.

``nbytes`` is always the whole buffer of the call: the tensor of ``all_reduce``, the
input of ``reduce_scatter`` (p x output), the output of ``all_gather`` (p x input), the
input of ``all_to_all``. Assumptions, per algorithm:

- ring: p-1 steps per pass, each moving n/p; the bandwidth is the rank's, i.e. enough
  rings run over disjoint links to use all of them (RCCL/NCCL run several channels).
- tree (all_reduce only): a pipelined double binary tree; reduce up and broadcast down
  each take log2(p) steps, and each rank sends about n per phase (half in each tree).
- direct: one step; every rank sends to all p-1 peers at once over a full mesh (Infinity
  Fabric between 8 MI300X, NVSwitch); all_reduce "direct" is the one-shot form in which
  every rank receives all p-1 full buffers and reduces locally.
- two_shot (all_reduce only): a direct reduce-scatter (each rank sends the peers' n/p
  pieces, reduces its own) then a direct all-gather: 2 steps and the ring's optimal
  2(p-1)/p·n, so on a full mesh it is never slower than the ring in this model, and it
  beats one-shot above ``crossover_bytes`` (one-shot's volume grows with p-1).
- pairwise (all_to_all): p-1 steps, one peer each.
"""

import math
from dataclasses import dataclass

import numpy as np

ALGORITHMS = {
    "all_reduce": ("ring", "tree", "direct", "two_shot"),
    "reduce_scatter": ("ring", "direct"),
    "all_gather": ("ring", "direct"),
    "all_to_all": ("pairwise", "direct"),
}


@dataclass(frozen=True)
class Cost:
    """``steps`` messages in sequence, ``volume`` bytes through one rank's link."""

    steps: float
    volume: float

    def seconds(self, alpha, beta):
        return self.steps * alpha + self.volume * beta


def cost(collective, algorithm, p, nbytes) -> Cost:
    """The alpha-beta cost of one call on ``p`` ranks (see the module docstring)."""
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(ALGORITHMS)}")
    if algorithm not in ALGORITHMS[collective]:
        raise ValueError(f"{collective} has no {algorithm!r} model; known: "
                         f"{', '.join(ALGORITHMS[collective])}")
    if p < 1 or nbytes < 0:
        raise ValueError(f"need p >= 1 and nbytes >= 0, got p={p}, nbytes={nbytes}")
    if p == 1:
        return Cost(0, 0)
    share = (p - 1) / p * nbytes
    if collective == "all_reduce":
        if algorithm == "ring":
            return Cost(2 * (p - 1), 2 * share)
        if algorithm == "tree":
            return Cost(2 * math.ceil(math.log2(p)), 2 * nbytes)
        if algorithm == "two_shot":
            return Cost(2, 2 * share)
        return Cost(1, (p - 1) * nbytes)
    steps = 1 if algorithm == "direct" else p - 1
    return Cost(steps, share)


def crossover_bytes(collective, first, second, p, alpha, beta):
    """The message size at which ``first`` and ``second`` cost the same, or None if they never do.

    Steps are fixed and volume is linear in n, so the times are two lines in n: they meet
    once, at (steps difference)·alpha / (volume-per-byte difference)·beta, or never (parallel
    lines, or a meeting point at n <= 0). Below the crossover the algorithm with fewer steps
    wins, above it the one with less volume.
    """
    if alpha < 0 or beta <= 0:
        raise ValueError(f"need alpha >= 0 and beta > 0, got alpha={alpha}, beta={beta}")
    a, b = cost(collective, first, p, 1), cost(collective, second, p, 1)
    steps, volume = (a.steps - b.steps) * alpha, (b.volume - a.volume) * beta
    if volume == 0 or steps / volume <= 0:
        return None
    return steps / volume


def bytes_for_efficiency(collective, algorithm, p, alpha, beta, efficiency):
    """The smallest message whose bandwidth term is ``efficiency`` of its time.

    A bucket of n bytes spends steps·alpha on latency whatever n is; the share of its time
    spent moving bytes, volume(n)·beta / (steps·alpha + volume(n)·beta), reaches
    ``efficiency`` at n = efficiency / (1 - efficiency) · steps·alpha / (volume per byte·beta).
    This is how large an FSDP/DDP bucket must be before fusing more tensors stops paying.
    """
    if not 0 < efficiency < 1:
        raise ValueError(f"efficiency must be in (0, 1), got {efficiency}")
    if alpha < 0 or beta <= 0:
        raise ValueError(f"need alpha >= 0 and beta > 0, got alpha={alpha}, beta={beta}")
    per_byte = cost(collective, algorithm, p, 1)
    if per_byte.volume == 0:
        raise ValueError(f"{collective} on p={p} moves no bytes")
    return efficiency / (1 - efficiency) * per_byte.steps * alpha / (per_byte.volume * beta)


@dataclass(frozen=True)
class Fit:
    """Fitted alpha (s) and beta (s/byte), with the relative rms error of the fit."""

    alpha: float
    beta: float
    rel_rms: float

    @property
    def bandwidth_gbps(self):
        """1/beta in GB/s (unidirectional, per rank)."""
        return 1e-9 / self.beta


def fit(costs, seconds) -> Fit:
    """Least squares ``seconds ≈ steps·alpha + volume·beta`` over measured calls.

    Rows are scaled by 1/seconds so that a 10 µs call weighs as much as a 10 ms one
    (plain least squares would fit the largest messages only and leave alpha to noise).
    """
    t = np.asarray(seconds, dtype=float)
    if len(costs) != len(t) or len(t) < 2:
        raise ValueError("need at least two (cost, seconds) pairs of equal count")
    a = np.array([[c.steps, c.volume] for c in costs], dtype=float)
    w = 1.0 / t
    scaled = a * w[:, None]
    norms = np.linalg.norm(scaled, axis=0)  # steps ~ 10, volume ~ 1e6: equalise the columns
    norms[norms == 0] = 1.0
    solution, *_ = np.linalg.lstsq(scaled / norms, t * w, rcond=None)
    alpha, beta = solution / norms
    model = a @ np.array([alpha, beta])
    return Fit(float(alpha), float(beta), float(np.sqrt(np.mean(((model - t) / t) ** 2))))
