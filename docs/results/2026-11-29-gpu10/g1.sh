#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32: the ragged
# decode-attention kernel rewritten as tiles (a lane a key for the scores, 16-byte loads, the
# softmax updated once a tile of 32 keys; one kernel where a row is one slice) against the
# kernel it replaces (previous_decode_attention.py here, as at 56d5923): outputs against MLX's
# masked attention, wall time and the device's own time per step (CUPTI), at 8 and 32 rows,
# ~512 and 500-1,200 keys a row; then the engine's decode step against mlx-lm's at 32 rows.
set -u
source bench/device/prepare.sh
dir=docs/results/2026-11-29-gpu10
timeout 200 python3 -P bench/ragged_attention.py --previous $dir/previous_decode_attention.py \
  --target-blocks 128 528 1056 --kernels --rows 8 32 --out $OUT/ragged-attention.json \
  > $OUT/ragged-attention.log 2>&1
echo "kernel bench: rc=$? $(elapsed)"
python3 - $OUT/ragged-attention.json <<'PY' || exit 3
import json, sys
d = json.load(open(sys.argv[1]))
for name, cases in d["checks"].items():
    print(name, [round(c["max_abs_error"], 5) for c in cases], all(c["ok"] for c in cases))
for t in [d["timing"], *d["more_timing"]]:
    print(t["rows"], "rows", t["lengths"], {k: v for k, v in t.items() if k.endswith(("_ms_per_step", "_tb_per_s"))})
sys.exit(0 if d["all_ok"] else 1)
PY
model_8b
for ctx in 480:540 500:1000; do
  timeout 170 python3 -P bench/batch_step.py --model /tmp/l8b --rows 32 --context $ctx \
    --steps 32 --kernels --out $OUT/batch-step-32-${ctx/:/-}.json > $OUT/batch-step-32-${ctx/:/-}.log 2>&1
  echo "batch step 32 rows, $ctx: rc=$? $(elapsed)"
  python3 - $OUT/batch-step-32-${ctx/:/-}.json <<'PY'
import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    k=r.get("kernels",{})
    print(r["variant"], {x: r[x] for x in r if x.endswith("per_step")}, r["tok_per_s"], "tok/s; kernels", k.get("kernels_per_step"), "busy", k.get("busy_ms_per_step"), "ms")
    for f in k.get("by_family", [])[:8]: print("   ", f)
PY
done
