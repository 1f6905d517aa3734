import importlib
import inspect

from .abstract_accelerator import DeepSpeedAccelerator


class CPU_Accelerator(DeepSpeedAccelerator):
    """Looks builders up by class name in its builder package, as DeepSpeed's accelerators do;
    a name the package lacks gives NotImplementedBuilder."""

    def __init__(self):
        self.class_dict = None

    def op_builder_dir(self):
        return "deepspeed.ops.op_builder.cpu"

    def _lazy_init_class_dict(self):
        if self.class_dict is None:
            package = importlib.import_module(self.op_builder_dir())
            self.class_dict = dict(inspect.getmembers(package, inspect.isclass))

    def get_op_builder(self, class_name):
        self._lazy_init_class_dict()
        return self.class_dict.get(class_name, self.class_dict["NotImplementedBuilder"])

    def create_op_builder(self, class_name):
        self._lazy_init_class_dict()  # some accelerators read their table here directly
        builder = self.class_dict.get(class_name, self.class_dict["NotImplementedBuilder"])
        return builder()
