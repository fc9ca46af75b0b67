#!/usr/bin/env bash
# Runs every torch example at world sizes 2 and 3 with the conflux launcher.
#   CONFLUX=path/to/conflux examples/torch/run_all.sh   (default: target/release/conflux)
# Python comes from $PYTHON or python3 on PATH (put the venv's bin/ first on PATH).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CONFLUX="${CONFLUX:-$root/target/release/conflux}"
SIZES="${SIZES:-2 3}"

examples=(all_reduce all_gather reduce_scatter all_to_all new_group
          fused_gradients async_overlap pipeline gradient_averaging traced_ddp)

passed=0
failed=()
for name in "${examples[@]}"; do
    for n in $SIZES; do
        if log="$("$CONFLUX" run -n "$n" "$here/$name.py" 2>&1)" && grep -q "$name ok" <<<"$log"; then
            echo "PASS  $name  -n $n"
            passed=$((passed + 1))
        else
            echo "FAIL  $name  -n $n"
            sed 's/^/      /' <<<"$log"
            failed+=("$name -n $n")
        fi
    done
done

echo "---"
echo "$passed passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
    printf '  failed: %s\n' "${failed[@]}"
    exit 1
fi
