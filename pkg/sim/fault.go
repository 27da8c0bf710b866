package sim

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"
)

// ReserveFault decides whether one reservation fails: asked with the pod,
// its node and the virtual time. A non-nil error fails it.
type ReserveFault func(pod *v1.Pod, node string, now time.Time) error

// reserveFaultName is the plugin that carries a ReserveFault. It exists only
// in simulator runs that ask for it (tests); the shipped profile never has it.
const reserveFaultName = "SimReserveFault"

// reserveFaultPlugin fails the reservations its fault picks, as another
// plugin's Reserve failing would (a volume that can no longer be assumed, a
// claim taken meanwhile). It runs after MusterGang's Reserve, so the framework
// unreserves the member in MusterGang too, and muster drops the gang's plan
// and backs the gang off: the simulator has no other way to make muster drop
// a plan (a failed binding comes after the gang is released; see
// TestBindFailuresAreRetried).
type reserveFaultPlugin struct {
	fault ReserveFault
	clock clock.PassiveClock
}

var _ fwk.ReservePlugin = &reserveFaultPlugin{}

func (f *reserveFaultPlugin) Name() string { return reserveFaultName }

func (f *reserveFaultPlugin) Reserve(_ context.Context, _ fwk.CycleState, pod *v1.Pod, node string) *fwk.Status {
	if err := f.fault(pod, node, f.clock.Now()); err != nil {
		return fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	return nil
}

func (f *reserveFaultPlugin) Unreserve(context.Context, fwk.CycleState, *v1.Pod, string) {}

// addReserveFault enables the fault plugin at the Reserve extension point of
// profile (after the plugins enabled for every point, MusterGang among them)
// and registers it in registry.
func addReserveFault(profile *schedulerapi.KubeSchedulerProfile, registry frameworkruntime.Registry, c clock.PassiveClock, fault ReserveFault) error {
	profile.Plugins.Reserve.Enabled = append(profile.Plugins.Reserve.Enabled, schedulerapi.Plugin{Name: reserveFaultName})
	return registry.Register(reserveFaultName, func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) {
		return &reserveFaultPlugin{fault: fault, clock: c}, nil
	})
}
