from .builder import OpBuilder


class AsyncIOBuilder(OpBuilder):
    NAME = "async_io"
