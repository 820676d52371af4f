#!/usr/bin/env bash
# kvferry's main job: installs dependencies, builds, and runs seed 000's
# benchmark over loopback with the embedded default (a spawned target
# process and this initiator, p2p metadata, no other service), WRITE and
# READ, with the link ceiling measured in the same run and every moved
# block verified by checksum. Extra arguments go to `kvferry bench blocks`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/kvferry bench blocks --op both --verify "$@"
