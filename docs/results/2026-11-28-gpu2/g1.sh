#!/usr/bin/env bash
# Device run (one H100), issue 32's remaining loads on one server start: the cold start (a
# fresh machine's first start), one client, Poisson arrivals at 4/s, 8 clients with ~6K prompts.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
[ -d /tmp/l8b ] || python3 -m mlx_nursery make-model /tmp/l8b --preset llama-3.1-8b --dtype bfloat16 > $OUT/make.log 2>&1
[ -d /tmp/l1b ] || python3 -m mlx_nursery make-model /tmp/l1b --preset llama-3.2-1b --dtype bfloat16 > $OUT/make1b.log 2>&1
cat /tmp/l8b/*.safetensors > /dev/null; echo "models: $(( $(date +%s) - t0 )) s"
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > $OUT/ours.log 2>&1 &
s=$(date +%s); for i in $(seq 1 600); do health 8100 && break; sleep 0.25; done; echo "ready after $(( $(date +%s) - s )) s"
( python3 -u -c "
import subprocess,time
t=time.time()
p=subprocess.Popen(['nvidia-smi','--query-gpu=utilization.gpu','--format=csv,noheader,nounits','-lms','500'],stdout=subprocess.PIPE,text=True)
for line in p.stdout: print(round(time.time()-t,1), line.strip(), flush=True)
" > $OUT/gpu.txt ) & GP=$!
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
timeout 70 $B --clients 1 --input-len 500:1000 --output-len 128 --mix greedy:1 --ignore-eos --duration 25 --warmup 0 --save-records --out $OUT/one.json > $OUT/one.log 2>&1; echo "one rc=$? $(( $(date +%s) - t0 )) s"
timeout 110 $B --rate 4 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 45 --warmup 4 --out $OUT/poisson4.json > $OUT/poisson4.log 2>&1; echo "poisson rc=$? $(( $(date +%s) - t0 )) s"
timeout 110 $B --clients 8 --input-len 5800:6400 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos --duration 40 --warmup 0 --out $OUT/long8.json > $OUT/long8.log 2>&1; echo "long rc=$? $(( $(date +%s) - t0 )) s"
kill $GP; pkill nvidia-smi
pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 40); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
for f in one poisson4 long8; do grep -E "^\| http" $OUT/$f.log | head -2; done
python3 - <<PY
import json
for f in ["one","poisson4","long8"]:
    try: d=json.load(open("$OUT/"+f+".json"))
    except Exception as e: print(f, "no json", e); continue
    for r in d.get("runs", [d]):
        m=r.get("metrics", r)
        print(f, {k:m.get(k) for k in ("completed","offered","requests_per_s","output_tok_s","ttft_ms","tpot_ms") if k in m})
PY
grep -iE "warm-up|warmup|ready|listening" $OUT/ours.log | head -8
echo "total: $(( $(date +%s) - t0 )) s"
