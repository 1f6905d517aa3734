class OpBuilder:
    NAME = "op"

    def __init__(self):
        self.name = self.NAME

    def is_compatible(self, verbose=False):
        return False

    def load(self, verbose=True):
        raise RuntimeError(f"stand-in DeepSpeed: the native op '{self.name}' cannot be built here")


class NotImplementedBuilder(OpBuilder):
    NAME = "deepspeed_not_implemented"

    def load(self, verbose=True):
        raise ValueError("This op had not been implemented on this system.")
