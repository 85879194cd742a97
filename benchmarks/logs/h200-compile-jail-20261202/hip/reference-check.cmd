tools/gpu-shared reference-check (SHARED_PLATFORM=h200-hip, COMMBENCH_RANKS_PER_GPU=8, SHARED_SELECT='(rccl_allreduce or moe_dispatch_hip) and np2', SHARED_JOBS=2)
