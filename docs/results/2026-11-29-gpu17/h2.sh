#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; part 2 and .whl/spy carried), issue 32.
# Served, this tree: the first start of a fresh machine (ready time: item 4), 32 closed-loop
# clients (GPU busy sampled beside), then the same load again with py-spy --native --idle on
# the server for 12 s (the engine thread's steady state, which h1's in-process profile missed:
# it sampled the warm-up), then mlx_lm.server under the 32 clients; then, time left, one
# greedy client and Poisson arrivals at 4/s on ours. Llama-3.1-8B, bf16.
set -u
mkdir -p /tmp/stage && cp .whl/spy/* /tmp/stage/ 2>/dev/null
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy /tmp/stage/py_spy-*.whl >> $S 2>&1
D=docs/results/2026-11-29-gpu16
mkdir -p /tmp/g
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
T07="--mix temperature --temperature 0.7"
line() { grep -E '^\| http' /tmp/g/$1.log | head -1 >> $S; }
gpu() {  # gpu NAME: nvidia-smi every 0.5 s into /tmp/g/NAME.gpu.txt, in the background
  ( python3 -u -c "
import subprocess,time
t=time.time()
p=subprocess.Popen(['nvidia-smi','--query-gpu=utilization.gpu','--format=csv,noheader,nounits','-lms','500'],stdout=subprocess.PIPE,text=True)
for line in p.stdout: print(round(time.time()-t,1), line.strip(), flush=True)
" > /tmp/g/$1.gpu.txt ) &
}
busy() {
  pkill nvidia-smi; sleep 0.5
  python3 - /tmp/g/$1.gpu.txt >> $S <<'PY'
import sys
v=[float(l.split()[1]) for l in open(sys.argv[1]) if len(l.split())==2]
mid=v[len(v)//5:len(v)*4//5] or v
print(f"  GPU busy: mean {sum(mid)/max(1,len(mid)):.0f}% over the middle 60% of {len(v)} samples")
PY
}
start() {
  python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/g/$1.server.log 2>&1 &
  local s=$(date +%s); for i in $(seq 1 1600); do health && break; sleep 0.25; done
  echo "== $1: ready after $(( $(date +%s) - s )) s ($(elapsed))" >> $S
}
stop() { pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"; }
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b "$@" \
    --ignore-eos --out /tmp/g/$name.json > /tmp/g/$name.log 2>&1
  echo "  $name: rc=$? $(elapsed)" >> $S; line $name
}
start first
gpu c32-ours
bench c32-ours 120 --clients 32 --input-len 500:1000 --output-len 64:192 $T07 --duration 40 --warmup 8
busy c32-ours
SP=$(pgrep -f "mlx_nursery serve" | head -1)
( sleep 14; /tmp/spy/bin/py-spy record -p $SP -d 12 -r 50 --native --idle --threads -f raw -o /tmp/g/spy-served.txt > /dev/null 2>&1 ) &
bench c32-spied 90 --clients 32 --input-len 500:1000 --output-len 64:192 $T07 --duration 26 --warmup 8
wait
python3 $D/spy_summary.py /tmp/g/spy-served.txt Worker.run > $OUT/spy-served-summary.txt 2>&1
head -1 $OUT/spy-served-summary.txt >> $S
bench one 60 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --duration 25 --warmup 1
stop
timeout 170 python3 -P bench/serving.py --server mlx_lm --model /tmp/l8b --clients 32 \
  --server-concurrency 32 --duration 40 --warmup 8 $T07 \
  --input-len 500:1000 --output-len 64:192 --ignore-eos --out /tmp/g/c32-mlx_lm.json \
  > /tmp/g/c32-mlx_lm.log 2>&1
echo "  c32-mlx_lm: rc=$? $(elapsed)" >> $S; grep -E '^\| ' /tmp/g/c32-mlx_lm.log | head -3 >> $S
if [ $(( $(date +%s) - PREPARE_T0 )) -lt 450 ]; then
  start poisson
  bench poisson 100 --rate 4 --input-len 500:1000 --output-len 64:192 $T07 --duration 40 --warmup 8
  stop
fi
cp /tmp/g/first.server.log $OUT/first-server.log 2>/dev/null
cd /tmp/g && tar -czf $OUT/g.tgz *.json *.gpu.txt *.log spy-served.txt 2>/dev/null; cd - > /dev/null
cat $S
