package v1

import (
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// SchemeGroupVersion is the group version of KubeSchedulerConfiguration v1.
var SchemeGroupVersion = schema.GroupVersion{Group: "kubescheduler.config.k8s.io", Version: "v1"}

var (
	localSchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes, addDefaultingFuncs, addConversionFuncs)
	// AddToScheme registers the v1 args with defaults and conversions.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &MusterGangArgs{})
	return nil
}

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	scheme.AddTypeDefaultingFunc(&MusterGangArgs{}, func(obj interface{}) { SetDefaults_MusterGangArgs(obj.(*MusterGangArgs)) })
	return nil
}

func addConversionFuncs(scheme *runtime.Scheme) error {
	if err := scheme.AddConversionFunc((*MusterGangArgs)(nil), (*config.MusterGangArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		return Convert_v1_MusterGangArgs_To_config_MusterGangArgs(a.(*MusterGangArgs), b.(*config.MusterGangArgs))
	}); err != nil {
		return err
	}
	return scheme.AddConversionFunc((*config.MusterGangArgs)(nil), (*MusterGangArgs)(nil), func(a, b interface{}, _ conversion.Scope) error {
		return Convert_config_MusterGangArgs_To_v1_MusterGangArgs(a.(*config.MusterGangArgs), b.(*MusterGangArgs))
	})
}
