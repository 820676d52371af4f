#!/usr/bin/env bash
# kvferry's main job: installs dependencies, builds, and runs the
# connector benchmark kvferry was built to win (seed 000): from an 8 GB
# registered memory pool, pick random, non-overlapping 8 KiB blocks (the
# size of an LLM's KV-cache blocks) and move 16 MB, 64 MB, 256 MB and 1 GB
# of them per transfer to a second process over loopback, WRITE then READ,
# verifying every moved block by checksum on both sides. It runs twice:
# first over tcp (with the raw link ceiling of the same bytes measured
# before each size), then with the default transport choice (same host:
# shared memory), with the same batches over tcp interleaved in that run
# (--vs tcp: shm's ratio to tcp). Extra arguments go to both
# `kvferry bench blocks` runs (e.g. --pool 2G on a small machine).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./build/kvferry bench blocks --op both --verify --transport tcp "$@"
./build/kvferry bench blocks --op both --verify --vs tcp "$@"
