package integration

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/component-base/metrics/legacyregistry"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

// creationWorkers create a burst's pods concurrently (the benchmark's client
// allows 500 requests/s, burst 1000).
const creationWorkers = 8

var apiBenchRuns = flag.Int("api-bench-runs", 3, "bursts per scheduler in BenchmarkAPIServerBurst (the median is reported)")

// Equal work on the real API server: a burst of gangs that all fit, placed
// by muster (the shipped configuration) and by a stock kube-scheduler
// (default profile, same module, same client settings), each burst on a
// fresh control plane. The bursts are interleaved: every round runs each
// configuration once, in an order rotated by the round, so a slow spell of
// the machine does not fall on one scheduler. Two ways of handing the
// scheduler its pods:
//
//   - burst: the scheduler runs and the pods are created at once, by
//     creationWorkers concurrent requests as fast as the API server takes
//     them. pods/s is from the first creation to the last binding; tail-ms
//     (median) from the last creation to the last binding, how far behind
//     the creations a scheduler ends. It also reports the API calls per
//     bound pod by verb and resource, counted at the API server
//     (apiserver_request_total) minus the benchmark's own creations.
//   - backlog: every pod exists before the scheduler starts, so nothing but
//     the scheduler paces the bindings. pods/s is from the first binding to
//     the last.
//
// Each figure is the median (and range) over -api-bench-runs rounds.
//
//	go test -run '^$' -bench BenchmarkAPIServerBurst -benchtime 1x ./test/integration/ [-args -api-bench-runs=5]
func BenchmarkAPIServerBurst(b *testing.B) {
	const groups, perGroup, nodes = 60, 8, 200
	stock := []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
`)
	shipped, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		b.Fatal(err)
	}
	type setup struct {
		name, schedulerName string
		config              []byte
		backlog             bool
		rates, tails        []float64
		calls               map[string]float64
	}
	var setups []*setup
	for _, s := range []struct {
		name, schedulerName string
		config              []byte
		qps                 float64 // 0: as the configuration says
		burst               int
		backlog             bool
	}{
		{"muster", schedulerName, shipped, 0, 0, false},
		{"muster-qps50", schedulerName, shipped, 50, 100, false},
		{"kube-scheduler", corev1.DefaultSchedulerName, stock, 0, 0, false},
		{"kube-scheduler-qps200", corev1.DefaultSchedulerName, stock, 200, 400, false},
		{"backlog/muster", schedulerName, shipped, 0, 0, true},
		{"backlog/kube-scheduler-qps200", corev1.DefaultSchedulerName, stock, 200, 400, true},
	} {
		config := s.config
		if s.qps > 0 {
			if config, err = withClientRate(config, s.qps, s.burst); err != nil {
				b.Fatal(err)
			}
		}
		setups = append(setups, &setup{name: s.name, schedulerName: s.schedulerName, config: config, backlog: s.backlog, calls: map[string]float64{}})
	}
	for round := 0; round < *apiBenchRuns; round++ {
		for i := range setups {
			s := setups[(round+i)%len(setups)]
			r := burst(b, s.schedulerName, s.config, s.backlog, groups, perGroup, nodes)
			s.rates = append(s.rates, float64(groups*perGroup)/r.seconds)
			s.tails = append(s.tails, r.tail*1000)
			for k, v := range r.calls {
				s.calls[k] += v
			}
		}
	}
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			rates := slices.Sorted(slices.Values(s.rates))
			b.ReportMetric(rates[len(rates)/2], "pods/s")
			b.ReportMetric(rates[0], "min-pods/s")
			b.ReportMetric(rates[len(rates)-1], "max-pods/s")
			if s.backlog {
				return
			}
			tails := slices.Sorted(slices.Values(s.tails))
			b.ReportMetric(tails[len(tails)/2], "tail-ms")
			pods := float64(groups * perGroup * len(rates))
			total := 0.0
			for k, v := range s.calls {
				b.ReportMetric(v/pods, k+"/pod")
				total += v
			}
			b.ReportMetric(total/pods, "calls/pod")
		})
	}
}

// burstResult is one burst: the seconds pods/s is taken over, the seconds
// from the last creation to the last binding and the API calls made
// meanwhile by everyone but the benchmark ("verb:resource[/subresource]"),
// the last two for a burst with the scheduler running only.
type burstResult struct {
	seconds, tail float64
	calls         map[string]float64
}

// burst runs one scheduler over one burst on a fresh control plane; the
// benchmark's timer runs only from the first creation (backlog: the first
// binding) to the last binding.
func burst(b *testing.B, scheduler string, config []byte, backlog bool, groups, perGroup, nodes int) burstResult {
	b.StopTimer()
	defer b.StartTimer()
	// This burst's control plane stops when the burst ends, not with the
	// benchmark: every earlier one still running would slow the later ones.
	tb := &burstTB{B: b}
	defer tb.cleanup()
	cp := controlplane.Start(tb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := cp.Namespace(tb, "burst")
	if err := controlplane.CreateNodes(ctx, cp.Client, gpuNodes(nodes, 8)...); err != nil {
		b.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		b.Fatal(err)
	}
	pgs := v1alpha1.NewClient(dyn)
	var w *boundWatch
	defer func() {
		if w != nil {
			w.w.Stop()
		}
	}()
	bound := map[string]bool{}
	if !backlog {
		w = watchBound(ctx, b, cp, ns)
		if _, err := cp.StartSchedulerWithConfig(ctx, config); err != nil {
			b.Fatal(err)
		}
		// A warm-up pod, scheduled alone: the scheduler has listed
		// everything and is idle before the counting starts.
		warmup := testobj.MakePod(ns, "warmup").PodSpec(testobj.WorkerPodSpec(scheduler, 1)).Obj()
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, warmup, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		w.wait(bound, 1)
	}

	// The gangs' PodGroups exist before the burst, as a Job would: the
	// burst is the same pods for every scheduler.
	if scheduler == schedulerName {
		for g := 0; g < groups; g++ {
			if _, err := pgs.Create(ctx, &v1alpha1.PodGroup{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("g%02d", g), Namespace: ns},
				Spec:       v1alpha1.PodGroupSpec{MinMember: int32(perGroup)},
			}); err != nil {
				b.Fatal(err)
			}
		}
	}

	// The pods are made before the clock starts and created by several
	// workers at once, gang after gang: one creation after another would
	// pace both schedulers at the speed of one client's round trips.
	pods := make(chan *corev1.Pod, groups*perGroup)
	for g := 0; g < groups; g++ {
		group := fmt.Sprintf("g%02d", g)
		for i := 0; i < perGroup; i++ {
			pods <- testobj.MakePod(ns, fmt.Sprintf("%s-%d", group, i)).Label(v1alpha1.PodGroupLabel, group).
				PodSpec(testobj.WorkerPodSpec(scheduler, 1)).Obj()
		}
	}
	close(pods)
	want := len(bound) + groups*perGroup
	if backlog {
		createAll(ctx, b, cp, pods)
		// Watched from here: an unread watch of every creation would be
		// closed by the API server as too slow.
		w = watchBound(ctx, b, cp, ns)
		if _, err := cp.StartSchedulerWithConfig(ctx, config); err != nil {
			b.Fatal(err)
		}
		first := w.wait(bound, want)
		seconds := time.Since(first).Seconds()
		b.Logf("%s (backlog): %d pods in %.2fs from the first binding", scheduler, groups*perGroup, seconds)
		return burstResult{seconds: seconds}
	}

	before := apiCalls(b)
	b.StartTimer()
	start := time.Now()
	createAll(ctx, b, cp, pods)
	created := time.Since(start).Seconds()
	w.wait(bound, want)
	seconds := time.Since(start).Seconds()
	b.StopTimer()
	after := apiCalls(b)
	calls := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			calls[k] = d
		}
	}
	calls["post:pods"] -= float64(groups * perGroup)
	for k, v := range calls {
		if v <= 0 || strings.HasPrefix(k, "watch") || strings.HasPrefix(k, "get:/") || strings.HasSuffix(k, ":leases") {
			delete(calls, k) // the benchmark's own, and control-plane housekeeping
		}
	}
	b.Logf("%s: %d pods in %.2fs (all created at %.2fs); API calls %s", scheduler, groups*perGroup, seconds, created, describeCalls(calls))
	return burstResult{seconds: seconds, tail: seconds - created, calls: calls}
}

// burstTB runs the cleanups registered through it when cleanup is called.
type burstTB struct {
	*testing.B
	cleanups []func()
}

func (tb *burstTB) Cleanup(f func()) { tb.cleanups = append(tb.cleanups, f) }

func (tb *burstTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

// createAll creates the pods with creationWorkers concurrent requests.
func createAll(ctx context.Context, b *testing.B, cp *controlplane.ControlPlane, pods <-chan *corev1.Pod) {
	var creators errgroup.Group
	for range creationWorkers {
		creators.Go(func() error {
			for pod := range pods {
				if _, err := cp.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := creators.Wait(); err != nil {
		b.Fatal(err)
	}
}

// withClientRate sets clientConnection.qps and burst in a scheduler
// configuration.
func withClientRate(config []byte, qps float64, burst int) ([]byte, error) {
	var cfg map[string]interface{}
	if err := yaml.Unmarshal(config, &cfg); err != nil {
		return nil, err
	}
	conn, _ := cfg["clientConnection"].(map[string]interface{})
	if conn == nil {
		conn = map[string]interface{}{}
	}
	conn["qps"], conn["burst"] = qps, burst
	cfg["clientConnection"] = conn
	return yaml.Marshal(cfg)
}

// boundWatch follows the pods of a namespace for bindings.
type boundWatch struct {
	ctx context.Context
	b   *testing.B
	cp  *controlplane.ControlPlane
	ns  string
	w   watch.Interface
	rv  string // of the last event read
}

func watchBound(ctx context.Context, b *testing.B, cp *controlplane.ControlPlane, ns string) *boundWatch {
	bw := &boundWatch{ctx: ctx, b: b, cp: cp, ns: ns}
	bw.open()
	return bw
}

func (bw *boundWatch) open() {
	w, err := bw.cp.Client.CoreV1().Pods(bw.ns).Watch(bw.ctx, metav1.ListOptions{ResourceVersion: bw.rv})
	if err != nil {
		bw.b.Fatal(err)
	}
	bw.w = w
}

// wait reads pod events until want pods (counting those in bound) have a
// node, and returns when it saw the first of them bound. A watch the API
// server closes (it drops watchers that fall behind a flood of bindings on
// a busy 2-core machine) is opened again from the last event read.
func (bw *boundWatch) wait(bound map[string]bool, want int) time.Time {
	timeout := time.After(5 * time.Minute)
	var first time.Time
	for len(bound) < want {
		select {
		case ev, ok := <-bw.w.ResultChan():
			if !ok {
				bw.open()
				continue
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod { // an error, such as a resource version too old: start over
				bw.b.Logf("pod watch: %v", ev.Object)
				bw.w.Stop()
				bw.rv = ""
				bw.open()
				continue
			}
			bw.rv = pod.ResourceVersion
			if pod.Spec.NodeName != "" && !bound[pod.Name] {
				if first.IsZero() {
					first = time.Now()
				}
				bound[pod.Name] = true
			}
		case <-timeout:
			bw.b.Fatalf("%d of %d pods bound after 5 minutes", len(bound), want)
		}
	}
	return first
}

// apiCalls reads apiserver_request_total of the in-process API server by
// "verb:resource[/subresource]".
func apiCalls(b *testing.B) map[string]float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "apiserver_request_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			key := strings.ToLower(labels["verb"]) + ":" + labels["resource"]
			if sub := labels["subresource"]; sub != "" {
				key += "/" + sub
			}
			out[key] += m.GetCounter().GetValue()
		}
	}
	return out
}

func describeCalls(calls map[string]float64) string {
	keys := make([]string, 0, len(calls))
	for k := range calls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, calls[k]))
	}
	return strings.Join(parts, ", ")
}
