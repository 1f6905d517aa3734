"""ZeRO-3 parameter swapping (ZeRO-Infinity, ZeRO-Inference): the builder bound at import."""

import torch

from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder import AsyncIOBuilder, GDSBuilder
from deepspeed.runtime.swap_tensor.constants import AIO_USE_GDS
from deepspeed.runtime.swap_tensor.utils import check, handle_args, swap_in_tensors, swap_out_tensors


class AsyncPartitionedParameterSwapper:

    def __init__(self, aio_config, numel, count, dtype):
        if aio_config[AIO_USE_GDS]:
            self.aio_handle = GDSBuilder().load(verbose=False).gds_handle
        else:
            self.aio_handle = AsyncIOBuilder().load(verbose=False).aio_handle
        self.aio_read_handle = self.aio_handle(*handle_args(aio_config))
        self.aio_write_handle = self.aio_handle(*handle_args(aio_config))
        self.numel = numel
        self.buffers = get_accelerator().pin_memory(torch.empty(numel * count, dtype=dtype),
                                                    align_bytes=0)
        self.pending_writes = 0
        self.pending_reads = 0

    def buffer(self, index):
        return self.buffers.narrow(0, index * self.numel, self.numel)

    def swap_out(self, indices, paths):
        swap_out_tensors(self.aio_write_handle, [self.buffer(i) for i in indices], paths)
        self.pending_writes += len(indices)

    def synchronize_writes(self):
        check(self.pending_writes == self.aio_write_handle.wait())
        self.pending_writes = 0

    def swap_in(self, indices, paths):
        swap_in_tensors(self.aio_read_handle, [self.buffer(i) for i in indices], paths)
        self.pending_reads += len(indices)

    def synchronize_reads(self):
        check(self.pending_reads == self.aio_read_handle.wait())
        self.pending_reads = 0
