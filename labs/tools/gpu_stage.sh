#!/usr/bin/env bash
# Stage vLLM 0.26.0's offline payload (shared/gpu/vllm-0.26.0) for the lent H200 in pieces that fit.
#
#   bash labs/tools/gpu_stage.sh            # writes .gpu-stage/p0 .. pN (git-ignored) and prints the run calls
#
# Why: a `run` call carries the working tree with it, 64 MiB in all. This repository's tracked files are
# about 40 MiB (2026-12-04), so shared/gpu's 40 MiB chunks no longer fit beside it. The core and MoE
# payloads (129 MiB) are cut here into as many equal pieces as fit beside the working tree (63 MiB in all
# per call, a MiB of slack); the last call joins them, cuts
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
tracked=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
blob=$(stat -c %s "$STAGE/blob")
room=$(( 63 * 1048576 - tracked - 16384 ))     # a call carries 64 MiB in all; keep a MiB of slack
[ "$room" -gt 4194304 ] || { echo "the working tree ($((tracked / 1048576)) MiB) leaves no room for a piece" >&2; exit 1; }
N=$(( (blob + room - 1) / room ))
(cd "$STAGE" && split -n "$N" -d -a 2 blob piece. && rm blob)
last=$((N - 1))
for i in $(seq 0 $last); do j=$(printf %02d "$i"); mkdir -p "$STAGE/p$i" && mv "$STAGE/piece.$j" "$STAGE/p$i/"; done
cp "$G/install.sh" "$G/SHA256SUMS" "$STAGE/p0/"
echo "staged in $STAGE: $N pieces of $(du -sh "$STAGE"/p0 | cut -f1); the working tree is $((tracked / 1048576)) MiB"
echo "run calls, one at once after the other (the machine is given back 30 s after a call):"
echo "  1. carry [\".gpu-stage/p0\"]: mkdir -p /tmp/pieces && cp .gpu-stage/p0/* /tmp/pieces/"
for i in $(seq 1 $((last - 1))); do echo "  $((i + 1)). carry [\".gpu-stage/p$i\"]: cp .gpu-stage/p$i/* /tmp/pieces/"; done
cat <<EOF
  $N. carry [".gpu-stage/p$last"]: cp .gpu-stage/p$last/* /tmp/pieces/ && cd /tmp/pieces && cat piece.* > blob \\
       && head -c $CORE_BYTES blob > core && tail -c +$((CORE_BYTES + 1)) blob > vllm-moe.tar.xz.part-00 \\
       && split -b $CHUNK_BYTES -d -a 2 core vllm-core.tar.xz.part- && rm blob core piece.* && cd - >/dev/null \\
       && bash /tmp/pieces/install.sh receive /tmp/pieces/vllm-*.part-* && bash /tmp/vllm_chunks/install.sh install
     then, in the same call or the next: source /tmp/vllm_offline/env.sh && <your work>
  Send each call the moment the last returns: a machine idle for 30 s is given back and what it received is lost.
EOF
