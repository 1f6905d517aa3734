"""FastPersist."""
