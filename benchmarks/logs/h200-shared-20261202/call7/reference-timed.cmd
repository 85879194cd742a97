tools/gpu-shared reference-timed -- --commbench-timing-max-rounds=2 (COMMBENCH_RANKS_PER_GPU=8, SHARED_SELECT='eplb_rebalance', SHARED_JOBS=1, SHARED_WORLDS=min)
