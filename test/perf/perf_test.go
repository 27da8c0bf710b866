//go:build perf

// Package perf runs upstream's scheduler benchmark,
// k8s.io/kubernetes/test/integration/scheduler_perf at the Kubernetes version
// in go.mod (real kube-apiserver and etcd in process), for several schedulers
// one after another in one run: `make bench-perf`.
//
// The build tag keeps it (and the whole scheduler_perf harness it links) out
// of go vet, make verify and make test.
//
// Upstream's config files are used unchanged but for what a run requires: a
// copy of each selected performance-config.yaml is generated into a temporary
// directory (with every other YAML file of scheduler_perf, so the relative
// template paths resolve), keeping only the selected test cases and
// workloads, without upstream's minimum pods/s (thresholds for its CI
// machines: a run below one keeps no data), and for muster with `schedulerConfigPath` naming a generated copy
// of manifests/scheduler/scheduler-config.yaml whose profile is renamed
// default-scheduler (upstream's pods name no scheduler). Nothing in the
// module cache is edited.
package perf

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/pkg/features"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedperf "k8s.io/kubernetes/test/integration/scheduler_perf"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/pkg/plugins"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

var (
	workloadsFlag = flag.String("perf-workloads",
		"misc/SchedulingBasic/500Nodes,podgroup/gangscheduling/GangScheduling/100Nodes_10Gangs,podgroup/basicscheduling/BasicScheduling/100Nodes_10Groups,podgroup/tas/TopologyAwareScheduling/100Nodes_10Gangs",
		"comma-separated <config dir under scheduler_perf>/<test case>/<workload> to run")
	schedulersFlag = flag.String("perf-schedulers", "default,muster", "comma-separated schedulers to run each workload with: default, muster")
	runsFlag       = flag.Int("perf-runs", 1, "how many times to run the whole set (schedulers interleaved within each run)")
	upstreamFlag   = flag.String("perf-upstream-dir", "", "k8s.io/kubernetes module directory (default: go list -m)")
	infoFileFlag   = flag.String("perf-info-file", "", "write the peak RSS of each run (process and etcd) and the placement check of each workload to this JSON file")
	pprofFlag      = flag.String("perf-pprof", "", "serve net/http/pprof on this address (e.g. localhost:6060) while the run lasts: a profile of a workload that never ends")
	gatesFlag      = flag.String("perf-feature-gates", "", "feature gates (key=true|false,...) for every scheduler alike, set over the gates muster changes for the framework's own plugins (schedulercmd.ComparisonFeatureGates), which every scheduler runs with too; a test case's own gates still apply to it")
)

