"""Collectives built from point-to-point sends, each beside torch.distributed's own.

``kernels.comm.all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and
``all_to_all_single`` take the arguments of their torch.distributed namesakes plus
``algorithm=`` (the rung: ``"ring"``, ``"ring_chunked"``, ``"pairwise"``, ``"direct"``,
or ``"library"``, the reference). They exist to show, measure and model what a collective
library does inside: the ring is bandwidth-optimal, pipelining hides the combine, and the
alpha-beta model (:mod:`kernels.comm.cost_model`) says when latency wins instead.
:func:`kernels.comm.launch.run_local` runs a function on p local gloo processes and
:mod:`kernels.comm.measure` times the rungs there (gloo/CPU numbers) and fits the model;
:mod:`workbench.comm.model` turns it into 8-GPU predictions, labelled "model".
:class:`EPDispatcher` is expert-parallel dispatch/combine with DeepEP's API shape, and
:func:`dispatch_layout` counts its naive and deduplicated rows from a routing alone.
"""

from .collectives import (ALL_TO_ALL_ALGORITHMS, RING_ALGORITHMS, all_gather_into_tensor,
                          all_reduce, all_to_all_single, reduce_scatter_tensor)
from .ep_dispatch import EPDispatcher, EPHandle
from .ep_layout import EPLayout, dispatch_layout

__all__ = ["ALL_TO_ALL_ALGORITHMS", "EPDispatcher", "EPHandle", "EPLayout", "RING_ALGORITHMS",
           "all_gather_into_tensor", "all_reduce", "all_to_all_single", "dispatch_layout",
           "reduce_scatter_tensor"]
