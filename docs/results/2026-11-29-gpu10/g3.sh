#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32: where the
# engine thread's step goes now under the 32-client load (the tiled kernel in service), the
# engine in-process (`bench/step_anatomy.py --mode host --launch`, no profiler: it slows the
# step), to point the next lever at the largest phase.
set -u
source bench/device/prepare.sh
model_8b
timeout 300 python3 -P bench/step_anatomy.py --model /tmp/l8b --clients 32 --input-len 500:1000 \
  --output-len 64:192 --temperature 0.7 --duration 40 --mode host --launch \
  --out $OUT/anatomy-host.json > $OUT/anatomy-host.log 2>&1
echo "anatomy: rc=$? $(elapsed)"
python3 - $OUT/anatomy-host.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d.get("host", d)
print({k: h[k] for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step") if k in h})
for k, v in h.get("phases", {}).items():
    print(f"  {k:10s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
PY
