#!/usr/bin/env bash
# Device run, right after g1.sh on the same machine: MLX's command buffers of 400 kernels
# (MLX_MAX_OPS_PER_BUFFER; 100 on this card by default, and `async_eval` waits once 10 are in
# flight: with graphs off a larger buffer lets the host run further ahead of the device),
# then the default again (the run-to-run noise of one machine).
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
python3 -c "import mlx.core, trio" || { echo "not installed: a fresh machine"; exit 2; }
[ -d /tmp/l8b ] || { echo "no model: a fresh machine"; exit 2; }
MLX_MAX_OPS_PER_BUFFER=400 served c32-ops400 $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
served c32-again $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
