package sim

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/kubernetes/pkg/features"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

// schedMetrics reads the scheduler's metrics for the driver: the counters
// of the report, the preemptions in flight, muster's dropped plans. The
// metrics live in the process's registry and add up across the runs of one
// process (tests, benchmarks), so each is read as its increase since start.
type schedMetrics struct {
	// scheduler is the run's scheduler (Options.Scheduler), profile its
	// profile's name.
	scheduler, profile string
	baseline           map[string]float64
	// preemptionsBefore is kube-scheduler's count of unfinished preemptions
	// when the run began.
	preemptionsBefore float64
	// lastRejects is muster's count of dropped gang plans when last read;
	// rejected: one was dropped in this step.
	lastRejects float64
	rejected    bool
}

// start takes the metrics' values when the run begins.
func (m *schedMetrics) start() {
	m.baseline = m.counterValues()
	m.lastRejects = gangRejections()
	if !isMuster(m.scheduler) {
		m.preemptionsBefore, _ = m.evictionsInFlight()
	}
}

// rejectedInStep reports whether muster dropped a gang plan in this step
// (newStep starts one). It gathers every metric: call it last.
func (m *schedMetrics) rejectedInStep() bool {
	if rejects := gangRejections(); rejects > m.lastRejects {
		m.lastRejects, m.rejected = rejects, true
	}
	return m.rejected
}

// newStep forgets the last step's dropped plans.
func (m *schedMetrics) newStep() { m.rejected = false }

// The scheduler's counters in the report. kube-scheduler's
// schedule_attempts_total and podgroup_schedule_attempts_total are
// unexported in its metrics package, and muster's in mustergang: only their
// names reach them, so they are read from the process's registry through
// testutil.GetCounterValuesFromGatherer. batch_attempts_total is exported,
// but asking its vector for a series creates the series: the report would
// then show 0 for a result that never happened, where it shows none. So it
// is read by name too. kube-scheduler's counters are read for the run's one
// profile.

// countersBy returns the series of counter name whose labels match match,
// by the value of label: none before the counter has a series.
func countersBy(name, label string, match map[string]string) map[string]float64 {
	values, err := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer, name, match, label)
	if err != nil {
		return map[string]float64{} // not registered yet, or no series
	}
	return values
}

// counterTotal reads a counter without labels (muster's gangs_scheduled_total
// and gang_unplaceable_total), which testutil's gatherer readers, keyed by a
// label, do not: the one reader of the registry's families written here. 0
// before the counter has a series.
func counterTotal(name string) float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return 0
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// histogramTotals reads a histogram without labels (muster's
// gang_plan_duration_seconds): the sum and the count of its observations
// since the process started (a soak runs one scheduler per process).
func histogramTotals(name string) (sum, count float64) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return 0, 0
	}
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				count += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, count
}

// gangRejections is muster_gang_rejections_total over all causes.
func gangRejections() float64 {
	total := 0.0
	for _, v := range countersBy("muster_gang_rejections_total", "cause", nil) {
		total += v
	}
	return total
}

// extra collects scheduler-specific counters for the report, as
// increases since the run started: whether opportunistic batching ever used a
// hint, muster's plan outcomes, native pod-group attempts.
func (m *schedMetrics) extra() map[string]float64 {
	out := m.counterValues()
	for k, v := range m.baseline {
		out[k] -= v
	}
	out["gate_opportunistic_batching"] = 0
	if utilfeature.DefaultFeatureGate.Enabled(features.OpportunisticBatching) {
		out["gate_opportunistic_batching"] = 1
	}
	out["gate_interpod_affinity_hostname_fast_path"] = 0
	if utilfeature.DefaultFeatureGate.Enabled(features.InterPodAffinityHostnameFastPath) {
		out["gate_interpod_affinity_hostname_fast_path"] = 1
	}
	return out
}

func (m *schedMetrics) counterValues() map[string]float64 {
	out := map[string]float64{}
	profile := map[string]string{"profile": m.profile}
	for result, v := range countersBy("scheduler_batch_attempts_total", "result", profile) {
		out["batch_attempts_"+result] = v
	}
	out["schedule_attempts"] = 0
	for result, v := range countersBy("scheduler_schedule_attempts_total", "result", profile) {
		out["schedule_attempts_"+result] = v
		out["schedule_attempts"] += v
	}
	if isMuster(m.scheduler) {
		out["muster_gangs_scheduled"] = counterTotal("muster_gangs_scheduled_total")
		out["muster_plans_unplaceable"] = counterTotal("muster_gang_unplaceable_total")
		out["muster_plans_installed"] = counterTotal("muster_gang_plans_total")
		for cause, v := range countersBy("muster_gang_rejections_total", "cause", nil) {
			out["muster_plans_dropped_"+cause] = v
		}
	}
	if usesPodGroups(m.scheduler) {
		for result, v := range countersBy("scheduler_podgroup_schedule_attempts_total", "result", profile) {
			out["podgroup_attempts_"+result] = v
		}
	}
	return out
}

// evictionsInFlight counts preemptions whose victims are still being
// deleted: muster's eviction goroutines, and kube-scheduler's asynchronous
// preemptions (started when their victims are counted, done when the
// goroutine's execution is counted).
func (m *schedMetrics) evictionsInFlight() (float64, error) {
	if isMuster(m.scheduler) {
		return testutil.GetGaugeMetricValue(schedmetrics.Goroutines.WithLabelValues(mustergang.EvictionOperation))
	}
	// Read the series themselves: gathering the whole registry, as the
	// readers by name do, on every poll of the settle loop took CPU from
	// the scheduler it was waiting for.
	started := histogramCount(schedmetrics.PreemptionVictims) + histogramCount(schedmetrics.WorkloadPreemptionVictims)
	done := 0.0
	for _, result := range []string{schedmetrics.GoroutineResultSuccess, schedmetrics.GoroutineResultError} {
		v, err := testutil.GetCounterMetricValue(schedmetrics.PreemptionGoroutinesExecutionTotal.WithLabelValues(result))
		if err != nil {
			return 0, err
		}
		done += v
	}
	return started - done - m.preemptionsBefore, nil
}

// histogramCount is a histogram's number of observations (0 while it is not
// registered: WorkloadPreemptionVictims needs GenericWorkload).
func histogramCount(h *k8smetrics.Histogram) float64 {
	if h == nil {
		return 0
	}
	if _, registered := h.ObserverMetric.(k8smetrics.Metric); !registered {
		return 0
	}
	n, err := testutil.GetHistogramMetricCount(h.ObserverMetric)
	if err != nil {
		return 0
	}
	return float64(n)
}
