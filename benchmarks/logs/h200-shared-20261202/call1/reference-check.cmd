tools/gpu-shared reference-check (COMMBENCH_RANKS_PER_GPU=8, SHARED_JOBS=4)
