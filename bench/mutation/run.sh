#!/usr/bin/env bash
# Mutation testing of kkmgpu's core numerics with mutmut 3 (on demand, not in CI). See README.md here.
#
#   bench/mutation/run.sh [MODULE ...]        e.g. bench/mutation/run.sh kkmgpu/metrics/internal.py kkmgpu/metrics/__init__.py
#
# Environment: PYTHON (default: python; needs kkmgpu's test dependencies and mutmut>=3.8), MUTATION_WORKDIR
# (default: bench/mutation/.work, git-ignored), MUTATION_CHILDREN (parallel mutants, default 2).
# Writes $MUTATION_WORKDIR/summary.md (counts per module and status, every surviving mutant's diff) and
# mutants/mutmut-cicd-stats.json; the workdir is kept so that `mutmut show NAME` / `mutmut browse` work there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python}
WORK=${MUTATION_WORKDIR:-$ROOT/bench/mutation/.work}
CHILDREN=${MUTATION_CHILDREN:-2}

# mutmut copies the source into ./mutants and puts it first on sys.path. It runs in a scratch copy of the
# project so that its config (setup.cfg) and outputs stay out of the repository root, and so that an editable
# install of kkmgpu elsewhere cannot shadow the mutated copy (verified by check_mutant_is_exercised below).
rm -rf "$WORK"
mkdir -p "$WORK"
cp -r "$ROOT/kkmgpu" "$ROOT/tests" "$ROOT/pyproject.toml" "$WORK/"
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
cp "$ROOT/bench/mutation/setup.cfg" "$WORK/setup.cfg"
if [ "$#" -gt 0 ]; then  # a narrower module set than the config's only_mutate
    "$PYTHON" - "$WORK/setup.cfg" "$@" <<'PY'
import re, sys
path, modules = sys.argv[1], sys.argv[2:]
text = open(path).read()
block = "only_mutate =\n" + "".join(f"    {m}\n" for m in modules)
text = re.sub(r"only_mutate =\n(?:    .*\n)+", block, text)
open(path, "w").write(text)
PY
fi
cd "$WORK"
export KKMGPU_DEVICE=cpu           # cuda cases skip; the CPU path is what the mutants change
export NUMBA_CACHE_DIR="$WORK/.numba-cache"
# mutmut forks a child per mutant from a process that has run the tests; GNU OpenMP (numba's default layer
# here) aborts in a forked child, which mutmut reports as "suspicious". The workqueue layer is fork-safe.
export NUMBA_THREADING_LAYER=workqueue
start=$(date +%s)
"$PYTHON" -m mutmut run --max-children "$CHILDREN" || true
end=$(date +%s)
"$PYTHON" -m mutmut export-cicd-stats
"$PYTHON" "$ROOT/bench/mutation/summarize.py" --seconds $((end - start)) > summary.md
cat summary.md
