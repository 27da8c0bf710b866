package sim

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

// The schedulers a run can compare.
const (
	// Muster is cmd/scheduler: the shipped scheduler-config.yaml with the
	// MusterGang plugin.
	Muster = "muster"
	// MusterNative is Muster with the GenericWorkload and
	// TopologyAwareWorkloadScheduling feature gates on, gang-scheduling the
	// same native scheduling.k8s.io/v1beta1 PodGroups as NativeGang (one per
	// job, no topology constraint, pods naming it in spec.schedulingGroup):
	// the core runs its pod-group cycle and MusterGang plans each group.
	MusterNative = "muster-native"
	// Default is kube-scheduler's default profile (no gang scheduling).
	Default = "default"
	// DefaultMostAllocated is the default profile with NodeResourcesFit
	// scoring MostAllocated, nvidia.com/gpu weighted as in muster's profile,
	// and no gang logic: it separates packing from gang logic.
	DefaultMostAllocated = "default-mostallocated"
	// NativeGang is the default profile with the GenericWorkload feature gate
	// on: kube-scheduler 1.37's own gang scheduling of scheduling.k8s.io/v1beta1
	// PodGroups.
	NativeGang = "native-gang"
	// NativeGangTAS is NativeGang with TopologyAwareWorkloadScheduling (alpha
	// in 1.36 and 1.37) on and each PodGroup constrained to one rack, or to
	// one zone when the gang needs more GPUs than a rack has.
	NativeGangTAS = "native-gang-tas"
	// None schedules nothing: the harness binds each pod itself as it
	// creates it (first fit) while kube-scheduler's default profile runs
	// with nothing to schedule. It measures the harness's own cost; it runs
	// only scenarios in which every pod fits on arrival.
	None = "none"
)

// Schedulers lists every known scheduler in report order.
var Schedulers = []string{Muster, MusterNative, Default, DefaultMostAllocated, NativeGang, NativeGangTAS, None}

// StandardSchedulers are the ones compared unless told otherwise.
var StandardSchedulers = []string{Muster, Default, DefaultMostAllocated, NativeGang, NativeGangTAS}

// usesPodGroups: the scheduler gang-schedules native PodGroups.
func usesPodGroups(name string) bool {
	return name == NativeGang || name == NativeGangTAS || name == MusterNative
}

// isMuster: the scheduler is muster's (profile, MusterGang, its clock).
func isMuster(name string) bool { return name == Muster || name == MusterNative }

// ParseSchedulers reads a comma-separated list and checks every name.
func ParseSchedulers(list string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		known := false
		for _, s := range Schedulers {
			known = known || s == name
		}
		if !known {
			return nil, fmt.Errorf("unknown scheduler %q (known: %s)", name, strings.Join(Schedulers, ", "))
		}
		if !seen[name] {
			out = append(out, name)
			seen[name] = true
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scheduler named")
	}
	return out, nil
}

// built is a constructed scheduler and what the simulator needs to know of it.
type built struct {
	sched *scheduler.Scheduler
	// schedulerName goes into the pods' spec.schedulerName.
	schedulerName string
	// podGroups: create a v1beta1 PodGroup per job and reference it from pods.
	podGroups bool
	// pluginTimers: muster's plugin runs its timers (gang backoff, plan
	// deadlines, node avoidance) on this virtual clock; nil for the others.
	pluginTimers *pluginClock
	// rackConstraints: PodGroups carry a topology constraint (TAS).
	rackConstraints bool
}

// MusterConfig decodes the shipped KubeSchedulerConfiguration the way
// kube-scheduler's --config does (defaults applied, muster's args decoded by
// the scheme muster registers) and validates it.
func MusterConfig() (*schedulerapi.KubeSchedulerConfiguration, error) {
	data, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		return nil, err
	}
	return schedulercmd.DecodeConfig(data, manifests.SchedulerConfig)
}

