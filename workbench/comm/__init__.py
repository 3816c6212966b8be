"""Collectives: one bench for gloo ranks and GPUs (``workbench comm``, :mod:`.bench`), the
alpha-beta model's 8-GPU predictions (:mod:`.model`), the expert-parallel layer's chunked
pipeline on local ranks (:mod:`.ep_overlap`).

May import: kernels, roofline, workbench.harness. Never views, learn, train, widgets.
"""
