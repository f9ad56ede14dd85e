# sourced by every step, from the repository root on the device
export PYTHONPATH=$PWD/.bench-src/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
B="python3 -P .bench-src/bench/serving.py"
# the workload: one 448x448 JPEG + 64 text tokens, 64-128 tokens out, temperature 0.7, EOS ignored
W="--model /tmp/qvl --images 1 --image-size 448x448 --input-len 64 --output-len 64:128 --mix temperature --temperature 0.7 --ignore-eos"
LOGS=/tmp/benchlogs; mkdir -p $LOGS
ready() {  # ready PORT: wait for /health (300 s at most)
  python3 - "$1" <<'PY'
import sys, time, httpx
for _ in range(1500):
    try:
        if httpx.get(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.2)
sys.exit(1)
PY
}
pack_logs() { tar -czf $OUT/logs-$1.tar.gz -C $LOGS . 2>/dev/null; }
