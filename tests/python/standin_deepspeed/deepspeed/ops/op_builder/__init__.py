"""As DeepSpeed's: each builder name a builder module defines becomes the class the accelerator
returns for it, set here at import."""

import importlib
import os
import pkgutil
import sys

from deepspeed.accelerator import get_accelerator

_this = sys.modules[__name__]
for _, _module_name, _ in pkgutil.iter_modules([os.path.dirname(__file__)]):
    if _module_name in ("builder", "builder_names", "cpu"):
        continue
    _module = importlib.import_module(f".{_module_name}", package=__name__)
    for _member in dir(_module):
        if _member.endswith("Builder") and _member != "OpBuilder":
            _this.__dict__[_member] = get_accelerator().get_op_builder(_member)
