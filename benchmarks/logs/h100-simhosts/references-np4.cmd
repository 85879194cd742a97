pytest suites --commbench-model=reference --commbench-check-only -m span_nodes -k np4 --commbench-ranks-per-node=2 --commbench-ranks-per-gpu=4 --commbench-timeout=120
