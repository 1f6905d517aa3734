import abc


class DeepSpeedAccelerator(abc.ABC):

    @abc.abstractmethod
    def get_op_builder(self, class_name):
        ...

    @abc.abstractmethod
    def create_op_builder(self, class_name):
        ...

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def pin_memory(self, tensor, align_bytes=1):
        return tensor  # the CPU accelerator's: nothing to pin for

    def device_name(self, device_index=None):
        return "cpu"
