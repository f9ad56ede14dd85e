#!/usr/bin/env bash
# Device run 2 of the session (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue
# 32: a query of several tokens in the layout for cuBLAS (`engine/_sequence_attention.py`)
# against MLX's composed fallback (cuDNN off) and cuDNN, attention alone over the shapes the
# engine meets (bench/sequence_attention.py); then the warm ~8,000-token shared prompt's
# tail in-process, both ways alternating on one engine. Llama-3.1-8B shapes, bf16.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
echo "installed: $(elapsed)" >> $S
timeout 150 python3 -P bench/sequence_attention.py --kernels --out $OUT/seq-attn.json > /tmp/seq.log 2>&1
echo "seq-attn: rc=$? $(elapsed)" >> $S; cat /tmp/seq.log | cut -c1-400 >> $S
timeout 100 python3 -P bench/sequence_attention.py --cudnn --out $OUT/seq-attn-cudnn.json > /tmp/seqc.log 2>&1
echo "seq-attn cudnn: rc=$? $(elapsed)" >> $S; cat /tmp/seqc.log | cut -c1-300 >> $S
model_8b >> $S
timeout 200 python3 -P docs/results/2026-11-29-gpu14/warm_prefix_ab.py /tmp/l8b > /tmp/wp.log 2>&1
echo "warm_prefix_ab: rc=$? $(elapsed)" >> $S; grep -E "TTFT|Error|error" /tmp/wp.log | cut -c1-600 >> $S
cat $S
