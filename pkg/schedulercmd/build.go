package schedulercmd

import (
	"context"
	"fmt"

	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	schedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"k8s.io/kubernetes/pkg/scheduler/backend/queue"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/plugins"
)

// Options are what differs between the places that build a scheduler with
// muster's plugins: the command (through kube-scheduler's app.Setup), the
// control plane of the demo and the integration tests (Start), and the
// simulator, which runs on a fake client and a virtual clock.
type Options struct {
	// Config is a decoded, defaulted and validated KubeSchedulerConfiguration
	// (DecodeConfig). Nil: kube-scheduler's default profile, as scheduler.New
	// builds it when given no profiles, and none of the configuration's
	// other settings.
	Config *schedulerapi.KubeSchedulerConfiguration
	// PluginClock runs muster's plugins' timers (nil: the real clock).
	PluginClock clock.WithDelayedExecution
	// ExtraPlugins are registered beside muster's (the simulator's fault
	// injection); a name muster's registry has already is an error.
	ExtraPlugins frameworkruntime.Registry
	// QueueClock is the scheduling queue's clock (nil: the real clock).
	QueueClock clock.WithTicker

	Client             kubernetes.Interface
	InformerFactory    informers.SharedInformerFactory
	DynInformerFactory dynamicinformer.DynamicSharedInformerFactory // optional
	// KubeConfig lets plugins reach the API server themselves (optional;
	// without it muster's plugin does not watch scheduler-plugins PodGroups).
	KubeConfig *restclient.Config
	Recorders  profile.RecorderFactory
}

// Build constructs the scheduler: scheduler.New with the options Options and
// its configuration call for.
func Build(ctx context.Context, o Options) (*scheduler.Scheduler, error) {
	opts, err := schedulerOptions(o)
	if err != nil {
		return nil, err
	}
	return scheduler.New(ctx, o.Client, o.InformerFactory, o.DynInformerFactory, o.Recorders, opts...)
}

// schedulerOptions turns o into scheduler.New's options. They are the ones
// kube-scheduler's app.Setup passes (k8s.io/kubernetes/cmd/kube-scheduler/
// app/server.go; TestBuildPassesTheOptionsAppSetupPasses compares the two
// lists), so a scheduler built here runs a profile as the command runs it;
// the command itself keeps app.Setup, which builds its own clients from its
// flags.
func schedulerOptions(o Options) ([]scheduler.Option, error) {
	var clockOpts []plugins.Option
	if o.PluginClock != nil {
		clockOpts = append(clockOpts, plugins.WithClock(o.PluginClock))
	}
	registry := plugins.Registry(clockOpts...)
	if err := registry.Merge(o.ExtraPlugins); err != nil {
		return nil, err
	}
	var opts []scheduler.Option
	if o.QueueClock != nil {
		opts = append(opts, scheduler.WithClock(o.QueueClock))
	}
	if o.KubeConfig != nil {
		opts = append(opts, scheduler.WithKubeConfig(o.KubeConfig))
	}
	opts = append(opts, scheduler.WithFrameworkOutOfTreeRegistry(registry))
	// app.Setup passes its deprecated flag's value, whose default this is;
	// no configuration field sets it.
	opts = append(opts, scheduler.WithPodMaxInUnschedulablePodsDuration(queue.DefaultPodMaxInUnschedulablePodsDuration))
	if cfg := o.Config; cfg != nil {
		opts = append(opts,
			scheduler.WithComponentConfigVersion(cfg.TypeMeta.APIVersion),
			scheduler.WithProfiles(cfg.Profiles...),
			scheduler.WithPercentageOfNodesToScore(cfg.PercentageOfNodesToScore),
			scheduler.WithPodMaxBackoffSeconds(cfg.PodMaxBackoffSeconds),
			scheduler.WithPodInitialBackoffSeconds(cfg.PodInitialBackoffSeconds),
			scheduler.WithExtenders(cfg.Extenders...),
			scheduler.WithParallelism(cfg.Parallelism),
		)
	}
	return opts, nil
}

// registryOption registers muster's plugins (plugins.Registry, on the real
// clock) with kube-scheduler's app (the command and Start).
func registryOption() app.Option {
	return func(into frameworkruntime.Registry) error {
		return into.Merge(plugins.Registry())
	}
}

// DecodeConfig decodes a KubeSchedulerConfiguration as kube-scheduler's
// --config does (defaults applied; muster's plugin args decode through the
// scheme its plugin package registers) and validates it.
func DecodeConfig(data []byte, source string) (*schedulerapi.KubeSchedulerConfiguration, error) {
	obj, gvk, err := schedulerscheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", source, err)
	}
	cfg, ok := obj.(*schedulerapi.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("%s: got %s, want KubeSchedulerConfiguration", source, gvk)
	}
	cfg.TypeMeta.APIVersion = gvk.GroupVersion().String()
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return cfg, nil
}
