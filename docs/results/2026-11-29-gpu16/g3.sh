#!/usr/bin/env bash
# Prepared, not run: the session's device time was spent on g2.sh and g4.sh.
# Device run 3, on g2's machine (installed, kernels built), issue 32: served, this tree, the
# 32-client load against mlx_lm.server in one call (GPU busy sampled beside ours), then one
# greedy client and Poisson arrivals at 4/s on our server. Llama-3.1-8B, bf16. Logs in /tmp,
# a summary and one archive of the JSON under $OUT.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
mkdir -p /tmp/g3
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
T07="--mix temperature --temperature 0.7"
line() { grep -E '^\| http' /tmp/g3/$1.log | head -1 >> $S; }
busy() {
  python3 - /tmp/g3/$1.gpu.txt >> $S <<'PY'
import sys
v=[float(l.split()[1]) for l in open(sys.argv[1]) if len(l.split())==2]
mid=v[len(v)//5:len(v)*4//5] or v
print(f"  GPU busy: mean {sum(mid)/max(1,len(mid)):.0f}% over the middle 60% of {len(v)} samples")
PY
}
start() {
  python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/g3/$1.server.log 2>&1 &
  local s=$(date +%s); for i in $(seq 1 1200); do health && break; sleep 0.25; done
  echo "== $1: ready after $(( $(date +%s) - s )) s ($(elapsed))" >> $S
}
stop() { pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"; }
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b "$@" \
    --ignore-eos --out /tmp/g3/$name.json > /tmp/g3/$name.log 2>&1
  echo "  $name: rc=$? $(elapsed)" >> $S; line $name
}
start ours
( python3 -u -c "
import subprocess,time
t=time.time()
p=subprocess.Popen(['nvidia-smi','--query-gpu=utilization.gpu','--format=csv,noheader,nounits','-lms','500'],stdout=subprocess.PIPE,text=True)
for line in p.stdout: print(round(time.time()-t,1), line.strip(), flush=True)
" > /tmp/g3/c32-ours.gpu.txt ) & GP=$!
bench c32-ours 170 --clients 32 --input-len 500:1000 --output-len 64:192 $T07 --duration 40 --warmup 8
kill $GP 2>/dev/null; pkill nvidia-smi; busy c32-ours
bench one 80 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --duration 30 --warmup 1
stop
start poisson
bench poisson 110 --rate 4 --input-len 500:1000 --output-len 64:192 $T07 --duration 45 --warmup 8
stop
timeout 200 python3 -P bench/serving.py --server mlx_lm --model /tmp/l8b --clients 32 \
  --server-concurrency 32 --duration 40 --warmup 8 $T07 \
  --input-len 500:1000 --output-len 64:192 --ignore-eos --out /tmp/g3/c32-mlx_lm.json \
  > /tmp/g3/c32-mlx_lm.log 2>&1
echo "  c32-mlx_lm: rc=$? $(elapsed)" >> $S; grep -E '^\| ' /tmp/g3/c32-mlx_lm.log | head -3 >> $S
cd /tmp/g3 && tar -czf $OUT/g3.tgz *.json *.gpu.txt && cd - > /dev/null
cp /tmp/g3/ours.server.log $OUT/ours-server.log
cat $S
