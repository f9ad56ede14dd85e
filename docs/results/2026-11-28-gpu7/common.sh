# Sourced by the device scripts here: the served 8B-shaped model under bench/serving.py, one
# server start per run, the GPU's busy share sampled beside it.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$1/health',timeout=2).status==200 else 1)" 2>/dev/null; }
# served NAME CLIENTS DURATION INPUT OUTPUT MIX [serve args...]
served() {
  local name=$1 clients=$2 duration=$3 input=$4 output=$5 mix=$6; shift 6
  local port=8100 s
  python3 -m mlx_nursery serve --model /tmp/l8b --port $port --max-concurrency 32 "$@" > $OUT/$name.server.log 2>&1 &
  s=$(date +%s); for i in $(seq 1 1200); do health $port && break; sleep 0.25; done
  echo "$name: ready after $(( $(date +%s) - s )) s"
  ( python3 -u -c "
import subprocess,time
t=time.time()
p=subprocess.Popen(['nvidia-smi','--query-gpu=utilization.gpu','--format=csv,noheader,nounits','-lms','500'],stdout=subprocess.PIPE,text=True)
for line in p.stdout: print(round(time.time()-t,1), line.strip(), flush=True)
" > $OUT/$name.gpu.txt ) & local gp=$!
  timeout $(( duration + 120 )) python3 -P bench/serving.py --url http://127.0.0.1:$port --model /tmp/l8b \
    --clients $clients --input-len $input --output-len $output $mix --ignore-eos \
    --duration $duration --warmup $(( clients > 1 ? 8 : 1 )) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name: bench rc=$?"
  kill $gp 2>/dev/null; pkill nvidia-smi
  pkill -INT -f "mlx_nursery serve"; for i in $(seq 1 60); do pgrep -f "mlx_nursery serve" >/dev/null || break; sleep 0.5; done; pkill -9 -f "mlx_nursery serve"
  grep -E "^\| http" $OUT/$name.log | head -1
  python3 - "$OUT/$name.gpu.txt" <<'PY'
import sys
v=[float(l.split()[1]) for l in open(sys.argv[1]) if len(l.split())==2]
mid=v[len(v)//5:len(v)*4//5] or v
print(f"  GPU busy: mean {sum(mid)/max(1,len(mid)):.0f}% over the middle 60% of {len(v)} samples")
PY
}
LOAD32="32 40 500:1000 64:192"
T07="--mix temperature --temperature 0.7"