// mostAllocatedConfig is the default profile with NodeResourcesFit scoring
// MostAllocated on the weights muster's shipped profile gives MusterBinPack.
const mostAllocatedConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: nvidia.com/gpu
          weight: 5
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
`

// ensureGate sets the feature gates each scheduler runs with: the gates
// muster changes for the framework's own plugins for every scheduler
// (schedulercmd.ComparisonFeatureGates), muster's defaults
// (schedulercmd.SetFeatureDefaults, as cmd/scheduler sets them) for
// muster, FeatureGates last for every one, GenericWorkload for native gang scheduling and
// TopologyAwareWorkloadScheduling as well for its TAS variant and for
// muster on native PodGroups (both, and muster's defaults). It refuses to
// run a scheduler in a process whose gates another one changed: the gates
// are process-wide and change the default profile (GangScheduling and
// TopologyPlacement join it), so each scheduler runs in its own process.
func ensureGate(name string) error {
	for _, g := range []struct {
		gate featuregate.Feature
		on   bool
	}{
		{features.GenericWorkload, usesPodGroups(name)},
		{features.TopologyAwareWorkloadScheduling, name == NativeGangTAS || name == MusterNative},
	} {
		switch enabled := utilfeature.DefaultFeatureGate.Enabled(g.gate); {
		case g.on && !enabled:
			if err := utilfeature.DefaultMutableFeatureGate.Set(string(g.gate) + "=true"); err != nil {
				return err
			}
		case !g.on && enabled:
			return fmt.Errorf("scheduler %s cannot run in a process where %s is on; run it in its own process", name, g.gate)
		}
	}
	// The framework's plugins decide alike for every scheduler compared:
	// the gates muster changes for them are set for all.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(schedulercmd.ComparisonFeatureGates()); err != nil {
		return err
	}
	if isMuster(name) {
		if err := schedulercmd.SetFeatureDefaults(); err != nil {
			return err
		}
	}
	if FeatureGates != "" {
		return utilfeature.DefaultMutableFeatureGate.Set(FeatureGates)
	}
	return nil
}

// FeatureGates are kube-scheduler feature gates (key=value,...) set last,
// over muster's defaults, for whichever scheduler this process runs
// (muster-sim --feature-gates).
var FeatureGates string

// buildScheduler constructs the named scheduler on the simulator's client and
// informers (schedulercmd.Build, as for every scheduler with muster's
// plugins). Every profile emits events into a recorder that drops them: a
// FakeRecorder with a nil channel (one with a channel nobody reads blocks the
// binding goroutine).
// The scheduling queue follows virtualClock; muster's plugin does too,
// through a pluginClock that tracks its timers. A reserveFault (muster only,
// tests) adds the plugin that fails the reservations it picks.
func buildScheduler(ctx context.Context, name string, client kubernetes.Interface, factory informers.SharedInformerFactory, virtualClock *clocktesting.FakeClock,
	reserveFault ReserveFault) (*built, error) {
	if err := ensureGate(name); err != nil {
		return nil, err
	}
	o := schedulercmd.Options{
		Client: client, InformerFactory: factory, QueueClock: virtualClock,
		Recorders: profile.RecorderFactory(func(string) events.EventRecorderLogger { return &events.FakeRecorder{} }),
	}
	b := &built{schedulerName: v1.DefaultSchedulerName, podGroups: usesPodGroups(name),
		rackConstraints: name == NativeGangTAS}
	switch name {
	case DefaultMostAllocated:
		cfg, err := schedulercmd.DecodeConfig([]byte(mostAllocatedConfig), DefaultMostAllocated)
		if err != nil {
			return nil, err
		}
		o.Config = cfg
	case Muster, MusterNative:
		cfg, err := MusterConfig()
		if err != nil {
			return nil, err
		}
		o.Config = cfg
		b.schedulerName = cfg.Profiles[0].SchedulerName
		b.pluginTimers = newPluginClock(virtualClock)
		o.PluginClock = b.pluginTimers
		if reserveFault != nil {
			o.ExtraPlugins = frameworkruntime.Registry{}
			if err := addReserveFault(&cfg.Profiles[0], o.ExtraPlugins, virtualClock, reserveFault); err != nil {
				return nil, err
			}
		}
		// Without a kubeconfig the plugin skips its informer of
		// scheduler-plugins PodGroups; the simulator's gangs are Jobs, and
		// for MusterNative scheduling.k8s.io PodGroups, which the plugin
		// reads from the framework's own PodGroup state.
	}
	sched, err := schedulercmd.Build(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("building scheduler %s: %w", name, err)
	}
	b.sched = sched
	return b, nil
}
