#!/usr/bin/env bash
# The one command: gossamer against central-Redis limiters and governor, in one run.
#
#   bash bench/run.sh            # ~15 min; writes docs/benchmarks.md and docs/bench/*.svg
#   bash bench/run.sh --quick    # a smoke test (short runs, one repetition)
#
# Installs redis-server (and iproute2, for the cluster runs) with apt-get if missing, builds
# gossamer and the bench crate (bench/, its own workspace) in release, and runs
# `gossamer-bench run` with the flags given here (see bench/src/main.rs). Everything it starts
# (redis-server, gossamer nodes, the proxies, network namespaces) is stopped when it ends,
# also on failure or Ctrl-C. The cluster runs need root; without it they are skipped and the
# report says so.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v ip >/dev/null || missing+=(iproute2)
if ((${#missing[@]})); then
    echo "installing ${missing[*]}..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

echo "building (release)..." >&2
cargo build --release --locked --bin gossamer >&2
# The shared target directory reuses gossamer's release artifacts (same profile).
CARGO_TARGET_DIR="$PWD/target" cargo build --release --locked --manifest-path bench/Cargo.toml >&2

BENCH=target/release/gossamer-bench
trap '"$BENCH" cleanup' EXIT
trap 'exit 130' INT TERM
"$BENCH" run "$@"
