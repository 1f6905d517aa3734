"""DeepSpeed utilities."""
