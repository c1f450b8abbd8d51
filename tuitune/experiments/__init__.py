"""Experiments that drive sessions: A/B, sweeps and grids, crossover, tune, record, nccl-bench, and
the observations (captures, live servers) the advisor is fed with."""
