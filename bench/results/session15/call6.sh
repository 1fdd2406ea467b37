# session 15, call 6 (one H200): the device-phase comm tests after the side stream is ordered after the state's zeros
# (call 5's one failure: test_device_phase_wait_is_bounded read 0x0101...01 as the expired epoch)
export NCCL_NVLS_ENABLE=0 PYTHONPATH=.
timeout 130 python -m pytest -q tests/gpu/test_comm_gpu.py -k "device or absent or bounded" 2>&1 | tail -n 3 | tee $OUT/gpu_comm_tests.txt
