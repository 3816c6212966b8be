"""An attention run on each sequence of a packed batch: what varlen must be, for its tests and the attention fuzz."""
from __future__ import annotations

import torch


def per_sequence(attention, q, k, v, cu_q, cu_k):
    """``attention`` on each sequence's (1, H, S_i, D) view, packed back: what varlen must be."""
    bq, bk = cu_q.tolist(), cu_k.tolist()
    outs = []
    for q0, q1, k0, k1 in zip(bq[:-1], bq[1:], bk[:-1], bk[1:]):
        if q1 > q0:
            views = (t[a:z].transpose(0, 1)[None] for t, a, z in ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
            outs.append(attention(*views)[0].transpose(0, 1))
    return torch.cat(outs)
