"""DS_PIN_MEMORY_BACKEND=native: host pinning through the pin_memory op's handle."""

import weakref


class NativePinnedMemory:

    def __init__(self):
        from deepspeed.ops.op_builder import PinMemoryBuilder

        self._handle = PinMemoryBuilder().load().pin_handle()
        self._ranges = {}
        self.freed = []

    def pin(self, tensor):
        base = self._handle.new_cpu_locked_tensor(tensor.numel(), tensor)
        begin = base.data_ptr()
        locked = base[:tensor.numel()].view(tensor.shape)
        locked.copy_(tensor)
        self._ranges[begin] = begin + tensor.numel() * tensor.element_size()
        weakref.finalize(base, self._release, begin)
        return locked

    def _release(self, begin):
        self._ranges.pop(begin, None)
        self.freed.append(self._handle.free_cpu_locked_tensor_by_ptr(begin))

    def is_pinned(self, tensor):
        return self._handle.is_pinned(tensor)
