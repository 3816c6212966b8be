"""What the notebooks show: one rung's page (:mod:`.rung`), kernel source and diffs
(:mod:`.source`), MoE, collective and matrix-core views, causal attention's launch order.

Plain HTML, tables and charts (:mod:`.render`, :mod:`.heatmap`): no ipywidgets. May import:
kernels, roofline, workbench.harness, .isa, .model, .comm. Never train, learn, widgets.
"""
