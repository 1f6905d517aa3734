"""DeepSpeed ops."""
