tools/gpu-shared reference-check (COMMBENCH_RANKS_PER_GPU=8, SHARED_SELECT='(nccl_allreduce or tk_allreduce or nvshmem_ll_dispatch or ipc_barrier) and np2', SHARED_JOBS=4)
