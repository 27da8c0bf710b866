#!/usr/bin/env bash
# Runs the simulator's benchmark set and writes bench/results/<scenario>/seed-<n>/
# and the generated section of BENCHMARKS.md:
#
#   - equal work: contention-free scenarios (bench/scenarios/equal-*.yaml), every
#     scheduler plus `none` (the harness alone), EQUAL_SEEDS seeds, the order of
#     the schedulers rotated by the seed;
#   - contended scenarios: SEEDS seeds each;
#   - a CPU profile of muster on PROFILE_SCENARIO, summarised in BENCHMARKS.md;
#   - the soaks (SOAK_SCENARIOS: a month at 2000 nodes, four contended days
#     at 500), muster alone, seed 1: their reports (live heap and every keyed
#     structure per virtual day) are written to bench/results/<soak>/seed-1,
#     and BENCHMARKS.md's soak sections quote them.
#
# The standard set (make bench) is the DRA equal-work scenarios and every
# equal-work scenario (gangs of 2, 8
# and 64 at 1000, 5000 and 15000 nodes, burst and stream; the busy-cluster
# ones of 8x8 GPUs at 1000 and 5000 nodes) and the contended
# scenarios: about two hours on 2 cores, and the soaks forty minutes more. FULL=1 (make bench-full) adds native
# gang scheduling with TAS on every equal-work scenario and the `large`
# scenario: several hours.
#
#   SEEDS="1" CONTENDED_SCENARIOS="exact-fill" EQUAL_SCENARIOS="" SOAK_SCENARIOS="" hack/bench.sh
#   GO_WRAP="flock build.lock" hack/bench.sh   # serialise the build
#   KEEP_RUNS=1 hack/bench.sh   # keep runs/ (per-gang placements, scheduler logs)
#   MERGE_RESULTS=1 EQUAL_SCENARIOS="equal-burst-g8x8-n5000-busy" DRA_SCENARIOS="" \
#     CONTENDED_SCENARIOS="" SOAK_SCENARIOS="" PROFILE_SCENARIO="" hack/bench.sh
#       # rerun some scenarios; the generated section keeps every other
#       # scenario's results as they are in bench/results and says, by
#       # scenario, on which day and at which commit each was measured
set -o errexit -o nounset -o pipefail

cd "$(dirname "$0")/.."
FULL=${FULL:-}
# Every equal-work scenario: streams and bursts of gangs of 2, 8 and 64 at
# 1000, 5000 and 15000 nodes on a nearly idle cluster, and of gangs of 8
# 8-GPU workers on a busy one (70% of the GPUs held, anti-affinity) at 1000
# and 5000 nodes. All of them are the standard set.
all_equal=""
for kind in steady burst; do
  for nodes in 1000 5000 15000; do
    for workers in 2 8 64; do
      all_equal+=" equal-${kind}-g${workers}-n${nodes}"
    done
  done
done
busy_1000="equal-burst-g8x8-n1000-busy equal-steady-g8x8-n1000-busy"
all_equal+=" ${busy_1000} equal-burst-g8x8-n5000-busy equal-steady-g8x8-n5000-busy"
all_dra="equal-burst-g8-n1000-dra equal-burst-g8-n1000-dra-mixed"
all_contended="exact-fill contention priority spot-churn steady large"
if [[ -n "${FULL}" ]]; then
  # Not the 5000-node busy scenarios: native gang scheduling with TAS does
  # not finish a step of them within the step timeout.
  TAS_EQUAL_SCENARIOS=${TAS_EQUAL_SCENARIOS:-$(tr ' ' '\n' <<<"${all_equal}" | grep -v 'n5000-busy' | tr '\n' ' ')}
  CONTENDED_SCENARIOS=${CONTENDED_SCENARIOS:-"${all_contended}"}
fi
EQUAL_SCENARIOS=${EQUAL_SCENARIOS-"${all_equal}"}
# Native gang scheduling with TAS costs tens of seconds per run at 5000 nodes
# and more (its placement evaluation); the standard set runs it where it is
# affordable.
TAS_EQUAL_SCENARIOS=${TAS_EQUAL_SCENARIOS-"equal-burst-g8-n1000 ${busy_1000}"}
EQUAL_SEEDS=${EQUAL_SEEDS:-"1 2 3 4 5"}
EQUAL_SCHEDULERS=${EQUAL_SCHEDULERS:-muster,default,default-mostallocated,native-gang}
CONTENDED_SCENARIOS=${CONTENDED_SCENARIOS-"exact-fill contention priority spot-churn steady"}
# Equal work on GPUs served by dynamic resource allocation (all nodes, half
# of them). The `none` scheduler allocates no devices, so these runs have no
# net-of-the-harness column.
DRA_SCENARIOS=${DRA_SCENARIOS-"${all_dra}"}
SEEDS=${SEEDS:-"1 2 3"}
# About 30 and 10 minutes on 2 cores.
SOAK_SCENARIOS=${SOAK_SCENARIOS-"soak-month soak-contended"}
SCHEDULERS=${SCHEDULERS:-muster,default,default-mostallocated,native-gang,native-gang-tas}
# The profile is taken where muster is slowest next to the default profile:
# 2-worker gangs streamed onto the largest cluster.
PROFILE_SCENARIO=${PROFILE_SCENARIO-equal-steady-g2-n15000}
BIN=${BIN:-bin/muster-sim}
GO_WRAP=${GO_WRAP:-}
KEEP_RUNS=${KEEP_RUNS:-}
MERGE_RESULTS=${MERGE_RESULTS:-}

