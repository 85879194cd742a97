tools/gpu-shared reference-check (COMMBENCH_RANKS_PER_GPU=8, SHARED_SELECT='eplb_rebalance', SHARED_JOBS=4, SHARED_WORLDS=min)
