#!/bin/bash
# Session 63, device call on whichever card comes (no kind named): an H200 runs session 62's `call1.sh` (the headline
# table with HF and the GPU checks of session 61's sampling), an H100 `call_h100.sh` (the same checks, the kernel tests,
# the slice without HF: HF's bf16 slice does not fit an H100 beside its cache).
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -gt 100000 ]; then bash bench/results/session62/call1.sh; else bash bench/results/session63/call_h100.sh; fi
