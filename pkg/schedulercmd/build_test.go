package schedulercmd

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"k8s.io/kubernetes/pkg/scheduler/profile"

	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/plugins"
	"github.com/muster-sched/muster/pkg/plugins/binpack"
	"github.com/muster-sched/muster/pkg/plugins/mustergang"
)

func buildOptions(t *testing.T) Options {
	t.Helper()
	client := fake.NewSimpleClientset()
	return Options{
		Client: client, InformerFactory: scheduler.NewInformerFactory(client, 0, nil),
		Recorders: profile.RecorderFactory(func(string) events.EventRecorderLogger { return &events.FakeRecorder{} }),
	}
}

// Build runs the shipped configuration's one profile with muster's plugin,
// and kube-scheduler's default profile when given no configuration.
func TestBuild(t *testing.T) {
	data, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := DecodeConfig(data, manifests.SchedulerConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		config      bool
		profile     string
		queueSorter string
		// resourceScorer scores resource use; the other is not a scorer.
		resourceScorer, notScorer string
	}{
		{name: "shipped configuration", config: true, profile: cfg.Profiles[0].SchedulerName, queueSorter: mustergang.Name,
			resourceScorer: binpack.Name, notScorer: noderesources.Name},
		{name: "no configuration", profile: v1.DefaultSchedulerName, queueSorter: "PrioritySort",
			resourceScorer: noderesources.Name, notScorer: binpack.Name},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := buildOptions(t)
			if tc.config {
				o.Config = cfg
			}
			sched, err := Build(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if len(sched.Profiles) != 1 || sched.Profiles[tc.profile] == nil {
				t.Fatalf("profiles %v, want only %s", profileNames(sched.Profiles), tc.profile)
			}
			if got := sched.Profiles[tc.profile].ListPlugins().QueueSort.Enabled; len(got) != 1 || got[0].Name != tc.queueSorter {
				t.Errorf("queueSort %+v, want %s", got, tc.queueSorter)
			}
			// NodeResourcesFit still filters under muster; MusterBinPack scores.
			listed := sched.Profiles[tc.profile].ListPlugins()
			for point, set := range map[string]schedulerapi.PluginSet{"preScore": listed.PreScore, "score": listed.Score} {
				var names []string
				for _, p := range set.Enabled {
					names = append(names, p.Name)
				}
				if !slices.Contains(names, tc.resourceScorer) || slices.Contains(names, tc.notScorer) {
					t.Errorf("%s plugins %v: want %s and not %s", point, names, tc.resourceScorer, tc.notScorer)
				}
			}
			if !slices.ContainsFunc(listed.Filter.Enabled, func(p schedulerapi.Plugin) bool { return p.Name == noderesources.Name }) {
				t.Errorf("filter plugins %+v: want %s", listed.Filter.Enabled, noderesources.Name)
			}
		})
	}
}

// Extra plugins cannot replace muster's.
func TestBuildRefusesAnExtraPluginNamedAsMusters(t *testing.T) {
	o := buildOptions(t)
	o.ExtraPlugins = plugins.Registry()
	if _, err := Build(t.Context(), o); err == nil {
		t.Error("Build accepted a second plugin named " + mustergang.Name)
	}
}

func profileNames(m profile.Map) []string {
	var out []string
	for name := range m {
		out = append(out, name)
	}
	return out
}

// Every gate a comparison sets for all schedulers is one muster sets itself,
// with muster's value: a benchmark never runs the default profile with a gate
// muster does not run with.
func TestComparisonFeatureGatesAreMustersOwn(t *testing.T) {
	gates := ComparisonFeatureGates()
	require.NotEmpty(t, gates)
	for name, on := range gates {
		want, ok := featureDefaults[name]
		require.True(t, ok, "%s is not one of muster's feature defaults", name)
		require.Equal(t, want, on, name)
	}
	require.True(t, gates["InterPodAffinityHostnameFastPath"], "muster runs with InterPodAffinity's hostname fast path")
}

// Build passes scheduler.New the options kube-scheduler's app.Setup passes,
// but for the ones listed here with the reason. A new option upstream (on a
// version bump) or one dropped here fails this test.
func TestBuildPassesTheOptionsAppSetupPasses(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes").Output()
	require.NoError(t, err, "go list -m k8s.io/kubernetes")
	setup := schedulerOptionNames(t, filepath.Join(strings.TrimSpace(string(out)), "cmd", "kube-scheduler", "app", "server.go"), "Setup")
	build := schedulerOptionNames(t, "build.go", "schedulerOptions")
	onlySetup := map[string]string{"WithBuildFrameworkCapturer": "logs the completed profiles (--write-config-to); nothing runs differently"}
	onlyBuild := map[string]string{"WithClock": "the simulator's virtual clock for the queue"}
	for name := range setup {
		if _, ok := onlySetup[name]; !ok && !build[name] {
			t.Errorf("app.Setup passes scheduler.%s, Build does not", name)
		}
	}
	for name := range build {
		if _, ok := onlyBuild[name]; !ok && !setup[name] {
			t.Errorf("Build passes scheduler.%s, app.Setup does not", name)
		}
	}
	require.NotEmpty(t, setup, "no scheduler.With* option found in app.Setup")
}

// schedulerOptionNames are the scheduler.With* functions fn of file calls.
func schedulerOptionNames(t *testing.T, file, fn string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn || fd.Body == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "scheduler" && strings.HasPrefix(sel.Sel.Name, "With") {
					names[sel.Sel.Name] = true
				}
			}
			return true
		})
	}
	return names
}
