tools/gpu-shared cheats -- -k gpu_cheat or window or harness_calls_pass or cupy_as_the_harness or peer (COMMBENCH_RANKS_PER_GPU=2)
