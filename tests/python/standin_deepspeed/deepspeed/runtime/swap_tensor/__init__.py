"""Swapping tensors to NVMe."""
