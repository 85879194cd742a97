pytest suites --commbench-model=mutants --commbench-check-only -m span_nodes -k np2 --commbench-ranks-per-node=1 --commbench-ranks-per-gpu=2 --commbench-timeout=90
