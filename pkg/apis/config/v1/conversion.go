package v1

import (
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// Convert_v1_MusterGangArgs_To_config_MusterGangArgs converts defaulted v1
// args to the internal form.
func Convert_v1_MusterGangArgs_To_config_MusterGangArgs(in *MusterGangArgs, out *config.MusterGangArgs) error {
	out.DefaultScheduleTimeoutSeconds = ptr.Deref(in.DefaultScheduleTimeoutSeconds, 0)
	out.GangBackoffSeconds = ptr.Deref(in.GangBackoffSeconds, 0)
	out.GPUResourceName = ptr.Deref(in.GPUResourceName, "")
	out.TopologyPreset = ptr.Deref(in.TopologyPreset, "")
	out.TopologyLevels = nil
	for _, l := range in.TopologyLevels {
		out.TopologyLevels = append(out.TopologyLevels, config.TopologyLevel{Name: l.Name, NodeLabel: l.NodeLabel})
	}
	out.PreemptibleNodeMatchers = nil
	for _, m := range in.PreemptibleNodeMatchers {
		out.PreemptibleNodeMatchers = append(out.PreemptibleNodeMatchers,
			config.NodeMatcher{Source: config.NodeMatcherSource(m.Source), Key: m.Key, Value: m.Value})
	}
	out.ReclaimTaintKeys = append([]string(nil), in.ReclaimTaintKeys...)
	out.GangPreemption = ptr.Deref(in.GangPreemption, false)
	return nil
}

// Convert_config_MusterGangArgs_To_v1_MusterGangArgs converts internal args
// back to v1.
func Convert_config_MusterGangArgs_To_v1_MusterGangArgs(in *config.MusterGangArgs, out *MusterGangArgs) error {
	out.DefaultScheduleTimeoutSeconds = ptr.To(in.DefaultScheduleTimeoutSeconds)
	out.GangBackoffSeconds = ptr.To(in.GangBackoffSeconds)
	out.GPUResourceName = ptr.To(in.GPUResourceName)
	if in.TopologyPreset != "" {
		out.TopologyPreset = ptr.To(in.TopologyPreset)
	}
	out.TopologyLevels = nil
	for _, l := range in.TopologyLevels {
		out.TopologyLevels = append(out.TopologyLevels, TopologyLevel{Name: l.Name, NodeLabel: l.NodeLabel})
	}
	out.PreemptibleNodeMatchers = nil
	for _, m := range in.PreemptibleNodeMatchers {
		out.PreemptibleNodeMatchers = append(out.PreemptibleNodeMatchers, NodeMatcher{Source: string(m.Source), Key: m.Key, Value: m.Value})
	}
	out.ReclaimTaintKeys = append([]string(nil), in.ReclaimTaintKeys...)
	out.GangPreemption = ptr.To(in.GangPreemption)
	return nil
}
