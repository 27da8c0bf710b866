package mustergang

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics on the scheduler's /metrics, subsystem muster. Per-plugin latency
// is already measured by the framework.
var (
	gangsScheduled = newCounter("gangs_scheduled_total",
		"Gangs whose planned members were all reserved and released to bind.")
	gangLatency = newHistogram("gang_scheduling_duration_seconds",
		"Time from a gang's first member being seen to the whole gang being released to bind.",
		metrics.ExponentialBuckets(0.01, 2, 18))
	planDuration = newHistogram("gang_plan_duration_seconds",
		"Time to compute one whole-gang placement plan.",
		metrics.ExponentialBuckets(0.0001, 2, 16))
	plansInstalled = newCounter("gang_plans_total",
		"Gang plans installed (each holds its slots until its members are reserved or it is dropped). Beside gang_rejections_total{cause=\"plan_broken\"} and {cause=\"rejected\"}, it says how often a member's own scheduling cycle refused what the plan's dry run accepted.")
	unplaceable = newCounter("gang_unplaceable_total",
		"Planning attempts that found no placement for the whole gang.")
	rejections = newCounterVec("gang_rejections_total",
		"Gang plans dropped, by cause (timeout: not every member was reserved before the deadline; rejected, member_deleted, plan_broken, node_changed, displaced, quorum_raised).", "cause")
	wakes = newCounterVec("gang_wakes_total",
		"Times muster moved a gang's pending pods to the active queue itself, outside the framework's queueing hints, by reason.", "reason")

	preemptions = newCounter("gang_preemptions_total",
		"Preemptions carried out for a gang (or a pod scheduled alone): each evicts whole lower-priority gangs or lone pods.")
	preemptedGPUs = newCounter("gang_preempted_gpus_total",
		"GPUs requested by the pods evicted by preemption.")
	preemptionChecks = newHistogram("gang_preemption_dry_runs",
		"Plans tried (each with the framework's filters) by one victim search.",
		metrics.ExponentialBuckets(1, 2, 10))
	evictionErrors = newCounter("gang_eviction_errors_total",
		"Failed attempts to delete a preemption victim (each is retried while the preemptor's plan waits).")

	registerOnce sync.Once
)

// newCounter, newCounterVec and newHistogram make an ALPHA metric of
// subsystem muster.
func newCounter(name, help string) *metrics.Counter {
	return metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: name, StabilityLevel: metrics.ALPHA, Help: help,
	})
}

func newCounterVec(name, help string, labels ...string) *metrics.CounterVec {
	return metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "muster", Name: name, StabilityLevel: metrics.ALPHA, Help: help,
	}, labels)
}

func newHistogram(name, help string, buckets []float64) *metrics.Histogram {
	return metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "muster", Name: name, StabilityLevel: metrics.ALPHA, Help: help, Buckets: buckets,
	})
}

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(gangsScheduled, gangLatency, planDuration, plansInstalled, unplaceable, rejections, wakes, preemptions, preemptedGPUs, preemptionChecks, evictionErrors)
	})
}
