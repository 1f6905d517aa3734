"""Optimizer-state swapping, imported on demand (after install(), in the tests): the builder is
asked of the accelerator by name, as DeepSpeed's validate_async_io does."""

from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder import builder_names
from deepspeed.runtime.swap_tensor.utils import SwapBufferManager, SwapBufferPool, handle_args


class OptimizerSwapper:

    def __init__(self, aio_config, largest_numel, count, dtype):
        builder = get_accelerator().create_op_builder(builder_names.AsyncIOBuilder)
        self.compatible = builder.is_compatible()
        self.aio_handle = builder.load(verbose=False).aio_handle(*handle_args(aio_config))
        self.manager = SwapBufferManager(largest_numel, count, dtype, self.aio_handle)

    def pool(self):
        return SwapBufferPool(self.manager.all_buffers, self.aio_handle)
