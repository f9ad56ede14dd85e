#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32 item 4, prepared
# and not yet run: why a second start still spends ~16 s of its warm-up in two phases (call-2's
# log: "a batch of 4" 7.9 s, "the fast path's other sampling" 8.0 s, with MLX's PTX cache on
# disk). If the driver compiles the cached PTX to machine code again at every start because
# its own cache (~/.nv/ComputeCache, CUDA_CACHE_MAXSIZE) is too small to keep it, a larger
# driver cache removes that time from every start after the first. Two starts each way, the
# warm-up's phases logged; the first start of each way fills its cache.
set -u
source bench/device/prepare.sh
model_8b
start() {  # start NAME [env...]: one server start, until ready; its warm-up log kept
  local name=$1; shift
  env "$@" python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 \
    > $OUT/$name.server.log 2>&1 &
  local s=$(date +%s)
  for i in $(seq 1 1600); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
  echo "$name: ready after $(( $(date +%s) - s )) s; $(grep -o 'warm-up done in [0-9.]* s' $OUT/$name.server.log)"
  grep -E "warm-up [0-9]+/" $OUT/$name.server.log | awk '{print "   ", $0}' | cut -c1-140
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
}
for n in 1 2; do start default-$n; done
for n in 1 2; do start cache4g-$n CUDA_CACHE_MAXSIZE=4294967296 CUDA_CACHE_PATH=/tmp/nv-cache; done
echo "done: $(elapsed)"
