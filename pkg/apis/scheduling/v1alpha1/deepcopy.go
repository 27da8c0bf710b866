package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies in into out.
func (in *PodGroup) DeepCopyInto(out *PodGroup) {
	*out = *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.MinResources != nil {
		out.Spec.MinResources = make(corev1.ResourceList, len(in.Spec.MinResources))
		for k, v := range in.Spec.MinResources {
			out.Spec.MinResources[k] = v.DeepCopy()
		}
	}
	if in.Spec.ScheduleTimeoutSeconds != nil {
		v := *in.Spec.ScheduleTimeoutSeconds
		out.Spec.ScheduleTimeoutSeconds = &v
	}
	if in.Status.ScheduleStartTime != nil {
		out.Status.ScheduleStartTime = in.Status.ScheduleStartTime.DeepCopy()
	}
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy returns a deep copy.
func (in *PodGroup) DeepCopy() *PodGroup {
	if in == nil {
		return nil
	}
	out := new(PodGroup)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *PodGroup) DeepCopyObject() runtime.Object { return in.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (in *PodGroupList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := &PodGroupList{TypeMeta: in.TypeMeta}
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range in.Items {
		out.Items = append(out.Items, *in.Items[i].DeepCopy())
	}
	return out
}
