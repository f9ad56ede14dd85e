#!/usr/bin/env bash
# Device run 2 of a fresh machine (parts 1 and spy staged, part 2 carried), issue 32: where
# the served step's launch goes beyond the bare step's, and whether MLX's allocator is it.
# The engine in-process under 32 closed-loop clients (bench/step_anatomy.py through pool.py:
# MLX's buffer cache and the CUDA memory pool sampled beside it): a warm-up run that builds
# the kernels; a run under py-spy --native (the engine thread's frames inside async_eval);
# the pool's release threshold at its maximum, with and without a 4 GiB cache limit; the
# default again; four clients on the warm 8,000-token shared prompt. Llama-3.1-8B, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy /tmp/stage/py_spy-*.whl >> $S 2>&1
D=docs/results/2026-11-29-gpu16
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host"
report() {
  python3 - $OUT/$1.json $OUT/$1-pool.json >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode in ("host", "sync"):
    h = d.get(mode)
    if not h:
        continue
    print(" ", mode, {k: h.get(k) for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step", "ttft_ms_p50")})
    for k, v in list(h["phases"].items())[:14]:
        print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}  {v['seconds']} s")
try:
    p = json.load(open(sys.argv[2]))
    s = p["samples"]
    print("  pool threshold", p["release_threshold"], "samples", len(s))
    for x in s[:: max(1, len(s) // 8)] + s[-1:]:
        print("   ", x)
except Exception as e:
    print("  no pool samples", e)
PY
}
sa() {  # sa NAME LIMIT ARGS... (env passes through)
  local name=$1 t=$2; shift 2
  PROBE_OUT=$OUT/$name-pool.json timeout $t python3 -P $D/pool.py "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  report $name
}
sa warm 230 $L --duration 10
SPY=12:25 SPY_OUT=$OUT/spy-served.txt sa spied 110 $L --duration 40
python3 $D/spy_summary.py $OUT/spy-served.txt Worker._loop > $OUT/spy-served-summary.txt 2>&1
head -c 200 $OUT/spy-served-summary.txt >> $S
POOL_THRESHOLD=max sa keep 80 $L --duration 30 --launch
sa default 80 $L --duration 30 --launch
POOL_THRESHOLD=max sa keep-4g 80 $L --duration 30 --launch --cache-limit-gb 4
sa prefix4 90 --model /tmp/l8b --clients 4 --prefix-len 8000 --input-len 16:48 --output-len 16 \
  --temperature 0 --duration 20 --mode host --launch
cat $S
