#!/bin/bash
# Round 36, call 6 (one H200; carries .fa4/a): FlashAttention-4's first wheel part into /tmp/fa4.
set -uo pipefail
bash scripts/stage_fa4.sh part1 && echo "fa4 part1 staged: $(ls /tmp/fa4 | wc -l) files"
