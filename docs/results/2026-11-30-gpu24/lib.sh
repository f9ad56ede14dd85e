# Sourced by this directory's device scripts after bench/device/prepare.sh (which sets
# PREPARE_T0 and `elapsed`): the shapes the earlier sessions' scripts repeated, once.
#   fits SECONDS       true while SECONDS more stay within the call's limit (590 s)
#   sa NAME LIMIT ARGS bench/step_anatomy.py into /tmp/j/NAME.json, its summary to $S
#   served NAME LIMIT ARGS  bench/serving.py into /tmp/j/NAME.json, its table rows to $S
#   cuda_tests PATTERN the CUDA tests matching PATTERN (pytest from .whl/test) into $OUT
#   pack TGZ NAMES...  /tmp/j/NAME.json and .log into $OUT/TGZ
#   start_server LOG ARGS   `serve --model /tmp/l8b --port 8100 ARGS` in the background,
#                      its log in $OUT/LOG; waits for /health (up to 400 s) and appends the
#                      seconds from launch to ready to $S
#   stop_server        stops it
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
fits() { [ $(( $(date +%s) - PREPARE_T0 + $1 )) -lt 590 ]; }
served() {
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/|http)|^GPU busy|ready' /tmp/j/$name.log >> $S
}
cuda_tests() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
  PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 150 python3 -m pytest -q -p no:cacheprovider \
    --noconftest -o addopts="-ra" "$@" > $OUT/cuda-tests.log 2>&1
  echo "== cuda tests: rc=$? $(elapsed)" >> $S
  tail -3 $OUT/cuda-tests.log >> $S
}
pack() {
  local tgz=$1; shift
  (cd /tmp/j && tar -czf $OUT/$tgz $(for n in "$@"; do ls $n.json $n.log 2>/dev/null; done))
}
start_server() {
  local log=$1; shift
  python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 "$@" > $OUT/$log 2>&1 &
  SERVER_PID=$!
  local t0=$(date +%s)
  for i in $(seq 1 1600); do
    python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break
    sleep 0.25
  done
  echo "== server ($log): ready after $(( $(date +%s) - t0 )) s ($(elapsed))" >> $S
  grep -E "warm-up" $OUT/$log | tail -3 >> $S
}
stop_server() {
  kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null
}
