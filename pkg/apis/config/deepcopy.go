package config

import "k8s.io/apimachinery/pkg/runtime"

// DeepCopyInto copies every field, including the slices, into out.
func (in *MusterGangArgs) DeepCopyInto(out *MusterGangArgs) {
	*out = *in
	out.TypeMeta = in.TypeMeta
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
