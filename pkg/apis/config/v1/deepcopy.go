package v1

import "k8s.io/apimachinery/pkg/runtime"

// DeepCopyInto copies every field, pointers and slices included.
func (in *MusterGangArgs) DeepCopyInto(out *MusterGangArgs) {
	*out = *in
	if in.DefaultScheduleTimeoutSeconds != nil {
		v := *in.DefaultScheduleTimeoutSeconds
		out.DefaultScheduleTimeoutSeconds = &v
	}
	if in.GangBackoffSeconds != nil {
		v := *in.GangBackoffSeconds
		out.GangBackoffSeconds = &v
	}
	if in.GPUResourceName != nil {
		v := *in.GPUResourceName
		out.GPUResourceName = &v
	}
	if in.TopologyPreset != nil {
		v := *in.TopologyPreset
		out.TopologyPreset = &v
	}
	if in.GangPreemption != nil {
		v := *in.GangPreemption
		out.GangPreemption = &v
	}
	out.TopologyLevels = append([]TopologyLevel(nil), in.TopologyLevels...)
	out.PreemptibleNodeMatchers = append([]NodeMatcher(nil), in.PreemptibleNodeMatchers...)
	out.ReclaimTaintKeys = append([]string(nil), in.ReclaimTaintKeys...)
}

// DeepCopy returns a deep copy.
func (in *MusterGangArgs) DeepCopy() *MusterGangArgs {
	if in == nil {
		return nil
	}
	out := new(MusterGangArgs)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *MusterGangArgs) DeepCopyObject() runtime.Object {
	return in.DeepCopy()
}
