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
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/muster-sched/muster/manifests"
	_ "github.com/muster-sched/muster/pkg/apis/config/scheme" // MusterGangArgs decode from the shipped file
	"github.com/muster-sched/muster/pkg/plugins"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

// The schedulers a run can compare.
const (
	// Muster is cmd/scheduler: the shipped scheduler-config.yaml with the
	// MusterGang plugin.
	Muster = "muster"
	// Default is kube-scheduler's default profile (no gang scheduling).
	Default = "default"
	// NativeGang is the default profile with the GenericWorkload feature gate
	// on: kube-scheduler 1.37's own gang scheduling of scheduling.k8s.io/v1beta1
	// PodGroups.
	NativeGang = "native-gang"
)

// Schedulers lists every known scheduler in report order.
var Schedulers = []string{Muster, Default, NativeGang}

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
}

// MusterConfig decodes the shipped KubeSchedulerConfiguration the way
// kube-scheduler's --config does (defaults applied, muster's args decoded by
// the scheme muster registers) and validates it.
func MusterConfig() (*schedulerapi.KubeSchedulerConfiguration, error) {
	data, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		return nil, err
	}
	obj, gvk, err := schedulerscheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", manifests.SchedulerConfig, err)
	}
	cfg, ok := obj.(*schedulerapi.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("%s: got %s, want KubeSchedulerConfiguration", manifests.SchedulerConfig, gvk)
	}
	cfg.TypeMeta.APIVersion = gvk.GroupVersion().String()
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", manifests.SchedulerConfig, err)
	}
	return cfg, nil
}

// ensureGate sets the feature gates each scheduler runs with: muster's
// defaults (schedulercmd.SetFeatureDefaults, as cmd/scheduler sets them) for
// muster, GenericWorkload for native-gang; and it refuses to run the others
// with GenericWorkload on: the gates are process-wide and it changes the
// default profile (GangScheduling joins it), so each scheduler runs in its
// own process.
func ensureGate(name string) error {
	on := utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload)
	switch {
	case name == NativeGang && !on:
		return utilfeature.DefaultMutableFeatureGate.Set(string(features.GenericWorkload) + "=true")
	case name != NativeGang && on:
		return fmt.Errorf("scheduler %s cannot run in a process where %s is on; run it in its own process", name, features.GenericWorkload)
	case name == Muster:
		return schedulercmd.SetFeatureDefaults()
	}
	return nil
}

// buildScheduler constructs the named scheduler on the simulator's client and
// informers. Every profile emits events into a recorder that drops them: a
// FakeRecorder with a nil channel (one with a channel nobody reads blocks the
// binding goroutine).
// The scheduling queue follows virtualClock; muster's plugin does too,
// through a pluginClock that tracks its timers.
func buildScheduler(ctx context.Context, name string, client kubernetes.Interface, factory informers.SharedInformerFactory, virtualClock *clocktesting.FakeClock) (*built, error) {
	if err := ensureGate(name); err != nil {
		return nil, err
	}
	recorders := profile.RecorderFactory(func(string) events.EventRecorderLogger { return &events.FakeRecorder{} })
	opts := []scheduler.Option{scheduler.WithClock(virtualClock)}
	b := &built{schedulerName: v1.DefaultSchedulerName, podGroups: name == NativeGang}
	if name == Muster {
		cfg, err := MusterConfig()
		if err != nil {
			return nil, err
		}
		b.schedulerName = cfg.Profiles[0].SchedulerName
		b.pluginTimers = newPluginClock(virtualClock)
		// The options kube-scheduler's app.Setup passes, which cmd/scheduler
		// runs; Setup itself cannot be used here, because it builds its own
		// clients and clock. Without a kubeconfig the plugin skips its
		// PodGroup informer; the simulator's gangs are Jobs.
		opts = append(opts,
			scheduler.WithComponentConfigVersion(cfg.TypeMeta.APIVersion),
			scheduler.WithProfiles(cfg.Profiles...),
			scheduler.WithPercentageOfNodesToScore(cfg.PercentageOfNodesToScore),
			scheduler.WithFrameworkOutOfTreeRegistry(plugins.Registry(plugins.WithClock(b.pluginTimers))),
			scheduler.WithPodMaxBackoffSeconds(cfg.PodMaxBackoffSeconds),
			scheduler.WithPodInitialBackoffSeconds(cfg.PodInitialBackoffSeconds),
			scheduler.WithExtenders(cfg.Extenders...),
			scheduler.WithParallelism(cfg.Parallelism),
		)
	}
	sched, err := scheduler.New(ctx, client, factory, nil, recorders, opts...)
	if err != nil {
		return nil, fmt.Errorf("building scheduler %s: %w", name, err)
	}
	b.sched = sched
	return b, nil
}
