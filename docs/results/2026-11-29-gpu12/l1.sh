#!/usr/bin/env bash
# Device run 5 of the session (one GPU, MLX installed by v1.sh), issue 32: the loads of its
# targets not measured on an H200 yet, on one server start of this tree: one greedy client
# (>= 150 tok/s), an ~8,000-token shared system prompt, warm (TTFT p50 <= 30 ms), Poisson
# arrivals at 4/s (>= 0.98 completed, TTFT p50 <= 250 ms, p99 <= 1 s). Llama-3.1-8B shapes.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
python3 - <<'PY'
import json
words = ("the", "quick", "brown", "fox", "reads", "every", "page", "of", "the", "manual")
system = " ".join(words[i % len(words)] for i in range(8000))
with open("/tmp/prefix8k.jsonl", "w") as f:
    for i in range(21):
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": f"Question {i}: what does page {i} say?"}]
        f.write(json.dumps({"messages": messages}) + "\n")
PY
python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 --max-concurrency 32 > /tmp/l8b.server.log 2>&1 &
for i in $(seq 1 1600); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done
echo "ready: $(elapsed)" >> $S
grep -iE "warm-up|ready" /tmp/l8b.server.log | tail -3 >> $S
B="python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b"
load() {  # load NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t $B "$@" --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name: rc=$? $(elapsed)" >> $S
  grep -E '^\| http' /tmp/$name.log | head -2 >> $S
}
load one 80 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 30 --warmup 2
load prefix8k 80 --clients 1 --num-requests 20 --warmup 1 --dataset /tmp/prefix8k.jsonl --output-len 16 --mix greedy --ignore-eos
load poisson 120 --rate 4 --input-len 500:1000 --output-len 64:192 --mix temperature --temperature 0.7 --ignore-eos --duration 45 --warmup 8
load one-again 80 --clients 1 --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 30 --warmup 2
pkill -INT -f "mlx_nursery serve"
cp /tmp/l8b.server.log $OUT/ 2>/dev/null
cat $S
