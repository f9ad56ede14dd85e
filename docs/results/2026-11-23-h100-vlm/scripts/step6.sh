# fresh machine: install, model; mlx-vlm's server crashes (SIGFPE) on image prompts on CUDA, so
# measurement 2 on the text-only workload of the same prompt length (330 tokens); disconnects
# text-only side by side; then probes of mlx-vlm's image crash
set -x
t0=$(date +%s)
cp .whl/part-3b/* /tmp/stage/ && bash .whl/part-2/install-mlx-cuda.sh || exit 3
. .bench-src/dev/env.sh
python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b --dtype bfloat16 || exit 5
T="${W/--images 1/--images 0} --input-len 322"
timeout 400 $B --server mlx_vlm --server ours $T --clients 8 --server-concurrency 8 --duration 30 --rounds 2 --warmup 8 --mlx-vlm-args "--log-level WARNING" --log-dir $LOGS/vs-text --out $OUT/m2-text-vs-mlxvlm.json
echo "after m2-text: $(( $(date +%s) - t0 )) s"
export PYTHONFAULTHANDLER=1
python3 -m mlx_vlm.server --model /tmp/qvl --port 8103 --max-num-seqs 8 > $LOGS/disc-mlxvlm-text.log 2>&1 &
VP=$!
ready 8103 && timeout 60 python3 -P .bench-src/dev/disconnect.py --url http://127.0.0.1:8103 --kind mlx_vlm --model /tmp/qvl --images 0 --log $LOGS/disc-mlxvlm-text.log --out $OUT/m4-disconnect-mlxvlm-text.json
kill -INT $VP; sleep 3; kill -9 $VP 2>/dev/null
python3 -m mlx_nursery serve --model /tmp/qvl --port 8102 --max-concurrency 8 --log-level warning --responses-db :memory: > $LOGS/disc-ours-text.log 2>&1 &
SP=$!
ready 8102 && timeout 60 python3 -P .bench-src/dev/disconnect.py --url http://127.0.0.1:8102 --kind ours --model /tmp/qvl --images 0 --out $OUT/m4-disconnect-ours-text.json
kill -INT $SP; sleep 3; kill -9 $SP 2>/dev/null
echo "after disconnects: $(( $(date +%s) - t0 )) s"
# probe: mlx-vlm's server, one image request, prefill in 128-token chunks
python3 -m mlx_vlm.server --model /tmp/qvl --port 8105 --max-num-seqs 8 --prefill-step-size 128 > $LOGS/vlm-probe-step128.log 2>&1 &
VP=$!
ready 8105 && timeout 45 $B --url http://127.0.0.1:8105 $W --clients 1 --num-requests 2 --warmup 0 --out $OUT/vlm-probe-step128.json
sleep 1; kill -0 $VP && echo "PROBE: mlx-vlm alive after image requests (step 128)" || echo "PROBE: mlx-vlm died (step 128)"
kill -9 $VP 2>/dev/null
pack_logs 6
echo "step6 total: $(( $(date +%s) - t0 )) s"
