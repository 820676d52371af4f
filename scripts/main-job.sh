#!/usr/bin/env bash
# kvferry's main job: installs dependencies, builds, and runs seed 000's
# benchmark over loopback with the embedded default (a spawned target
# process and this initiator, p2p metadata, no other service): random
# 8 KiB blocks out of an 8 GB pool at 16 MB, 64 MB, 256 MB and 1 GB, WRITE
# and READ, every moved block verified by checksum on both sides.
# First over tcp (the network path seed 000 is about, with the link
# ceiling of the same bytes measured before each iteration), then with the
# default transport choice (same host: shm), with the same batches over
# tcp interleaved (--vs tcp: shm's ratio to tcp in one run). Extra
# arguments go to both
# `kvferry bench blocks` runs (e.g. --pool 2G on a small machine).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./build/kvferry bench blocks --op both --verify --transport tcp "$@"
./build/kvferry bench blocks --op both --verify --vs tcp "$@"
