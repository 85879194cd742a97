tools/gpu-shared template (COMMBENCH_RANKS_PER_GPU=8, SHARED_JOBS=4, SHARED_WORLDS=min)
