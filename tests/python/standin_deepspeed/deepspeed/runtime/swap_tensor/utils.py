"""Swap helpers used as DeepSpeed's are. DeepSpeed asserts; these raise AssertionError the same
way but also under python -O, so a test cannot pass by their being skipped."""

import torch

from deepspeed.runtime.swap_tensor.constants import (AIO_BLOCK_SIZE, AIO_INTRA_OP_PARALLELISM,
                                                     AIO_OVERLAP_EVENTS, AIO_QUEUE_DEPTH,
                                                     AIO_SINGLE_SUBMIT)


def check(condition, message=""):
    if not condition:
        raise AssertionError(message)


def handle_args(aio_config):
    return (aio_config[AIO_BLOCK_SIZE], aio_config[AIO_QUEUE_DEPTH], aio_config[AIO_SINGLE_SUBMIT],
            aio_config[AIO_OVERLAP_EVENTS], aio_config[AIO_INTRA_OP_PARALLELISM])


def swap_in_tensors(swap_handle, tensor_buffers, swap_paths):
    for buffer, path in zip(tensor_buffers, swap_paths):
        check(swap_handle.async_pread(buffer, path, 0) == 0)


def swap_out_tensors(swap_handle, tensor_buffers, swap_paths):
    for buffer, path in zip(tensor_buffers, swap_paths):
        check(swap_handle.async_pwrite(buffer, path, 0) == 0)


class SwapBufferPool:

    def __init__(self, buffers, aio_handle):
        check(all(aio_handle.is_pinned(buf) for buf in buffers), "swap buffers are not pinned")
        self.buffers = buffers

    def swap_out(self, aio_handle, paths):
        swap_out_tensors(aio_handle, self.buffers, paths)
        check(len(self.buffers) == aio_handle.wait())

    def swap_in(self, aio_handle, paths):
        swap_in_tensors(aio_handle, self.buffers, paths)
        check(len(self.buffers) == aio_handle.wait())


class SwapBufferManager:

    def __init__(self, num_elems, count, dtype, aio_handle):
        example = torch.zeros(1, dtype=dtype)
        self.all_buffers = [aio_handle.new_cpu_locked_tensor(num_elems, example).zero_()
                            for _ in range(count)]
