tools/gpu-shared reference-check (COMMBENCH_RANKS_PER_GPU=8, SHARED_JOBS=5, SHARED_WORLDS=min, SHARED_DONE=benchmarks/logs/h200-shared-20261202)
