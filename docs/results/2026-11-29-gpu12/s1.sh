#!/usr/bin/env bash
# Device run 4 of the session (one GPU; parts 1-3 staged in /tmp/stage, part 4 carried), issue
# 34: one stream of the real SmolLM2 with prompt lookup, this tree (bd2bbfd: a verify's few
# positions take MLX's CUDA vector attention in parts, not the unfused fallback) against the
# build before it (d67fe8b's _decode_attention.py, beside this script), each in a process of
# its own with its own `off` engines; up to 4 (the default) and up to 8 drafts.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
cp .whl/part-4/* /tmp/stage/ 2>/dev/null
smollm2 >> $S
HERE=docs/results/2026-11-29-gpu12
rm -rf /tmp/src-old && cp -r src /tmp/src-old
cp $HERE/previous_decode_attention.py /tmp/src-old/mlx_nursery/engine/_decode_attention.py
V=(off "ngram (adaptive, 4)" "ngram (adaptive, 8)" "off (second engine)")
spec() {  # spec NAME SRC STREAMS TOKENS LIMIT
  PYTHONPATH=$2 timeout $5 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 \
    --streams $3 --tokens $4 --variants "${V[@]}" --out $OUT/$1.json > /tmp/$1.log 2>&1
  echo "$1: rc=$? $(elapsed)" >> $S
  grep -E "tok/s" /tmp/$1.log | tail -8 | sed "s/^/  /" >> $S
}
spec new1 $PWD/src 1 160 200
spec old1 /tmp/src-old 1 160 200

cat $S
