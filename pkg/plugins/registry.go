// Package plugins lists muster's scheduler plugins for kube-scheduler's
// command.
package plugins

import (
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

// WithMusterPlugins registers every muster plugin with kube-scheduler.
func WithMusterPlugins() app.Option {
	return app.WithPlugin(mustergang.Name, mustergang.New)
}
