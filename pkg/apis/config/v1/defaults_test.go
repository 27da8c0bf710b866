package v1

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// internal defaults and converts in through a scheme, as kube-scheduler does
// with pluginConfig args, so the generated registration is tested too.
func internal(t testing.TB, in *MusterGangArgs) *config.MusterGangArgs {
	t.Helper()
	s := runtime.NewScheme()
	if err := config.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	s.Default(in)
	out := &config.MusterGangArgs{}
	if err := s.Convert(in, out, nil); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDefaultsAreValid(t *testing.T) {
	args := internal(t, &MusterGangArgs{})
	if err := config.ValidateMusterGangArgs(field.NewPath("args"), args); err != nil {
		t.Fatalf("defaulted args invalid: %v", err)
	}
	if args.DefaultScheduleTimeoutSeconds != 120 || args.GPUResourceName != "nvidia.com/gpu" {
		t.Errorf("defaults: timeout %d gpu %q", args.DefaultScheduleTimeoutSeconds, args.GPUResourceName)
	}
	var names []string
	for _, l := range args.TopologyLevels {
		names = append(names, l.Name+"="+l.NodeLabel)
	}
	want := "node=kubernetes.io/hostname nvlink=nvidia.com/gpu.clique rack=topology.kubernetes.io/rack zone=topology.kubernetes.io/zone"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("default levels %q, want %q", got, want)
	}
	if len(args.PreemptibleNodeMatchers) != 5 {
		t.Errorf("default preemptible matchers: %v", args.PreemptibleNodeMatchers)
	}
}

func TestPresets(t *testing.T) {
	var keys []string
	for k := range TopologyPresets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	wantNames := slices.Sorted(slices.Values(config.TopologyPresetNames))
	if !slices.Equal(keys, wantNames) {
		t.Fatalf("presets %v, validation knows %v", keys, wantNames)
	}
	for name, levels := range TopologyPresets {
		args := internal(t, &MusterGangArgs{TopologyPreset: ptr.To(name)})
		if err := config.ValidateMusterGangArgs(field.NewPath("args"), args); err != nil {
			t.Errorf("preset %s invalid: %v", name, err)
		}
		if len(args.TopologyLevels) != len(levels) || args.TopologyLevels[0].Name != "node" {
			t.Errorf("preset %s levels %v", name, args.TopologyLevels)
		}
	}
	aws := internal(t, &MusterGangArgs{TopologyPreset: ptr.To("aws")})
	if aws.TopologyLevels[1].NodeLabel != "topology.k8s.aws/network-node-layer-3" {
		t.Errorf("aws rack level = %v, want the switch layer nearest the node", aws.TopologyLevels[1])
	}
	// Explicit levels win over the preset.
	explicit := internal(t, &MusterGangArgs{TopologyPreset: ptr.To("gke"), TopologyLevels: []TopologyLevel{{Name: "host", NodeLabel: "example.com/host"}}})
	if len(explicit.TopologyLevels) != 1 || explicit.TopologyLevels[0].Name != "host" {
		t.Errorf("explicit levels replaced by preset: %v", explicit.TopologyLevels)
	}
}

func TestValidationNamesTheField(t *testing.T) {
	tests := []struct {
		name string
		args MusterGangArgs
		want string
	}{
		{"timeout above the framework cap", MusterGangArgs{DefaultScheduleTimeoutSeconds: ptr.To[int64](901)}, "args.defaultScheduleTimeoutSeconds"},
		{"zero timeout", MusterGangArgs{DefaultScheduleTimeoutSeconds: ptr.To[int64](0)}, "args.defaultScheduleTimeoutSeconds"},
		{"negative backoff", MusterGangArgs{GangBackoffSeconds: ptr.To[int64](-1)}, "args.gangBackoffSeconds"},
		{"bad resource name", MusterGangArgs{GPUResourceName: ptr.To("nvidia.com/gpu!")}, "args.gpuResourceName"},
		{"unknown preset", MusterGangArgs{TopologyPreset: ptr.To("azure")}, `args.topologyPreset: Unsupported value: "azure"`},
		{"duplicate level name", MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "rack", NodeLabel: "a"}, {Name: "rack", NodeLabel: "b"}}}, "args.topologyLevels[1].name: Duplicate value"},
		{"bad level name", MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "Rack", NodeLabel: "a"}}}, "args.topologyLevels[0].name"},
		{"bad level label", MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "rack", NodeLabel: "-bad-"}}}, "args.topologyLevels[0].nodeLabel"},
		{"level with label and attribute", MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "clique", NodeLabel: "a", DeviceAttribute: "gpu.nvidia.com/clique"}}}, "args.topologyLevels[0].nodeLabel: Invalid value"},
		{"attribute without domain", MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "clique", DeviceAttribute: "clique"}}}, "args.topologyLevels[0].deviceAttribute"},
		{"bad GPU device class", MusterGangArgs{GPUDeviceClasses: []string{"GPU_class"}}, "args.gpuDeviceClasses[0]"},
		{"bad matcher source", MusterGangArgs{PreemptibleNodeMatchers: []NodeMatcher{{Source: "Annotation", Key: "a"}}}, "args.preemptibleNodeMatchers[0].source"},
		{"bad matcher value", MusterGangArgs{PreemptibleNodeMatchers: []NodeMatcher{{Key: "a", Value: "not a value"}}}, "args.preemptibleNodeMatchers[0].value"},
		{"bad reclaim taint", MusterGangArgs{ReclaimTaintKeys: []string{"bad key"}}, "args.reclaimTaintKeys[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := config.ValidateMusterGangArgs(field.NewPath("args"), internal(t, &tc.args))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestConversionRoundTrip: internal args written back out as v1 keep their
// values, and an empty preset is left out rather than written as "".
func TestConversionRoundTrip(t *testing.T) {
	args := internal(t, &MusterGangArgs{TopologyLevels: []TopologyLevel{{Name: "rack", NodeLabel: "rack"}}})
	args.TopologyPreset = ""
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	out := &MusterGangArgs{}
	if err := s.Convert(args, out, nil); err != nil {
		t.Fatal(err)
	}
	if out.TopologyPreset != nil {
		t.Errorf("empty preset written as %q", *out.TopologyPreset)
	}
	if back := internal(t, out); !reflect.DeepEqual(back, args) {
		t.Errorf("round trip changed the args:\n got %+v\nwant %+v", back, args)
	}
}
