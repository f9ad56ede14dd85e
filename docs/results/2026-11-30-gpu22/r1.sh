#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; .whl/part-2 and .whl/test carried).
# MLX's CUDA graphs with the in-place KV writes ordered by their markers (the cache writes
# in place under graphs once its reader takes the write's marker): the CUDA tests of it
# (a batch and a lone sequence decoded in place under graphs against MLX's updates), then
# the bare 32-row decode step with graphs off (the first process: builds the kernels) and
# on, ours and mlx-lm's, with the host's graph calls a step (--kernels), then off again,
# then a lone greedy stream in-process with graphs on and off.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
source docs/results/2026-11-30-gpu22/lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="-ra" tests/engine/test_graph_order.py tests/engine/test_kv_append.py \
  > $OUT/cuda-tests.log 2>&1
echo "== cuda tests: rc=$? $(elapsed)" >> $S
tail -8 $OUT/cuda-tests.log >> $S
model_8b >> $S
bs off-build 200 0 --context 500:1000 --kernels --variants ours mlx_lm
bs on 150 1 --context 500:1000 --kernels --variants ours mlx_lm
bs off 80 0 --context 500:1000 --variants ours
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
O="$A --clients 1 --output-len 128 --temperature 0 --duration 15"
[ $(( $(date +%s) - PREPARE_T0 )) -lt 480 ] && sa one-on 55 $O --cuda-graphs
[ $(( $(date +%s) - PREPARE_T0 )) -lt 540 ] && sa one-off 55 $O
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
