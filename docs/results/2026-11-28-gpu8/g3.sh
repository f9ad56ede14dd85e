#!/usr/bin/env bash
# Device run (one GPU, part 1 staged in /tmp/stage, part 2 carried), issue 32: where a busy
# step's time goes now, the engine in-process under the 32-client load: the engine thread's
# Python per phase, MLX's launching ("launch") and its waits for the device ("wait") apart,
# beside the device's busy share over the same run (CUPTI through torch.profiler).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; tail -5 /tmp/install.log; exit 2; }
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
timeout 400 python3 -P bench/step_anatomy.py --model /tmp/l8b --clients 32 --input-len 500:1000 \
  --output-len 64:192 --duration 40 --mode host --launch --kernels --out $OUT/anatomy-launch.json > $OUT/anatomy-launch.log 2>&1
echo "anatomy rc=$? $(( $(date +%s) - t0 )) s"
python3 - $OUT/anatomy-launch.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))["host"]
print({k:d[k] for k in ("tok_per_s","steps","ms_per_step")})
for k,v in d["phases"].items(): print(f"  {k:8s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
k=d["kernels"]; print("GPU busy", k.get("busy_share"), "kernels", k.get("kernels"), "window", k.get("window_s"))
for t in k.get("top", [])[:12]: print("  ", t)
PY
