"""The harness every rung goes through: correctness, timing, benchmarks, result rows.

``check`` (a rung against its float64 reference, ``tolerances`` its numbers,
``error_pattern`` what a wrong output's errors say), ``timing`` (device events), ``bench``
and ``suite`` (rungs against the library baseline), ``results`` (tidy rows, recorded GPU
rows), ``ceilings`` (measured roofs), ``environment`` (what a result was measured with),
``table`` (plain-text and HTML tables), ``kernel_file`` (a kernel file someone wrote,
imported as rungs), ``host_overhead`` (with ``device_ops``, what a call launches), ``counters``,
``fp8_accuracy``.

May import: kernels, roofline. Nothing else of workbench: every other package stands on this one.
"""
