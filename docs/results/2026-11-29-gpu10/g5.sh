#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 32, prepared and not
# yet run (this session's device time was spent): the 32-client step's launches split by the
# phase that made them (`step_anatomy.py --launch` now names each launch and wait after its
# caller), to tell whether the served step's launch time beyond the bare decode step's
# (call-3: 19.8 ms a step in `async_eval` against ~6 in the bare step) is the prefill chunks',
# the first-token forwards', or the prefix cache's stores; with prefill chunks in the decode
# step's forward (EngineConfig.pack_chunks, f3e2e8c) and without, alternating, two rounds.
set -u
source bench/device/prepare.sh
model_8b
for round in 1 2; do
  for pack in --pack-chunks --no-pack-chunks; do
    [ $round = 2 ] && pack=$( [ $pack = --pack-chunks ] && echo --no-pack-chunks || echo --pack-chunks )
    name=anatomy-$round$pack
    timeout 150 python3 -P bench/step_anatomy.py --model /tmp/l8b --clients 32 --input-len 500:1000 \
      --output-len 64:192 --temperature 0.7 --duration 40 --mode host --launch $pack \
      --out $OUT/$name.json > $OUT/$name.log 2>&1
    echo "$name: rc=$? $(elapsed)"
    python3 - $OUT/$name.json <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["host"]
print({k: h[k] for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step")})
for k, v in list(h["phases"].items())[:8]:
    print(f"  {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
PY
  done
done
