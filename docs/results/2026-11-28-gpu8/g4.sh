#!/usr/bin/env bash
# Device run (one GPU, part 1 staged in /tmp/stage, part 2 carried), issue 32: the ragged
# decode-attention kernel rewritten (16-byte loads, two keys a warp at a time for 128-wide
# heads, four times the blocks): outputs against MLX's masked attention and time, beside the
# kernel it replaces (engine/_decode_attention.py as at 4363765, copied beside this script as
# previous_decode_attention.py for the run); then, if every output
# matched, the served 32-client load with it.
set -u
t0=$(date +%s)
source docs/results/2026-11-28-gpu7/common.sh
python3 -c "import mlx.core" 2>/dev/null || bash .whl/part-2/install-mlx-cuda.sh > /tmp/install.log 2>&1
python3 -c "import mlx.core, trio" || { echo "not installed"; tail -5 /tmp/install.log; exit 2; }
timeout 240 python3 -P bench/ragged_attention.py --previous docs/results/2026-11-28-gpu8/previous_decode_attention.py \
  --target-blocks 256 512 2048 --out $OUT/ragged-attention.json > $OUT/ragged-attention.log 2>&1
echo "kernel bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - $OUT/ragged-attention.json <<'PY' || exit 3
import json, sys
d = json.load(open(sys.argv[1]))
for name, cases in d["checks"].items():
    print(name, [round(c["max_abs_error"], 5) for c in cases], all(c["ok"] for c in cases))
print(json.dumps(d["timing"], indent=0))
sys.exit(0 if d["all_ok"] else 1)
PY
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make-8b.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "model: $(( $(date +%s) - t0 )) s"
served warm 32 10 500:1000 64:192 "$T07"; echo "warm: $(( $(date +%s) - t0 )) s"
served c32-kernel2 $LOAD32 "$T07"; echo "$(( $(date +%s) - t0 )) s"
