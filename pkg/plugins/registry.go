// Package plugins lists muster's scheduler plugins: the one registry the
// scheduler command and the simulator build their frameworks from.
package plugins

import (
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/utils/clock"

	"github.com/muster-sched/muster/pkg/plugins/binpack"
	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

// Option changes how Registry builds the plugins.
type Option func(*options)

type options struct {
	clock clock.WithDelayedExecution
}

// WithClock runs the plugins on c instead of the real clock: the
// simulator's virtual clock, which its scheduling queue also follows.
func WithClock(c clock.WithDelayedExecution) Option {
	return func(o *options) { o.clock = c }
}

// Registry returns muster's out-of-tree plugins by name.
func Registry(opts ...Option) frameworkruntime.Registry {
	o := options{clock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	return frameworkruntime.Registry{
		mustergang.Name: mustergang.Factory(o.clock),
		binpack.Name:    binpack.New,
	}
}
