package tfconfig

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Reconcile results, the values of the result label of muster_tfconfig_reconciles_total.
const (
	resultSynced   = "synced"   // Secret (and Service) as they should be
	resultInvalid  = "invalid"  // the workload cannot be served; Warning Event
	resultWaiting  = "waiting"  // the workload's group lacks a role, or a StatefulSet is scaled to zero
	resultConflict = "conflict" // a Secret or Service of that name belongs to someone else
	resultCleaned  = "cleaned"  // the workload is gone; what it owned was deleted
	resultError    = "error"    // API error; retried with backoff
)

var (
	reconcilesTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      "muster",
		Name:           "tfconfig_reconciles_total",
		Help:           "Reconciles of TF_CONFIG Jobs and StatefulSets by result (synced, invalid, waiting, conflict, cleaned, error).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})

	secretWritesTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      "muster",
		Name:           "tfconfig_secret_writes_total",
		Help:           "TF_CONFIG Secret writes, by operation: apply (server-side apply, a no-op when nothing changed), release (fields applied to someone else's Secret given back), delete.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation"})

	serviceWritesTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      "muster",
		Name:           "tfconfig_service_writes_total",
		Help:           "Headless Services written for TF_CONFIG Jobs and StatefulSets, by operation (create, update, delete).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"operation"})

	registerMetrics sync.Once
)

// RegisterMetrics registers the controller's metrics in the legacy registry; NewController calls it.
func RegisterMetrics() {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(reconcilesTotal, secretWritesTotal, serviceWritesTotal)
	})
}
