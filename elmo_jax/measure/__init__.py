"""Measuring tools that the planner and a training run both use, below both: the analytic FLOP count
(`flops`), the reading of an optimized HLO module (`hlo_text`, `hlo`) and what it says about a step on a target
(`roofline`), and each chip's peaks (`chips`)."""