start=$(date +%s)
# The commit the reports record (report.BuildCommit), also where Go's own
# VCS stamp is off (-buildvcs=false).
commit=$(git rev-parse HEAD 2>/dev/null || true)
if [[ -n "${commit}" ]] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit+="+dirty"
fi
# shellcheck disable=SC2086 # GO_WRAP is a command prefix
${GO_WRAP} go build -ldflags "-X k8s.io/component-base/version.gitCommit=${commit}" -o "${BIN}" ./cmd/muster-sim

dirs=()
run() { # scenario schedulers seed
  local out="bench/results/$1/seed-$3"
  echo "== $1 seed $3 ($2)" >&2
  rm -rf "${out}"
  "${BIN}" --scenario "$1" --schedulers "$2" --seed "$3" --rotate --progress never --out "${out}"
  dirs+=("${out}")
  # The reports keep what the tables and the plot need; the raw runs (every
  # gang's placement, scheduler logs) are megabytes and are rebuilt by rerunning.
  if [[ -z "${KEEP_RUNS}" ]]; then
    rm -rf "${out}/runs"
  fi
}

for scenario in ${EQUAL_SCENARIOS}; do
  schedulers="${EQUAL_SCHEDULERS}"
  if [[ " ${TAS_EQUAL_SCENARIOS} " == *" ${scenario} "* ]]; then
    schedulers+=",native-gang-tas"
  fi
  for seed in ${EQUAL_SEEDS}; do
    run "${scenario}" "${schedulers},none" "${seed}"
  done
done
for scenario in ${DRA_SCENARIOS}; do
  for seed in ${EQUAL_SEEDS}; do
    run "${scenario}" "${EQUAL_SCHEDULERS}" "${seed}"
  done
done
for scenario in ${CONTENDED_SCENARIOS}; do
  for seed in ${SEEDS}; do
    run "${scenario}" "${SCHEDULERS}" "${seed}"
  done
done

for scenario in ${SOAK_SCENARIOS}; do
  out="bench/results/${scenario}/seed-1"
  echo "== ${scenario} (muster)" >&2
  rm -rf "${out}"
  "${BIN}" --scenario "${scenario}" --schedulers muster --progress never --out "${out}"
  if [[ -z "${KEEP_RUNS}" ]]; then
    rm -rf "${out}/runs"
  fi
done

profile_args=()
if [[ -n "${PROFILE_SCENARIO}" ]]; then
  out="bench/results/profile"
  rm -rf "${out}"
  "${BIN}" --scenario "${PROFILE_SCENARIO}" --schedulers muster --seed 1 --cpuprofile --progress never --out "${out}"
  {
    echo "# by own CPU time (-top), the 20 heaviest functions"
    go tool pprof -top -nodecount=20 "${BIN}" "${out}/runs/muster.pprof" 2>/dev/null | sed -n '/flat%/,$p'
    echo
    echo "# by cumulative CPU time (-top -cum), muster's plugin and planner and what they call"
    go tool pprof -top -cum -nodecount=400 "${BIN}" "${out}/runs/muster.pprof" 2>/dev/null \
      | sed -n '/flat%/,$p' | grep -E 'flat%|muster-sched/muster/pkg/(plugins|gang)' | head -25
  } > "${out}/muster-top.txt"
  rm -rf "${out}/runs"
  profile_args=(--profile "${out}/muster-top.txt"
    --profile-command "muster-sim --scenario ${PROFILE_SCENARIO} --schedulers muster --cpuprofile; go tool pprof -top")
fi

if [[ -f bench/results/apiserver.txt ]]; then
  profile_args+=(--apiserver bench/results/apiserver.txt)
fi
if [[ -f bench/results/planner.txt ]]; then
  profile_args+=(--planner bench/results/planner.txt)
fi

if [[ -n "${MERGE_RESULTS}" ]]; then
  # Every scenario of the full set with results in bench/results, rerun now
  # or not, in the set's order (the soaks have sections of their own).
  dirs=()
  for scenario in ${all_equal} ${all_dra} ${all_contended}; do
    for dir in $(ls -d "bench/results/${scenario}"/seed-* 2>/dev/null | sort -V); do
      if [[ -f "${dir}/report.json" ]]; then dirs+=("${dir}"); fi
    done
  done
fi

elapsed=$(( $(date +%s) - start ))
what="build and all runs"
if [[ -n "${MERGE_RESULTS}" ]]; then
  what="build and the scenarios rerun"
fi
"${BIN}" summarize --update BENCHMARKS.md --command "make bench${FULL:+-full}" \
  --elapsed "$(( elapsed / 60 ))m$(( elapsed % 60 ))s (${what})" "${profile_args[@]}" "${dirs[@]}"
echo "benchmark set done in ${elapsed}s; BENCHMARKS.md updated" >&2
