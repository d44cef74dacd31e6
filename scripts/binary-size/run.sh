#!/usr/bin/env bash
# Prints the stripped release binary size and the crates compiled for each app (see Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${TMPDIR:-/tmp}/orion-beacon-binary-size}"
cargo build --release --quiet
for app in a b c; do
  bytes=$(stat -c %s "$CARGO_TARGET_DIR/release/size-$app")
  crates=$(cargo tree -p "size-$app" -e normal,build --prefix none | sed 's/ (\*)//; s/ (proc-macro)//' | sort -u | wc -l)
  printf 'size-%s  %10d bytes  %4d crates\n' "$app" "$bytes" "$crates"
done
