#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried), issue 32: why four clients
# on one warm ~8,000-token shared prompt waited 8x one client's time to its first token on an
# H200 (238 against 25 ms; 3x on the CPU). The engine in-process (bench/step_anatomy.py
# --prefix-len 8000: every prompt starts with the same 8,000 tokens, cached before measuring),
# 16-48 tokens of its own, 16 out, greedy: four clients with MLX's launches and waits timed
# apart (host), then synchronized around each phase (sync: each phase's device time), then
# one client. Llama-3.1-8B shapes, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
sp() {  # sp NAME CLIENTS DURATION MODE
  timeout $(( $3 + 200 )) python3 -P bench/step_anatomy.py --model /tmp/l8b --clients $2 \
    --prefix-len 8000 --input-len 16:48 --output-len 16 --temperature 0 --duration $3 \
    --mode $4 --launch --out $OUT/$1.json > /tmp/$1.log 2>&1
  echo "$1 ($2 clients, $4): rc=$? $(elapsed)" >> $S
  python3 - $OUT/$1.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode in ("host", "sync"):
    h = d.get(mode)
    if not h:
        continue
    print(" ", mode, {k: h.get(k) for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step", "ttft_ms_p50")})
    for k, v in list(h["phases"].items())[:12]:
        print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}  {v['seconds']} s")
PY
}
sp warm4 4 8 host
sp p4 4 20 host
sp p4s 4 20 sync
sp p1 1 15 host
cat $S
