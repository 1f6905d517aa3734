"""A stand-in for DeepSpeed (its own builders cannot build), for test_deepspeed_install.py.

It has the parts nvio.deepspeed.install() must reach, laid out and reached as DeepSpeed's are:
op builders that its op_builder package takes from the accelerator at import, an accelerator with
get_op_builder / create_op_builder, builder_names' strings, and swapper, pinned-memory and
FastPersist code that binds or calls the builders the way DeepSpeed's does. Its own builders
cannot build anything (as on a machine without a compiler), so any use of them fails loudly.
"""

from .accelerator import get_accelerator  # noqa: F401
from .ops import op_builder  # noqa: F401  (importing DeepSpeed reaches its builders)
from .runtime.swap_tensor import partitioned_param_swapper  # noqa: F401  (bound at import)

__version__ = "0.0+standin"
