#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged; .whl/part-2 and .whl/test carried): first the CUDA tests of the decode
# attention (split forms now at more row counts), and the prelude's. The decode attention
# compiled by MLX and split below 512 blocks (decisions/0060), in-process under 32 clients
# (the first process builds the kernels); then one greedy client as shipped (the decode
# prelude compiled by MLX too) against the engine's own compile of both (--own-compiles, the
# previous default), to say whether the prelude's compile moves a lone stream.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pt .whl/test/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pt:$PYTHONPATH timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="-ra" tests/engine/test_ragged_cache.py tests/engine/test_decode_prelude.py \
  > $OUT/cuda-tests.log 2>&1
echo "== cuda tests: rc=$? $(elapsed)" >> $S
tail -3 $OUT/cuda-tests.log >> $S
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch"
sa c32 200 $A --clients 32 --output-len 64:192 --duration 20
O="$A --clients 1 --output-len 128 --temperature 0 --duration 15"
sa one 70 $O
sa one-own 80 $O --own-compiles
cd /tmp/j && tar -czf $OUT/json.tgz *.json && cd - > /dev/null
cat $S
