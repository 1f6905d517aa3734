# Names, not classes, for get_accelerator().create_op_builder(...).
AsyncIOBuilder = "AsyncIOBuilder"
GDSBuilder = "GDSBuilder"
UtilsBuilder = "UtilsBuilder"
PinMemoryBuilder = "PinMemoryBuilder"
