"""Collective times on 8-GPU nodes predicted by the alpha-beta model from datasheet fabrics.

It lives in workbench because it joins the two sides: the cost formulas of
:mod:`kernels.comm.cost_model` and the interconnect numbers of the roofline specs (kernels
does not import roofline). Every row is labelled ``model``: it is arithmetic on datasheet
peaks, not a measurement.

Bandwidth: the datasheets quote bidirectional GB/s per GPU (``interconnect.total_gbps``);
a rank sends at half of that. By default all links carry traffic (RCCL/NCCL run several
rings or a mesh); ``links_used=1`` shows a single ring on a point-to-point mesh such as
8x MI300X, where one ring reaches only one of the 7 Infinity Fabric links per direction.
Latency: no spec gives alpha, so it is 0 unless the caller passes one (for instance
fitted on a real node) and the row says which; with alpha 0 the time is the bandwidth
bound, a lower limit.
"""

import roofline
from kernels.comm.cost_model import ALGORITHMS, cost

NODES = ("MI300X", "H200 SXM")


def send_gbps(spec, links_used=None):
    """One rank's unidirectional GB/s over ``links_used`` links (all links by default)."""
    fabric = spec.interconnect
    if "total_gbps" not in fabric:
        raise ValueError(f"{spec.name} has no interconnect bandwidth in its spec")
    if links_used is None:
        return fabric["total_gbps"] / 2
    if "link_gbps" not in fabric:
        raise ValueError(f"{spec.name}'s spec has no per-link bandwidth")
    if not 1 <= links_used <= fabric.get("links", links_used):
        raise ValueError(f"links_used must be 1..{fabric['links']}, got {links_used}")
    return links_used * fabric["link_gbps"] / 2


def predict(gpu, collective, algorithm, nbytes, p=8, alpha=0.0, links_used=None):
    """One model row for ``p`` GPUs of type ``gpu`` (a roofline spec name or alias)."""
    spec = roofline.spec(gpu)
    gbps = send_gbps(spec, links_used)
    c = cost(collective, algorithm, p, nbytes)
    seconds = c.seconds(alpha, 1.0 / (gbps * 1e9))
    return dict(label="model", gpu=spec.name, ranks=p, collective=collective,
                algorithm=algorithm, bytes=nbytes, seconds=seconds,
                send_gbps=gbps, links_used=links_used or spec.interconnect.get("links"),
                alpha_s=alpha, latency="given" if alpha else "not modelled (bandwidth bound)")


def prediction_table(sizes, gpus=NODES, p=8, alpha=0.0):
    """Rows for every collective and algorithm, GPU and size: the chart/table input."""
    return [predict(gpu, coll, alg, n, p=p, alpha=alpha)
            for gpu in gpus for coll, algs in ALGORITHMS.items() for alg in algs
            for n in sizes]
