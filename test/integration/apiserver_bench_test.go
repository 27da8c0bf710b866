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

var apiBenchRuns = flag.Int("api-bench-runs", 3, "bursts per scheduler in BenchmarkAPIServerBurst (the median is reported)")

// Equal work on the real API server: a burst of gangs that all fit, placed
// by muster (the shipped configuration) and by a stock kube-scheduler
// (default profile, same module, same client settings), each burst on a
// fresh control plane. The bursts are interleaved: every round runs each
// configuration once, in an order rotated by the round, so a slow spell of
// the machine does not fall on one scheduler. It reports pods/s from the
// first pod created to the last binding seen (median and range over
// -api-bench-runs rounds), and the API calls per bound pod by verb and
// resource, counted at the API server (apiserver_request_total) minus the
// benchmark's own creations. The benchmark's client creates the pods one
// after another as fast as the API server takes them, so a scheduler that
// keeps up binds the last pod right after it is created: tail-ms (from the
// last creation to the last binding, median) shows how far behind the
// creations a scheduler ends, which pods/s, paced by the creations, cannot.
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
		rates, tails        []float64
		calls               map[string]float64
	}
	var setups []*setup
	for _, s := range []struct {
		name, schedulerName string
		config              []byte
		qps                 float64 // 0: as the configuration says
		burst               int
	}{
		{"muster", schedulerName, shipped, 0, 0},
		{"muster-qps50", schedulerName, shipped, 50, 100},
		{"kube-scheduler", corev1.DefaultSchedulerName, stock, 0, 0},
		{"kube-scheduler-qps200", corev1.DefaultSchedulerName, stock, 200, 400},
	} {
		config := s.config
		if s.qps > 0 {
			if config, err = withClientRate(config, s.qps, s.burst); err != nil {
				b.Fatal(err)
			}
		}
		setups = append(setups, &setup{name: s.name, schedulerName: s.schedulerName, config: config, calls: map[string]float64{}})
	}
	for round := 0; round < *apiBenchRuns; round++ {
		for i := range setups {
			s := setups[(round+i)%len(setups)]
			secs, tail, c := burst(b, s.schedulerName, s.config, groups, perGroup, nodes)
			s.rates = append(s.rates, float64(groups*perGroup)/secs)
			s.tails = append(s.tails, tail*1000)
			for k, v := range c {
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

// burst runs one scheduler over one burst and returns the seconds from the
// first creation to the last binding (the benchmark's timer runs only then),
// the seconds from the last creation to the last binding, and the API calls
// made meanwhile by everyone but the benchmark ("verb
// resource[/subresource]").
func burst(b *testing.B, scheduler string, config []byte, groups, perGroup, nodes int) (float64, float64, map[string]float64) {
	b.StopTimer()
	defer b.StartTimer()
	cp := controlplane.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := cp.Namespace(b, "burst")
	if err := controlplane.CreateNodes(ctx, cp.Client, gpuNodes(nodes, 8)...); err != nil {
		b.Fatal(err)
	}
	if _, err := cp.StartSchedulerWithConfig(ctx, config); err != nil {
		b.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		b.Fatal(err)
	}
	pgs := v1alpha1.NewClient(dyn)
	w, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	// A warm-up pod, scheduled alone: the scheduler has listed everything
	// and is idle before the counting starts.
	warmup := testobj.MakePod(ns, "warmup").PodSpec(testobj.WorkerPodSpec(scheduler, 1)).Obj()
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, warmup, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitBound(b, w, map[string]bool{}, 1)

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

	before := apiCalls(b)
	b.StartTimer()
	start := time.Now()
	for g := 0; g < groups; g++ {
		group := fmt.Sprintf("g%02d", g)
		for i := 0; i < perGroup; i++ {
			pod := testobj.MakePod(ns, fmt.Sprintf("%s-%d", group, i)).Label(v1alpha1.PodGroupLabel, group).
				PodSpec(testobj.WorkerPodSpec(scheduler, 1)).Obj()
			if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	created := time.Since(start).Seconds()
	want := groups * perGroup
	waitBound(b, w, map[string]bool{"warmup": true}, want+1)
	seconds := time.Since(start).Seconds()
	b.StopTimer()
	after := apiCalls(b)
	calls := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			calls[k] = d
		}
	}
	calls["post:pods"] -= float64(want)
	for k, v := range calls {
		if v <= 0 || strings.HasPrefix(k, "watch") || strings.HasPrefix(k, "get:/") || strings.HasSuffix(k, ":leases") {
			delete(calls, k) // the benchmark's own, and control-plane housekeeping
		}
	}
	b.Logf("%s: %d pods in %.2fs (all created at %.2fs); API calls %s", scheduler, want, seconds, created, describeCalls(calls))
	return seconds, seconds - created, calls
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

// waitBound reads pod events until want pods (counting those in bound) have
// a node.
func waitBound(b *testing.B, w watch.Interface, bound map[string]bool, want int) {
	timeout := time.After(5 * time.Minute)
	for len(bound) < want {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				b.Fatal("pod watch closed")
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Modified && pod.Spec.NodeName != "" {
				bound[pod.Name] = true
			}
		case <-timeout:
			b.Fatalf("%d of %d pods bound after 5 minutes", len(bound), want)
		}
	}
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
