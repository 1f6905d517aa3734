# The CPU accelerator's builders: no GDSBuilder (asking for one gives NotImplementedBuilder).
from ..async_io import AsyncIOBuilder  # noqa: F401
from ..builder import NotImplementedBuilder  # noqa: F401
from ..pin_memory import PinMemoryBuilder  # noqa: F401
from ..utils import UtilsBuilder  # noqa: F401
