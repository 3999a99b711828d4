"""Measurements: scaling benchmarks, the link's all-reduce against the ring model, stragglers,
the course's reference results."""
