#!/usr/bin/env bash
# Compiles the installed DeepSpeed's async_io, pin_memory and shared-memory comm ops
# (DS_ACCELERATOR=cpu; async_io against libaio-dev) once into the project environment, .venv/torch_extensions, so that the tests that
# run the real DeepSpeed find them built (tests/python/_ds_real.py says where; those tests skip
# with the reason when they are not). A stamp in .venv names the DeepSpeed and torch versions
# built for: nothing is compiled again until one of them changes. Minutes cold on two cores. Run
# by scripts/test.sh after venv.sh; an environment without DeepSpeed is left alone.
# Usage: scripts/deepspeed_ops.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_JOBS=${MAX_JOBS:-$(nproc)} "${1:-.venv/bin/python}" tests/python/_ds_real.py --build