func TestMain(m *testing.M) {
	if err := schedperf.InitTests(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := writeRSS(true); err != nil {
		fmt.Fprintf(os.Stderr, "peak RSS: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// selection is the workloads selected from one upstream config file.
type selection struct {
	dir       string              // config dir relative to scheduler_perf, e.g. podgroup/gangscheduling
	workloads map[string][]string // test case -> workload names, in flag order
	order     []string            // test cases in flag order
}

// topic is upstream's topic name for the dir: its last element.
func (s *selection) topic() string { return filepath.Base(s.dir) }

func parseWorkloads(spec string) ([]*selection, error) {
	var out []*selection
	byDir := map[string]*selection{}
	for _, w := range strings.Split(spec, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		parts := strings.Split(w, "/")
		if len(parts) < 3 {
			return nil, fmt.Errorf("workload %q: want <dir>/<test case>/<workload>", w)
		}
		dir := strings.Join(parts[:len(parts)-2], "/")
		tc, wl := parts[len(parts)-2], parts[len(parts)-1]
		s := byDir[dir]
		if s == nil {
			s = &selection{dir: dir, workloads: map[string][]string{}}
			byDir[dir] = s
			out = append(out, s)
		}
		if _, ok := s.workloads[tc]; !ok {
			s.order = append(s.order, tc)
		}
		s.workloads[tc] = append(s.workloads[tc], wl)
	}
	return out, nil
}

func upstreamDir(tb testing.TB) string {
	if *upstreamFlag != "" {
		return *upstreamFlag
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes").Output()
	if err != nil {
		tb.Fatalf("go list -m k8s.io/kubernetes: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "test", "integration", "scheduler_perf")
}

// copyYAML copies every YAML file under src to dst, keeping the layout, so
// that relative template paths of a config copy resolve as upstream's do.
func copyYAML(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
}

// writeConfigCopy writes <root>/<dir>/performance-config.yaml from
// upstream's, keeping only the selected test cases and workloads and, when
// schedulerConfig is set, naming it as every test case's schedulerConfigPath.
func writeConfigCopy(upstream, root string, s *selection, schedulerConfig string) error {
	data, err := os.ReadFile(filepath.Join(upstream, s.dir, "performance-config.yaml"))
	if err != nil {
		return err
	}
	var cases []map[string]interface{}
	if err := yaml.Unmarshal(data, &cases); err != nil {
		return fmt.Errorf("%s: %w", s.dir, err)
	}
	var kept []map[string]interface{}
	for _, name := range s.order {
		var tc map[string]interface{}
		for _, c := range cases {
			if c["name"] == name {
				tc = c
			}
		}
		if tc == nil {
			return fmt.Errorf("%s: no test case %q", s.dir, name)
		}
		if _, ok := tc["schedulerConfigPath"]; ok && schedulerConfig != "" {
			return fmt.Errorf("%s/%s sets schedulerConfigPath itself: not run with another scheduler", s.dir, name)
		}
		all, _ := tc["workloads"].([]interface{})
		var ws []interface{}
		for _, want := range s.workloads[name] {
			found := false
			for _, w := range all {
				if m, ok := w.(map[string]interface{}); ok && m["name"] == want {
					ws, found = append(ws, m), true
				}
			}
			if !found {
				return fmt.Errorf("%s/%s: no workload %q", s.dir, name, want)
			}
		}
		// Upstream's thresholds are minimum pods/s for its CI machines; a
		// run below one fails and keeps no data. Here the schedulers are
		// compared with each other on one machine: the thresholds go.
		for _, w := range ws {
			delete(w.(map[string]interface{}), "threshold")
		}
		tc["workloads"] = ws
		if schedulerConfig != "" {
			tc["schedulerConfigPath"] = schedulerConfig
		}
		kept = append(kept, tc)
	}
	out, err := yaml.Marshal(kept)
	if err != nil {
		return err
	}
	header := "# Generated by muster's test/perf from upstream's " + s.dir + "/performance-config.yaml:\n" +
		"# only the selected test cases and workloads are kept, without upstream's thresholds"
	if schedulerConfig != "" {
		header += ", and schedulerConfigPath names muster's profile"
	}
	header += "; nothing else is changed.\n"
	return os.WriteFile(filepath.Join(root, s.dir, "performance-config.yaml"), append([]byte(header), out...), 0o644)
}

// writeMusterConfig writes the shipped scheduler config with its profile
// renamed default-scheduler (upstream's pods name no scheduler) and leader
// election off (the harness starts the scheduler itself and ignores it;
// clientConnection is ignored too: the harness's client runs at 5000 QPS).
func writeMusterConfig(dst string) error {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return fmt.Errorf("go list -m: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "manifests", "scheduler", "scheduler-config.yaml"))
	if err != nil {
		return err
	}
	var cfg map[string]interface{}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return err
	}
	profiles, _ := cfg["profiles"].([]interface{})
	if len(profiles) != 1 {
		return fmt.Errorf("shipped config: want one profile, got %d", len(profiles))
	}
	profiles[0].(map[string]interface{})["schedulerName"] = "default-scheduler"
	cfg["leaderElection"] = map[string]interface{}{"leaderElect": false}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	header := "# Generated by muster's test/perf from manifests/scheduler/scheduler-config.yaml:\n" +
		"# the profile renamed default-scheduler and leader election off; nothing else is changed.\n"
	return os.WriteFile(dst, append([]byte(header), b...), 0o644)
}

// Peak RSS in KiB per workload run: of this process (VmHWM, reset before
// each run: apiserver, scheduler and harness) and of its etcd child (VmHWM
// sampled every 200ms while the run lasts; etcd is started per workload).
var (
	rssMu      sync.Mutex
	rss        = map[string]int64{}
	rssCurrent string
)

// sampleChildren records the largest VmHWM of any child process (etcd) under
// the current run's name until stop is closed.
func sampleChildren(stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		tasks, _ := filepath.Glob("/proc/self/task/*/children")
		for _, f := range tasks {
			data, _ := os.ReadFile(f)
			for _, pid := range strings.Fields(string(data)) {
				if kib := vmHWMKiB("/proc/" + pid + "/status"); kib > 0 {
					rssMu.Lock()
					if k := rssCurrent + " etcd"; rssCurrent != "" && kib > rss[k] {
						rss[k] = kib
					}
					rssMu.Unlock()
				}
			}
		}
	}
}

func resetHWM() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

func vmHWMKiB(status string) int64 {
	data, err := os.ReadFile(status)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return -1
}

func writeRSS(print bool) error {
	rssMu.Lock()
	defer rssMu.Unlock()
	keys := make([]string, 0, len(rss))
	for k := range rss {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if print {
			fmt.Printf("peak RSS %s: %d MiB\n", k, rss[k]/1024)
		}
	}
	if print {
		placementMu.Lock()
		names := make([]string, 0, len(placements))
		for k := range placements {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Printf("placement %s: %+v\n", k, placements[k])
		}
		placementMu.Unlock()
	}
	if *infoFileFlag == "" {
		return nil
	}
	placementMu.Lock()
	b, err := json.MarshalIndent(map[string]interface{}{"peakRSSKiB": rss, "placement": placements}, "", "  ")
	placementMu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*infoFileFlag), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*infoFileFlag, b, 0o644)
}

// placement is what checkPlacement found for one workload run: native pod
// groups whose members all bound, those with some but not all members bound
// at the end, and (tas) groups whose members span more than one rack.
type placement struct {
	Groups, Whole, Partial, Unbound, MultiRack int
	// Plans are the gang plans muster installed in the workload, Refused
	// those a member's own cycle refused (muster_gang_plans_total and
	// muster_gang_rejections_total's plan_broken and rejected); 0 for
	// the default scheduler.
	Plans, Refused int
	// Pace of the harness against the scheduler, as this informer saw the
	// pods (every namespace): pods created, over how many seconds from the
	// first creation to the last, and seconds from the last creation to the
	// last binding. Bindings that end a moment after the last creation say
	// the harness's creations paced the run, not the scheduler.
	Created                    int
	CreateSeconds, BindTailSec float64
}

// pace records when pods were created and bound, as an informer sees them.
type pace struct {
	mu                                 sync.Mutex
	created                            int
	firstCreate, lastCreate, lastBound time.Time
}

func (p *pace) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			now := time.Now()
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.firstCreate.IsZero() {
				p.firstCreate = now
			}
			p.lastCreate = now
			p.created++
			if pod, ok := obj.(*v1.Pod); ok && pod.Spec.NodeName != "" {
				p.lastBound = now
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*v1.Pod)
			n, ok2 := newObj.(*v1.Pod)
			if ok1 && ok2 && o.Spec.NodeName == "" && n.Spec.NodeName != "" {
				p.mu.Lock()
				p.lastBound = time.Now()
				p.mu.Unlock()
			}
		},
	}
}

func (p *pace) fill(pl *placement) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl.Created = p.created
	if p.created > 0 {
		pl.CreateSeconds = p.lastCreate.Sub(p.firstCreate).Seconds()
		pl.BindTailSec = p.lastBound.Sub(p.lastCreate).Seconds()
	}
}

