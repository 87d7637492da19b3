#!/usr/bin/env bash
# Builds the corpus binary of this tree and of this tree with patches applied, into
# bundle/ab/ with a run script that times them in turns on the GPU machine:
#
#   scripts/experiments/ab_patches.sh NAME PATCH... # here: bundle/ab/corpus-main, corpus-NAME
#   F=add,concat ROUNDS=2 bash bundle/ab/run.sh     # there (device tool: carry ["bundle/ab"])
#
# The patches are applied in a worktree of HEAD, built in target/base (as
# gpu-bundle's BASE is, so this tree's incremental artifacts stay); the worktree
# is removed after. Several calls with other names add binaries beside the
# first; run.sh times every corpus-* it finds.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1; shift
root=$PWD
mkdir -p bundle/ab
cargo build -q --profile bundle -p tilefuse-kernels --bin corpus
cp target/bundle/corpus bundle/ab/corpus-main
dir=$(mktemp -d)/ab
git worktree add -q --detach "$dir" HEAD
for p in "$@"; do git -C "$dir" apply "$root/$p"; done
(cd "$dir" && CARGO_TARGET_DIR="$root/target/base" cargo build -q --profile bundle -p tilefuse-kernels --bin corpus)
cp target/base/bundle/corpus "bundle/ab/corpus-$name"
git worktree remove --force "$dir"
cat > bundle/ab/run.sh <<'RUN'
#!/usr/bin/env bash
# Times every corpus-* here in turns, untuned: F (a filter), ROUNDS (default 2);
# then the corpus GPU check of each patched binary (every case against float64).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} TILEFUSE_AUTOTUNE=off TILEFUSE_REQUIRE_GPU=1
OUT=${OUT:-/tmp/ab-out}; mkdir -p "$OUT"
for r in $(seq "${ROUNDS:-2}"); do
  for b in corpus-*; do
    ./$b --bench "${F:-}" 2>/dev/null | grep '^bench' | sed "s/^bench /${b#corpus-} /" | tee -a "$OUT/ab.log"
  done
done
for b in corpus-*; do
  [ "$b" = corpus-main ] && continue
  ./$b "${F:-}" > "$OUT/check-${b#corpus-}.log" 2>&1 && echo "check ${b#corpus-}: ok" || echo "check ${b#corpus-}: FAILED"
done
RUN
chmod +x bundle/ab/run.sh
ls -la bundle/ab
