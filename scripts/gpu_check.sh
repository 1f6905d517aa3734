#!/usr/bin/env bash
# The GPU checks of bench/results.md ("GPU"), in one run on a machine with a GPU, from artifacts
# built on another machine by scripts/gpu_pack.sh (the GPU machine lent to a session has CUDA,
# PyTorch and pybind11 but none of nvio's Debian build dependencies). It writes four logs to
# OUT_DIR: env (the machine, the disk, `nvio report`, whether cuFile registers a file there), gtest
# (the C++ device tests), pytest (the Python tests that use CUDA) and bench (the commands and
# scripts of bench/results.md's GPU section), and cuFile's own cufile.log where it wrote one. Every
# step has its own time limit so that one hang costs that step only.
# Usage: scripts/gpu_check.sh ARTIFACTS OUT_DIR [BENCH_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
A=$(realpath "$1")
O=$2
D=${3:-/tmp/nvio-gpu-bench}
mkdir -p "$O" "$D"
export LD_LIBRARY_PATH="$A/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NVIO_CONFIG=none PYTHONUNBUFFERED=1 TMPDIR=$D
PY=${PYTHON:-python3}
NVIO=$A/bin/nvio
if [ -z "${NVIO_CUFILE_LIBRARY:-}" ]; then
  # The nvidia-cufile wheel that PyTorch's CUDA build depends on, else the toolkit's.
  cufile=$(find / -xdev \( -name 'libcufile.so.0' -o -name 'libcufile.so.1' \) 2>/dev/null | head -1)
  [ -n "$cufile" ] && export NVIO_CUFILE_LIBRARY=$cufile
fi

step() {  # step LOG LIMIT_S COMMAND...: appends the command and its output to OUT_DIR/LOG.log
  local name=$1 log=$O/$1.log limit=$2
  shift 2
  echo "== $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== rc=$rc" >>"$log"
  echo "[$name] $* -> rc=$rc"
}

step env 30 bash -c "nvidia-smi; uname -a; nproc; free -g; findmnt -T '$D'; lsblk -o NAME,SIZE,ROTA,TYPE,MODEL,MOUNTPOINT; ls -l /etc/cufile.json; grep -n compat /etc/cufile.json; echo cufile=\${NVIO_CUFILE_LIBRARY:-none}; $PY -c 'import torch,sys; print(sys.version, torch.__version__, torch.cuda.is_available(), torch.version.cuda)'"
step env 30 "$NVIO" report --dir "$D"
step gtest 120 "$A/bin/nvio_tests" '--gtest_filter=*Gpu*:*Device*:*CuFile*-*Loop*:*BlockDevice*:*CharacterDevice*'
# Whether cuFile registers a file here at all, through PyTorch's own cuFile binding (GdsFile), for
# comparison with nvio's cuFileHandleRegister.
step env 60 "$PY" -c "
import os, torch
from torch.cuda import gds
for d in ('$D', '/dev/shm'):
    p = os.path.join(d, 'gds-probe.bin')
    try:
        f = gds.GdsFile(p, os.O_CREAT | os.O_RDWR)
        t = torch.arange(1 << 20, dtype=torch.int32, device='cuda')
        f.save_storage(t.untyped_storage(), 0)
        print(d, 'torch GdsFile: registered and wrote 4 MiB')
    except Exception as e:
        print(d, 'torch GdsFile failed:', repr(e))
    finally:
        if os.path.exists(p): os.unlink(p)
"
step pytest 180 env PYTHONPATH="$A/python" "$PY" -m pytest -q -rs -p no:cacheprovider \
  tests/python/test_gpu.py tests/python/test_swapper.py tests/python/test_safetensors.py \
  tests/python/test_deepspeed_compat.py tests/python/test_deepspeed_suite.py
# NVIO_GPU_BENCH=0: the tests only (a short check when little device time is left).
if [ "${NVIO_GPU_BENCH:-1}" != 0 ]; then
  B=(--size 1G --loops 5 --verify --parallelism 8 --queue-depth 32)
  step bench 45 "$NVIO" bench --gpu --h2d-only --size 1G --loops 5 --verify
  for dir in "$D" /dev/shm/nvio-gpu-bench; do  # the disk, then RAM (tmpfs: the copies' bound)
    step bench 45 "$NVIO" bench --dir "$dir" "${B[@]}"
    step bench 45 "$NVIO" bench --dir "$dir" "${B[@]}" --gpu
    step bench 45 "$NVIO" bench --dir "$dir" "${B[@]}" --gpu --gds
  done
  step bench 45 "$NVIO" bench --dir "$D" "${B[@]}" --gpu --gds --json
  for dir in "$D" /dev/shm/nvio-gpu-bench; do
    step bench 90 env PYTHONPATH="$A/python" "$PY" bench/gpu_python_bench.py --dir "$dir"
    step bench 120 env PYTHONPATH="$A/python" "$PY" bench/gpu_load_bench.py --dir "$dir"
  done
fi
# cuFile writes its log (errors by default) to the working directory.
[ -f cufile.log ] && cp cufile.log "$O/cufile.log"

tail -n 5 "$O/gtest.log"
grep -E "passed|failed|SKIPPED|FAILED" "$O/pytest.log" | tail -n 40
if [ -f "$O/bench.log" ]; then grep -v '^{' "$O/bench.log"; fi
