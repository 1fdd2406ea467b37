#!/usr/bin/env bash
# README.md:46-47: `glmserve make-checkpoint /tmp/ck ...` then `glmserve generate --model /path/to/checkpoint "Hi"
# # any glm_moe_dsa / deepseek_v32 folder`. make-checkpoint writes no tokenizer.json (models/checkpoint.py), and
# generate refuses a folder without one (cluster/cli.py:111-113, exit 2). Exit 1 while generate on a freshly made
# checkpoint fails and README.md:47 does not say a tokenizer is needed. Run from the repository root (~15 s).
set -u
out=$(mktemp -d)/ck
.venv/bin/glmserve make-checkpoint "$out" --config models/configs/glm5-tiny-random.json --fp8 || exit 2
ls "$out"
msg=$(.venv/bin/glmserve generate --model "$out" "Hi" --max-tokens 2 2>&1 >/dev/null); rc=$?
echo "generate rc=$rc: $(echo "$msg" | tail -1)"
rm -rf "$(dirname "$out")"
if [ $rc -ne 0 ] && ! grep -n 'generate --model /path/to/checkpoint' README.md | grep -qi tokenizer; then
  echo "WRONG: README.md:47 says any glm_moe_dsa / deepseek_v32 folder; generate needs its tokenizer.json"
  exit 1
fi
echo ok
