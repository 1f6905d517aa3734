from .builder import OpBuilder


class UtilsBuilder(OpBuilder):
    NAME = "utils"