// musterPlans reads muster's plan counters from the process's registry:
// plans installed and plans a member's own cycle refused.
func musterPlans() (plans, refused int) {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return 0, 0
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "muster_gang_plans_total":
				plans += int(m.GetCounter().GetValue())
			case "muster_gang_rejections_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "cause" && (l.GetValue() == "plan_broken" || l.GetValue() == "rejected") {
						refused += int(m.GetCounter().GetValue())
					}
				}
			}
		}
	}
	return plans, refused
}

var (
	placementMu sync.Mutex
	placements  = map[string]placement{}
)

// checkPlacement watches pods and nodes with an informer of its own while the
// workload runs and, when the workload ends, counts its native pod groups
// (spec.schedulingGroup.podGroupName) whole, partial or unbound, and for
// each group how many racks (topology.kubernetes.io/rack) its members span.
// Upstream already fails a run whose pods are not all scheduled; this names
// groups and racks. A partial group or one across racks under a rack
// constraint fails the run.
func checkPlacement(tb testing.TB, rackConstrained bool) schedperf.HookFn {
	return func(tCtx ktesting.TContext) error {
		ctx, cancel := context.WithCancel(tCtx)
		f := informers.NewSharedInformerFactory(tCtx.Client(), 0)
		pods := f.Core().V1().Pods().Informer()
		nodes := f.Core().V1().Nodes().Informer()
		var pc pace
		if _, err := pods.AddEventHandler(pc.handler()); err != nil {
			cancel()
			return err
		}
		f.Start(ctx.Done())
		name := tCtx.Name()
		plansBefore, refusedBefore := musterPlans()
		tCtx.Cleanup(func() {
			defer f.Shutdown()
			defer cancel()
			rack := map[string]string{}
			for _, o := range nodes.GetStore().List() {
				n := o.(*v1.Node)
				rack[n.Name] = n.Labels["topology.kubernetes.io/rack"]
			}
			type group struct {
				members, bound int
				racks          map[string]bool
			}
			groups := map[string]*group{}
			for _, o := range pods.GetStore().List() {
				p := o.(*v1.Pod)
				if p.Spec.SchedulingGroup == nil || p.Spec.SchedulingGroup.PodGroupName == nil {
					continue
				}
				k := p.Namespace + "/" + *p.Spec.SchedulingGroup.PodGroupName
				g := groups[k]
				if g == nil {
					g = &group{racks: map[string]bool{}}
					groups[k] = g
				}
				g.members++
				if p.Spec.NodeName != "" {
					g.bound++
					g.racks[rack[p.Spec.NodeName]] = true
				}
			}
			var pl placement
			plans, refused := musterPlans()
			pl.Plans, pl.Refused = plans-plansBefore, refused-refusedBefore
			pc.fill(&pl)
			for _, g := range groups {
				pl.Groups++
				switch {
				case g.bound == g.members:
					pl.Whole++
				case g.bound == 0:
					pl.Unbound++
				default:
					pl.Partial++
				}
				if len(g.racks) > 1 {
					pl.MultiRack++
				}
			}
			placementMu.Lock()
			placements[name] = pl
			placementMu.Unlock()
			if pl.Partial > 0 || (rackConstrained && pl.MultiRack > 0) {
				tb.Errorf("%s: %d of %d pod groups partly bound, %d across racks", name, pl.Partial, pl.Groups, pl.MultiRack)
			}
		})
		if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, nodes.HasSynced) {
			return fmt.Errorf("placement check: informers did not sync")
		}
		return nil
	}
}

