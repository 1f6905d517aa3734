"""nvio.safetensors: the safetensors format through nvio, a package shaped like the reference
library (``safetensors``), so that code switches with an import change:

- ``nvio.safetensors.torch``: ``save_file``, ``load_file``, ``save``, ``load``, ``safe_open``, as
  ``safetensors.torch``;
- ``nvio.safetensors.numpy``: the same for numpy arrays, as ``safetensors.numpy``;
- ``nvio.safetensors.safe_open`` (frameworks "pt" and "np") and ``SafetensorError``, as the
  reference's top level;
- ``nvio.safetensors.load_model_folder``: a Hugging Face model folder (one file, or a sharded one
  with ``model.safetensors.index.json``) as one state dict, every shard read in one batch.

``from nvio.safetensors import load_file, save_file, load, save`` keeps working: they are the torch
module's. The header is parsed and validated once, by the C++ core (include/nvio/safetensors.hpp):
a malformed file raises ``nvio.FormatError`` (also a ``ValueError``; ``SafetensorError`` here)
naming the file and the problem. Neither torch nor numpy is imported until used.
"""

from __future__ import annotations

from . import numpy, torch  # noqa: F401  (the framework modules, as the reference has them)
from ._common import SafetensorError, safe_open
from ._folder import load_model_folder
from .torch import load, load_file, save, save_file

__all__ = ["load_file", "save_file", "load", "save", "safe_open", "SafetensorError",
           "load_model_folder", "torch", "numpy"]
