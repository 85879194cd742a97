#!/usr/bin/env bash
# The summary BENCHMARKS.md's h200-record-layer section shows, from the logs of this folder:
#   bash benchmarks/logs/h200-session-20261203/summarize.sh > summary.txt
cd "$(dirname "$0")"
echo "references (call3, after the typed record layer, the platform seam and placement over nodes):"
echo "  $(grep -E '^=+ .* in [0-9.]+s' call3/references.out | tail -1)"
python3 -c '
import json
for l in open("call3/references.jsonl"):
    r = json.loads(l)
    if r.get("verdict") not in (None, "pass", "skipped"):
        print("  ", r["task"], r["world"], r["verdict"] + ":", r["message"][:160])'
echo "cheats (call3, ranks sharing the GPU):"
grep -E '^[a-z0-9_]+: [a-z_]+ ' call3/cheats.out | grep -v '^commbench: ' | cut -c1-170 | sed 's/^/  /'
grep -E '^tests/test_cupti_guard.py::.*(PASSED|FAILED)' call3/cheats.out | sed 's/^/  /'
echo "  $(grep -E '^=+ .* in [0-9.]+s' call3/cheats.out | tail -1)"
echo "side_stream_no_sync again (call4), its speedup on the shared GPU, four runs:"
grep -E '^side_stream_no_sync: ' call4-output.txt | cut -c1-120 | sed 's/^/  /'
echo "  (the fourth run failed; that test printed its line only after checking the bound, so its speedup was lost; call3 read 1.831 [(4, 0.827), (262144, 6.963), (67108864, 1.065)], timing trust shared)"
echo "  GPU after the cheats (call3): $(tail -1 call3/gpu-state.txt)"
