#!/usr/bin/env bash
# Makes or updates the project virtual environment .venv (Debian's Python 3.11, isolated from its
# system packages) with the pinned packages of requirements.txt. Idempotent: pip runs only when
# requirements.txt changed since the environment was last brought in step (its hash is kept in
# .venv/.nvio-requirements). Run by quickstart.sh and test.sh after deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
stamp=$venv/.nvio-requirements
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  echo "nvio: making the virtual environment $venv (/usr/bin/python3)" >&2
  /usr/bin/python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "nvio: installing the pinned Python packages of requirements.txt into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" >"$stamp"
fi
