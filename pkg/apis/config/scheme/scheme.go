// Package scheme registers muster's plugin args (internal and v1) into the two
// schemes kube-scheduler uses for pluginConfig: the one that decodes the
// configuration file and the one that defaults and converts plugin args.
// Importing it is enough; the plugin package does.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	kubeschedulerv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"

	"github.com/muster-sched/muster/pkg/apis/config"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

func init() {
	AddToScheme(kubeschedulerscheme.Scheme)
	AddToScheme(kubeschedulerv1.GetPluginArgConversionScheme())
}

// AddToScheme registers the internal and v1 args into s.
func AddToScheme(s *runtime.Scheme) {
	utilruntime.Must(config.AddToScheme(s))
	utilruntime.Must(configv1.AddToScheme(s))
}
