package sim

import "testing"

// muster on native PodGroups runs with GenericWorkload and
// TopologyAwareWorkloadScheduling on (its own process), so the core runs
// its pod-group cycle for the simulator's PodGroups and MusterGang plans
// each group: on small, whose second wave waits for the first to finish,
// every gang binds whole and completes.
func TestMusterNativeBindsWholeGangs(t *testing.T) {
	plan := smallPlan(t, 1)
	r := runInChild(t, "../../bench/scenarios/small.yaml", MusterNative, 1)
	m, extra := r.Metrics, r.Details.Extra
	if m.GangsCompleted != len(plan.Jobs) || m.PartialGangs != 0 || m.DeadlockedGangs != 0 || r.Details.StalledSteps != 0 {
		t.Errorf("muster-native on small: %d of %d gangs completed, %d partial, %d deadlocked, %d stalled steps (%s)",
			m.GangsCompleted, len(plan.Jobs), m.PartialGangs, m.DeadlockedGangs, r.Details.StalledSteps, r.Details.EndReason)
	}
	// The pod-group cycle placed the groups, and muster planned them.
	if extra["podgroup_attempts_scheduled"] < float64(len(plan.Jobs)) || extra["muster_gangs_scheduled"] < float64(len(plan.Jobs)) {
		t.Errorf("muster-native: %.0f pod-group cycles scheduled, %.0f gangs scheduled by muster; want at least %d each (counters %v)",
			extra["podgroup_attempts_scheduled"], extra["muster_gangs_scheduled"], len(plan.Jobs), extra)
	}
}
