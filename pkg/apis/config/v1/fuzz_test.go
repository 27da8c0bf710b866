package v1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// Any args: defaulting and validation never panic, and every rejection
// carries a field path under args.
func FuzzValidateArgs(f *testing.F) {
	f.Add(int64(120), int64(5), "nvidia.com/gpu", "", "rack", "topology.kubernetes.io/rack", "Label", "k", "v", "taint")
	f.Add(int64(0), int64(-1), "", "azure", "", "", "Annotation", "", "", "")
	f.Add(int64(901), int64(4000), "a/b/c", "gke", "Rack", "-x", "Taint", "bad key", "bad value", "x y")
	f.Fuzz(func(t *testing.T, timeout, backoff int64, gpu, preset, level, label, source, key, value, taint string) {
		in := &MusterGangArgs{
			DefaultScheduleTimeoutSeconds: ptr.To(timeout),
			GangBackoffSeconds:            ptr.To(backoff),
			GPUResourceName:               ptr.To(gpu),
			TopologyPreset:                ptr.To(preset),
			PreemptibleNodeMatchers:       []NodeMatcher{{Source: source, Key: key, Value: value}},
			ReclaimTaintKeys:              []string{taint},
		}
		if level != "" || label != "" {
			in.TopologyLevels = []TopologyLevel{{Name: level, NodeLabel: label}}
		}
		out := internal(t, in)
		err := config.ValidateMusterGangArgs(field.NewPath("args"), out)
		if err == nil {
			if out.DefaultScheduleTimeoutSeconds < 1 || out.DefaultScheduleTimeoutSeconds > 900 || len(out.TopologyLevels) == 0 {
				t.Fatalf("accepted invalid args %+v", out)
			}
			return
		}
		if !strings.Contains(err.Error(), "args.") {
			t.Fatalf("error without a field path: %v", err)
		}
	})
}
