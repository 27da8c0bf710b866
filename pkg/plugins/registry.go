// Package plugins lists muster's scheduler plugins: the one registry the
// scheduler command and the simulator build their frameworks from.
package plugins

import (
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

// Registry returns muster's out-of-tree plugins by name.
func Registry() frameworkruntime.Registry {
	return frameworkruntime.Registry{mustergang.Name: mustergang.New}
}

// WithMusterPlugins registers every plugin of Registry with kube-scheduler's
// command.
func WithMusterPlugins() app.Option {
	return func(into frameworkruntime.Registry) error {
		return into.Merge(Registry())
	}
}
