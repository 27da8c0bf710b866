package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the group version of KubeSchedulerConfiguration v1.
var SchemeGroupVersion = schema.GroupVersion{Group: "kubescheduler.config.k8s.io", Version: "v1"}

var (
	// localSchemeBuilder is extended by the generated conversion code.
	localSchemeBuilder = &runtime.SchemeBuilder{}
	// AddToScheme registers the v1 args with their defaults and conversions.
	AddToScheme = localSchemeBuilder.AddToScheme
)

func init() {
	localSchemeBuilder.Register(addKnownTypes, RegisterDefaults)
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &MusterGangArgs{})
	return nil
}
