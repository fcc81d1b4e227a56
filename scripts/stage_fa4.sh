#!/bin/bash
# FlashAttention-4 on the GPU machine, for same-run comparisons (benchmarks/backends.py:
# flash_attention_4; ../shared/guides/hopper.md). Its wheels are downloaded beforehand into .fa4/a
# and .fa4/b: the 92 MB -libs-cu13 wheel split in two (cu13.part-aa in a, cu13.part-ab in b) and the
# other wheels in either, so that each folder with the repository's tree stays under the 64 MB one
# device call carries (round 31: the three nvidia_cutlass_dsl wheels in b, the rest in a). The two
# travel in two calls back to back, on the same warm machine:
#
#   bash scripts/stage_fa4.sh part1    # first call, carry .fa4/a: the parts into /tmp/fa4
#   bash scripts/stage_fa4.sh part2    # second call, carry .fa4/b: joined and installed into /tmp/fa4site
#
# part2 prints the FLASHATTN_FA4_DIR to export, or says why FA4 is not there (a fresh machine).
set -uo pipefail
case "${1:-}" in
  part1)
    mkdir -p /tmp/fa4 && cp .fa4/a/* /tmp/fa4/ ;;
  part2)
    if [ ! -f /tmp/fa4/cu13.part-aa ]; then
      echo "stage_fa4: no part 1 in /tmp/fa4 (a fresh machine): FlashAttention-4 not staged" >&2; exit 1
    fi
    cp .fa4/b/* /tmp/fa4/ && cat /tmp/fa4/cu13.part-aa /tmp/fa4/cu13.part-ab \
        > /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl &&
      rm /tmp/fa4/cu13.part-* || exit 1
    "${PY:-python3}" -m pip install --no-index --no-deps --target /tmp/fa4site /tmp/fa4/*.whl > /tmp/fa4/install.log 2>&1 ||
      { tail -5 /tmp/fa4/install.log >&2; exit 1; }
    echo /tmp/fa4site ;;
  *)
    sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
