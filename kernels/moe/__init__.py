"""Mixture of experts: the grouped GEMM ladder (:mod:`.grouped_gemm`, the public
``kernels.grouped_gemm``) and the pieces of an MoE layer built on it."""
