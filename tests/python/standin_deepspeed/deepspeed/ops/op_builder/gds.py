from .async_io import AsyncIOBuilder


class GDSBuilder(AsyncIOBuilder):
    NAME = "gds"
