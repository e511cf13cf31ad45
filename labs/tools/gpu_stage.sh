#!/usr/bin/env bash
# Stage vLLM 0.26.0's offline payload (shared/gpu/vllm-0.26.0) for the lent H200 in pieces that fit.
#
#   bash labs/tools/gpu_stage.sh            # writes .gpu-stage/p0 .. p3 (git-ignored) and prints the run calls
#
# Why: a `run` call carries the working tree with it, 64 MiB in all. This repository's tracked files are
# about 30 MiB (2026-12-04), so shared/gpu's 40 MiB chunks no longer fit beside it. The core and MoE
# payloads (129 MiB) are cut here into four equal pieces of about 32 MiB; the last call joins them, cuts
# them back into the payload's own chunks (whose SHA256SUMS install.sh checks) and installs. Measured
# 2026-12-04: the four calls plus install take about 100 s of device time from a cold machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
G=${G:-$ROOT/../shared/gpu/vllm-0.26.0}
STAGE=$ROOT/.gpu-stage
grep -qx '/.gpu-stage/' "$ROOT/.git/info/exclude" 2>/dev/null || { mkdir -p "$ROOT/.git/info"; echo '/.gpu-stage/' >> "$ROOT/.git/info/exclude"; }
rm -rf "$STAGE" && mkdir -p "$STAGE"
cat "$G"/vllm-core.tar.xz.part-0* "$G"/vllm-moe.tar.xz.part-00 > "$STAGE/blob"
CORE_BYTES=$(cat "$G"/vllm-core.tar.xz.part-0* | wc -c)
CHUNK_BYTES=$(stat -c %s "$G/vllm-core.tar.xz.part-00")
(cd "$STAGE" && split -n 4 -d -a 1 blob piece. && rm blob)
for i in 0 1 2 3; do mkdir -p "$STAGE/p$i" && mv "$STAGE/piece.$i" "$STAGE/p$i/"; done
cp "$G/install.sh" "$G/SHA256SUMS" "$STAGE/p0/"
tracked=$(cd "$ROOT" && git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {printf "%.1f", s/1048576}')
echo "staged in $STAGE: $(du -sh "$STAGE"/p0 | cut -f1) per piece; the working tree is $tracked MiB (64 MiB with one piece)"
cat <<EOF
run calls, one at once after the other (the machine is given back 30 s after a call):
  1. carry [".gpu-stage/p0"]: mkdir -p /tmp/pieces && cp .gpu-stage/p0/* /tmp/pieces/
  2. carry [".gpu-stage/p1"]: cp .gpu-stage/p1/* /tmp/pieces/
  3. carry [".gpu-stage/p2"]: cp .gpu-stage/p2/* /tmp/pieces/
  4. carry [".gpu-stage/p3"]: cp .gpu-stage/p3/* /tmp/pieces/ && cd /tmp/pieces && cat piece.0 piece.1 piece.2 piece.3 > blob \\
       && head -c $CORE_BYTES blob > core && tail -c +$((CORE_BYTES + 1)) blob > vllm-moe.tar.xz.part-00 \\
       && split -b $CHUNK_BYTES -d -a 2 core vllm-core.tar.xz.part- && rm blob core piece.* && cd - >/dev/null \\
       && bash /tmp/pieces/install.sh receive /tmp/pieces/vllm-*.part-* && bash /tmp/vllm_chunks/install.sh install
     then, in the same call or the next: source /tmp/vllm_offline/env.sh && <your work>
EOF
