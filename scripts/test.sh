#!/usr/bin/env bash
# Every test of the workspace: unit tests, the integration tests that start real rank
# processes over shared memory and TCP, then the Python package and torch.distributed backend
# tests (pytest, in the environment scripts/py-env.sh makes or reuses). Test threads are
# limited to 2 because multi-rank tests already oversubscribe this 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "cargo is required (rustup.rs)"; exit 1; }
# As root (CI), the multi-host tests in network namespaces must run, not skip; their packet
# loss needs nftables.
if [ "$(id -u)" = 0 ]; then
    export CONFLUX_REQUIRE_NETNS=1
    command -v nft >/dev/null || { apt-get install -y -q nftables >/dev/null || { apt-get update -q && apt-get install -y -q nftables; }; }
fi
# Style and lints first: they fail in seconds, before minutes of tests.
if command -v rustup >/dev/null && ! rustup component list --installed | grep -q '^clippy'; then
    rustup component add clippy rustfmt
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --release --locked
cargo test --workspace --locked -- --test-threads=2
bash scripts/py-env.sh
CONFLUX_BIN="$PWD/target/release/conflux" .venv/bin/python -m pytest -q crates/conflux-py/tests
