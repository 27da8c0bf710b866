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
	reconcilesTotal = newCounterVec("tfconfig_reconciles_total",
		"Reconciles of TF_CONFIG Jobs and StatefulSets by result (synced, invalid, waiting, conflict, cleaned, error).",
		"result")

	secretWritesTotal = newCounterVec("tfconfig_secret_writes_total",
		"TF_CONFIG Secret writes, by operation: apply (server-side apply, a no-op when nothing changed), release (fields applied to someone else's Secret given back), delete.",
		"operation")

	serviceWritesTotal = newCounterVec("tfconfig_service_writes_total",
		"Headless Services written for TF_CONFIG Jobs and StatefulSets, by operation (create, update, delete).",
		"operation")

	registerMetrics sync.Once
)

// newCounterVec makes an ALPHA counter vector of subsystem muster.
func newCounterVec(name, help string, labels ...string) *metrics.CounterVec {
	return metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      "muster",
		Name:           name,
		Help:           help,
		StabilityLevel: metrics.ALPHA,
	}, labels)
}

// RegisterMetrics registers the controller's metrics in the legacy registry; NewController calls it.
func RegisterMetrics() {
	registerMetrics.Do(func() {
		legacyregistry.MustRegister(reconcilesTotal, secretWritesTotal, serviceWritesTotal)
	})
}
