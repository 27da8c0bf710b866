#!/usr/bin/env bash
# Runs the simulator's standard set: every scenario below with muster, the
# default profile and native gang scheduling on one seed, writing
# bench/results/<scenario>/ and the generated section of BENCHMARKS.md.
# Sized to finish within 10 minutes on a 2-core machine.
#
#   SEED=1 SCENARIOS="exact-fill contention" hack/bench.sh
#   GO_WRAP="flock build.lock" hack/bench.sh   # serialise the build
#   KEEP_RUNS=1 hack/bench.sh   # keep runs/ (per-gang placements, scheduler logs)
set -o errexit -o nounset -o pipefail

cd "$(dirname "$0")/.."
SEED=${SEED:-1}
SCENARIOS=${SCENARIOS:-"exact-fill contention steady spot-churn priority large"}
SCHEDULERS=${SCHEDULERS:-muster,default,native-gang}
BIN=${BIN:-bin/muster-sim}
GO_WRAP=${GO_WRAP:-}
KEEP_RUNS=${KEEP_RUNS:-}

start=$(date +%s)
# shellcheck disable=SC2086 # GO_WRAP is a command prefix
${GO_WRAP} go build -o "${BIN}" ./cmd/muster-sim

dirs=()
for scenario in ${SCENARIOS}; do
  echo "== ${scenario}" >&2
  "${BIN}" --scenario "${scenario}" --schedulers "${SCHEDULERS}" --seed "${SEED}" --out "bench/results/${scenario}"
  dirs+=("bench/results/${scenario}")
  # The reports keep what the tables and the plot need; the raw runs (every
  # gang's placement, scheduler logs) are megabytes and are rebuilt by rerunning.
  if [[ -z "${KEEP_RUNS}" ]]; then
    rm -rf "bench/results/${scenario}/runs"
  fi
done

elapsed=$(( $(date +%s) - start ))
"${BIN}" summarize --update BENCHMARKS.md --command "make bench" \
  --elapsed "$(( elapsed / 60 ))m$(( elapsed % 60 ))s (build and all runs)" "${dirs[@]}"
echo "standard set done in ${elapsed}s; BENCHMARKS.md updated" >&2
