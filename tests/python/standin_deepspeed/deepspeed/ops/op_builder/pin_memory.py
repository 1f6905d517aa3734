from .builder import OpBuilder


class PinMemoryBuilder(OpBuilder):
    NAME = "pin_memory"
