#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32: the served
# 32-client load with the tiled decode-attention kernel (one kernel a layer at 32 rows),
# against mlx_lm.server in the same call: a first start builds our kernels (as a server's
# first start on a machine does), then our server (GPU busy sampled beside it), then
# mlx_lm.server on the same requests.
set -u
source bench/device/prepare.sh
source docs/results/2026-11-28-gpu7/common.sh
model_8b
served warm 32 15 500:1000 64:192 "$T07"; echo "warm: $(elapsed)"
served c32-ours $LOAD32 "$T07"; echo "ours: $(elapsed)"
timeout 200 python3 -P bench/serving.py --server mlx_lm --model /tmp/l8b --clients 32 \
  --server-concurrency 32 --duration 40 --warmup 8 --mix temperature --temperature 0.7 \
  --input-len 500:1000 --output-len 64:192 --ignore-eos --out $OUT/c32-mlx_lm.json \
  > $OUT/c32-mlx_lm.log 2>&1
echo "mlx_lm: rc=$? $(elapsed)"
grep -E "^\| " $OUT/c32-mlx_lm.log | head -4
python3 - $OUT/c32-ours.json $OUT/c32-mlx_lm.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, e); continue
    for r in d.get("results", [d]):
        print(f.split("/")[-1], {k: r.get(k) for k in ("completed", "failed", "output_tok_s", "ttft_ms", "tpot_ms") if k in r})
PY
