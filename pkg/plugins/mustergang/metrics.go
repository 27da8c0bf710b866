package mustergang

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics on the scheduler's /metrics, subsystem muster. Per-plugin latency
// is already measured by the framework.
var (
	gangsScheduled = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gangs_scheduled_total", StabilityLevel: metrics.ALPHA,
		Help: "Gangs whose planned members were all reserved and released to bind.",
	})
	gangLatency = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "muster", Name: "gang_scheduling_duration_seconds", StabilityLevel: metrics.ALPHA,
		Help:    "Time from a gang's first member being seen to the whole gang being released to bind.",
		Buckets: metrics.ExponentialBuckets(0.01, 2, 18),
	})
	planDuration = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "muster", Name: "gang_plan_duration_seconds", StabilityLevel: metrics.ALPHA,
		Help:    "Time to compute one whole-gang placement plan.",
		Buckets: metrics.ExponentialBuckets(0.0001, 2, 16),
	})
	unplaceable = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_unplaceable_total", StabilityLevel: metrics.ALPHA,
		Help: "Planning attempts that found no placement for the whole gang.",
	})
	timeouts = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_timeouts_total", StabilityLevel: metrics.ALPHA,
		Help: "Gang plans dropped because not every member was reserved before the deadline.",
	})
	rejections = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_rejections_total", StabilityLevel: metrics.ALPHA,
		Help: "Gang plans dropped, by cause (timeout, rejected, member_deleted, plan_broken).",
	}, []string{"cause"})
	wakes = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_wakes_total", StabilityLevel: metrics.ALPHA,
		Help: "Times muster moved a gang's pending pods to the active queue itself, outside the framework's queueing hints, by reason.",
	}, []string{"reason"})

	preemptions = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_preemptions_total", StabilityLevel: metrics.ALPHA,
		Help: "Preemptions carried out for a gang (or a pod scheduled alone): each evicts whole lower-priority gangs or lone pods.",
	})
	preemptedGPUs = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "muster", Name: "gang_preempted_gpus_total", StabilityLevel: metrics.ALPHA,
		Help: "GPUs requested by the pods evicted by preemption.",
	})

	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(gangsScheduled, gangLatency, planDuration, unplaceable, timeouts, rejections, wakes, preemptions, preemptedGPUs)
	})
}
