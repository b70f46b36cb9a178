#!/usr/bin/env bash
# Check the node agent's real NVML path on this machine: one GPU discovery and one sampling round,
# printed as JSON (exit 0), or {"error": ...} with exit 2 when no NVIDIA driver/GPU is usable.
# Works from a fresh checkout: uses .venv when present, else creates it with `make install`.
# Extra arguments go to `python -m tfagent.gpu_check` (e.g. --fake-gpus H100:2 to check the script itself).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import tfagent, pynvml" 2>/dev/null; then
  echo "gpu-check: setting up .venv (make install)..." >&2
  make install >&2
fi
exec .venv/bin/python -m tfagent.gpu_check "$@"
