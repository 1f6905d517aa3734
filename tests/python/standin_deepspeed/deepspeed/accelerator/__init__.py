from .real_accelerator import get_accelerator, set_accelerator  # noqa: F401
