# install, make the model, then measurement 1 (8 concurrent image streams vs one at a time)
# and the encoder's share (lone image request vs a lone text request of the same length)
set -x
t0=$(date +%s)
cp .whl/part-3b/* /tmp/stage/ && bash .whl/part-2/install-mlx-cuda.sh || exit 3
. .bench-src/dev/env.sh
python3 -c "import mlx_vlm, mlx_vlm.server, fastapi, uvicorn, mlx_nursery, transformers, huggingface_hub, tokenizers; print('imports ok')" || exit 4
python3 -m pip list 2>/dev/null | grep -iE "^(mlx[-_a-z0-9]*|transformers|huggingface[-_]hub|tokenizers|fastapi|uvicorn|starlette|pydantic[-_a-z]*|numpy|pillow|safetensors|llguidance|trio|quart[-_a-z]*|hypercorn|httpx|torch|opencv[-a-z]*)\s" > $OUT/versions.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> $OUT/versions.txt
echo "install: $(( $(date +%s) - t0 )) s"
t1=$(date +%s.%N)
python3 -m mlx_nursery make-model /tmp/qvl --preset qwen2.5-vl-3b --dtype bfloat16 || exit 5
t2=$(date +%s.%N)
echo "make-model: $(python3 -c "print(round($t2-$t1,1))") s" | tee -a $OUT/versions.txt
du -sh /tmp/qvl | tee -a $OUT/versions.txt
# 1. 8 image streams, batched (8) vs served one at a time (1)
timeout 240 $B --server ours $W --clients 8 --server-concurrency 8 --duration 40 --warmup 8 --log-dir $LOGS/c8 --out $OUT/m1-c8.json
timeout 200 $B --server ours $W --clients 8 --server-concurrency 1 --duration 40 --warmup 4 --log-dir $LOGS/c1 --out $OUT/m1-c1.json
# encoder share: lone requests (1 client) on one server: image+64 text vs text alone of ~the same prompt length
python3 -m mlx_nursery serve --model /tmp/qvl --port 8101 --max-concurrency 8 --log-level warning --responses-db :memory: > $LOGS/lone-ours.log 2>&1 &
SP=$!
ready 8101 && {
  timeout 60 $B --url http://127.0.0.1:8101 $W --clients 1 --duration 15 --warmup 4 --out $OUT/lone-image.json
  timeout 60 $B --url http://127.0.0.1:8101 ${W/--images 1/--images 0} --input-len 322 --clients 1 --duration 15 --warmup 4 --out $OUT/lone-text.json
}
kill -INT $SP; sleep 3; kill -9 $SP 2>/dev/null
pack_logs 3
echo "step3 total: $(( $(date +%s) - t0 )) s"