// BenchmarkPerf runs every selected workload with every selected scheduler,
// -perf-runs times: BenchmarkPerf/run<r>/<topic>/<scheduler>/<test case>/<workload>.
// Upstream writes one DataItems JSON per run, topic and scheduler into
// -data-items-dir.
func BenchmarkPerf(b *testing.B) {
	sels, err := parseWorkloads(*workloadsFlag)
	if err != nil {
		b.Fatal(err)
	}
	upstream := upstreamDir(b)
	if *pprofFlag != "" {
		go func() { b.Log(http.ListenAndServe(*pprofFlag, nil)) }()
	}
	// The framework's plugins decide alike for every scheduler compared, as
	// in the simulator: muster's gates for them (InterPodAffinity's
	// hostname fast path), then -perf-feature-gates.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(schedulercmd.ComparisonFeatureGates()); err != nil {
		b.Fatal(err)
	}
	if *gatesFlag != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gatesFlag); err != nil {
			b.Fatalf("-perf-feature-gates: %v", err)
		}
	}
	b.Logf("InterPodAffinityHostnameFastPath: %v", utilfeature.DefaultFeatureGate.Enabled(features.InterPodAffinityHostnameFastPath))
	scheds := strings.Split(*schedulersFlag, ",")
	root := b.TempDir()
	for _, sched := range scheds {
		dir := filepath.Join(root, sched)
		if err := copyYAML(upstream, dir); err != nil {
			b.Fatal(err)
		}
		schedulerConfig := ""
		switch sched {
		case "default":
		case "muster":
			schedulerConfig = filepath.Join(root, "muster-scheduler-config.yaml")
			if err := writeMusterConfig(schedulerConfig); err != nil {
				b.Fatal(err)
			}
		default:
			b.Fatalf("unknown scheduler %q (want default or muster)", sched)
		}
		for _, s := range sels {
			if err := writeConfigCopy(upstream, dir, s, schedulerConfig); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The selection is by name: run every selected workload whatever its labels.
	schedperf.PerfSchedulingLabelFilter = ""
	stop := make(chan struct{})
	defer close(stop)
	go sampleChildren(stop)

	for r := 1; r <= *runsFlag; r++ {
		b.Run(fmt.Sprintf("run%d", r), func(b *testing.B) {
			for _, s := range sels {
				b.Run(s.topic(), func(b *testing.B) {
					for _, sched := range scheds {
						b.Run(sched, func(b *testing.B) {
							var registry frameworkruntime.Registry
							if sched == "muster" {
								registry = plugins.Registry()
							}
							b.Chdir(filepath.Join(root, sched, s.dir))
							resetHWM()
							rssMu.Lock()
							rssCurrent = b.Name()
							rssMu.Unlock()
							opts := []schedperf.SchedulerPerfOption{schedperf.WithPrepareFn(checkPlacement(b, s.topic() == "tas"))}
							if s.topic() == "tas" {
								// As upstream's tas BenchmarkPerfScheduling.
								opts = append(opts, schedperf.WithPodsSchedulingTimeout(20*time.Minute))
							}
							schedperf.RunBenchmarkPerfScheduling(b, "performance-config.yaml",
								fmt.Sprintf("%s-%s-run%d", s.topic(), sched, r), registry, opts...)
							rssMu.Lock()
							rss[b.Name()] = vmHWMKiB("/proc/self/status")
							rssCurrent = ""
							rssMu.Unlock()
							if err := writeRSS(false); err != nil { // after every run, so a stopped run keeps what it measured
								b.Error(err)
							}
						})
					}
				})
			}
		})
	}
}
