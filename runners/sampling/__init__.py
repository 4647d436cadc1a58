"""Sampling's one home: per-row parameters, seeds, the draw (PyTorch and the fused CUDA kernel)."""
