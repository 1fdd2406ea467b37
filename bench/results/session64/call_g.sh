#!/bin/bash
# Session 64, call g: as call e with the histograms by 12 + 12 + 8 bits of the key (call e: 16 + 16 with a coarse
# histogram by atomics, ~50 µs; call f: the coarse sums in the one-program scan, ~75 µs).
# (the same commands as call f's, on this call's code)
exec bash bench/results/session64/call_f.sh
