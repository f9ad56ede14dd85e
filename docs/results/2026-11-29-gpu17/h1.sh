#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; part 2 and .whl/spy carried), issue 32.
# Where the served decode step's launch goes (13.7-14.3 ms a step at 32 clients in-process
# against 5.1-6.4 for the bare step, gpu16/call-7): py-spy --native --idle on the engine
# in-process under 32 closed-loop clients, with the GPU's busy share sampled beside each run;
# then MLX_MAX_OPS_PER_BUFFER=1000 against the default (100 kernels a command buffer on
# sm90; MLX waits inside async_eval while more than 10 buffers are in flight), alternating;
# then the bare step under py-spy. Llama-3.1-8B, bf16. a-summary.txt first, the rest archived.
set -u
mkdir -p /tmp/stage && cp .whl/spy/* /tmp/stage/ 2>/dev/null
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy /tmp/stage/py_spy-*.whl >> $S 2>&1
D=docs/results/2026-11-29-gpu16
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch"
mkdir -p /tmp/j
report() {
  python3 - /tmp/j/$1.json /tmp/j/$1.gpu.txt >> $S 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d["host"]
print(" ", {k: h.get(k) for k in ("requests", "tokens", "tok_per_s", "steps", "ms_per_step", "ttft_ms_p50")})
for k, v in list(h["phases"].items())[:9]:
    print(f"    {k:18s} {v['ms_per_step']:7.2f} ms/step  calls {v['calls']}")
v = [float(l.split()[1]) for l in open(sys.argv[2]) if len(l.split()) == 2]
mid = v[len(v) // 5 : len(v) * 4 // 5] or v
print(f"   GPU busy: mean {sum(mid) / max(1, len(mid)):.0f}% over the middle 60% of {len(v)} samples")
PY
}
sa() {  # sa NAME LIMIT ARGS... (environment passes through)
  local name=$1 t=$2; shift 2
  ( python3 -u -c "
import subprocess,time
t=time.time()
p=subprocess.Popen(['nvidia-smi','--query-gpu=utilization.gpu','--format=csv,noheader,nounits','-lms','500'],stdout=subprocess.PIPE,text=True)
for line in p.stdout: print(round(time.time()-t,1), line.strip(), flush=True)
" > /tmp/j/$name.gpu.txt ) & local gp=$!
  PROBE_OUT=/tmp/j/$name-pool.json timeout $t python3 -P $D/pool.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  kill $gp 2>/dev/null; pkill nvidia-smi
  report $name
}
sa warm 240 $L --duration 10
SPY=15:25 SPY_OUT=/tmp/j/spy-served.txt sa served 130 $L --duration 40
python3 $D/spy_summary.py /tmp/j/spy-served.txt Worker._loop > /tmp/j/spy-served-summary.txt 2>&1
grep -iE "wait_for_one|condition|cuLaunch|cublas|cudaMalloc|cudaEvent|Worker::commit|finalize|gpu::eval" /tmp/j/spy-served-summary.txt | head -30 >> $S
MLX_MAX_OPS_PER_BUFFER=1000 sa ops1000 110 $L --duration 30
sa ops100 110 $L --duration 30
MLX_MAX_OPS_PER_BUFFER=1000 sa ops1000b 110 $L --duration 30
if [ $(( $(date +%s) - PREPARE_T0 )) -lt 470 ]; then
  timeout 100 python3 -P bench/batch_step.py --model /tmp/l8b --rows 32 --context 500:1000 \
    --steps 2000 --warmup 16 --variants ours --out /tmp/j/bare.json > /tmp/j/bare.log 2>&1 &
  BP=$!
  sleep 40
  /tmp/spy/bin/py-spy record -p $BP -d 12 -r 50 --native --idle --threads -f raw -o /tmp/j/spy-bare.txt > /dev/null 2>&1
  wait $BP; echo "== bare: rc=$? $(elapsed)" >> $S
  python3 $D/spy_summary.py /tmp/j/spy-bare.txt MainThread > /tmp/j/spy-bare-summary.txt 2>&1
  grep -iE "wait_for_one|condition|cuLaunch|cublas|cudaMalloc" /tmp/j/spy-bare-summary.txt | head -12 >> $S
fi
cp /tmp/j/spy-served-summary.txt $OUT/ 2>/dev/null
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.txt && cd - > /dev/null
cat $S
