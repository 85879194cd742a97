#!/usr/bin/env bash
# The summary BENCHMARKS.md's h200-trust4 section shows, from the logs of this folder:
#   bash benchmarks/logs/h200-trust4-20261203/summarize.sh > summary.txt
cd "$(dirname "$0")"
echo "references (call1, commit 7b15cd5): $(grep -E '^=+ .* in [0-9.]+s' call1/references.out | tail -1)"
python3 -c '
import json
for l in open("call1/references.jsonl"):
    r = json.loads(l)
    if r.get("verdict") not in (None, "pass", "skipped"):
        print("  ", r["task"], r["world"], r["verdict"] + ":", r["message"][:160])'
echo "references (call2, commit 96b6852): $(grep -E '^=+ .* in [0-9.]+s' call2/references.out | tail -1)"
echo "cheats (call2):"
grep -E '^[a-z0-9_]+: [a-z_]+ ' call2/cheats.out | grep -v '^commbench: ' | cut -c1-170 | sed 's/^/  /'
grep -E '^tests/test_cupti_guard.py::.*(PASSED|FAILED)' call2/cheats.out | sed 's/^/  /'
echo "  GPU after the cheats: $(tail -1 call2/gpu-state.txt)"
