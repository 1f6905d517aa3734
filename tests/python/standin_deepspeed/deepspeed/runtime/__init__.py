"""DeepSpeed runtime."""
