"""Helpers of ``benchmarks/reproduce_fashion_mnist.py``: the paper's experiments in miniature.

``settings`` (what runs), ``runs`` (training through ``e2mc.training.run.run_training``),
``evaluate`` (probes, kNN, transfer, curves), ``analysis`` (aggregation and paired tests),
``report`` (``results.md``, ``results.json`` and figures).
"""
