#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged;
# .whl/part-2 and .whl/test carried). First the CUDA test of decisions/0059 as narrowed
# after this session's device runs (tests/engine/test_graph_order.py: only the prelude
# writes in place under graphs), which has not run on a GPU yet. The decode attention's device time at 32 rows is the step's largest
# item after the matrix products (5.5 ms of 11 a bare step, its one-kernel form), and two
# levers on it were never measured on the served step:
#   - MLX's compile of the engine's read-only kernels instead of its own (decisions/0057:
#     the same source ran 1.3-1.4x faster compiled by MLX, which also reads the queries
#     through their strides; the own compile's contiguity copies them, 32 copy kernels a
#     step), against seconds of compile at each start;
#   - the split form at 32 rows (more blocks than the one-kernel form's 256).
# Then the bare step (bench/batch_step.py, the first process builds the kernels), each
# variant with its kernels by family; next2.sh (the call after, same machine) the engine
# in-process under 32 clients and mlx-lm's default loop (graphs on) for the ratio.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
source docs/results/2026-11-30-gpu22/lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="-ra" tests/engine/test_graph_order.py > $OUT/cuda-tests.log 2>&1
echo "== cuda tests: rc=$? $(elapsed)" >> $S
tail -5 $OUT/cuda-tests.log >> $S
model_8b >> $S
bs own 170 0 --context 500:1000 --kernels --variants ours
bs mlx-compiles 110 0 --context 500:1000 --kernels --variants ours --mlx-compiles
bs split-512 90 0 --context 500:1000 --kernels --variants ours --attention-blocks 512
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
