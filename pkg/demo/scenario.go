package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/muster-sched/muster/pkg/controlplane"
	"github.com/muster-sched/muster/pkg/sim/measure"
	"github.com/muster-sched/muster/pkg/sim/report"
	"github.com/muster-sched/muster/pkg/sim/scenario"
)

// LiveOptions configure RunScenario.
type LiveOptions struct {
	Logs io.Writer
	// ScenarioFile is a simulator scenario (bench/scenarios/*.yaml).
	ScenarioFile string
	Seed         uint64
	// Scale is how much real time one virtual second of the scenario takes.
	Scale time.Duration
	// Dir receives report.json, report.md and allocation.svg.
	Dir string
}

// RunScenario plays a simulator scenario on an in-process control plane with
// the muster scheduler as it runs in a cluster (kube-scheduler's Setup/Run,
// the shipped configuration, the real Job controller): nodes are created,
// Jobs are submitted at their times and deleted when their run ends, on a
// compressed clock. It writes the same report files as muster-sim.
func RunScenario(ctx context.Context, opts LiveOptions) (*report.Report, error) {
	data, err := os.ReadFile(opts.ScenarioFile)
	if err != nil {
		return nil, err
	}
	sc, err := scenario.Parse(data)
	if err != nil {
		return nil, err
	}
	plan, err := sc.Expand(opts.Seed)
	if err != nil {
		return nil, err
	}
	tb := &controlplane.ProcessTB{Output: routeLogs(opts.Logs)}
	defer tb.Close()
	cp := controlplane.Start(tb)
	var nodes []controlplane.GPUNode
	for _, n := range plan.Nodes {
		node := controlplane.GPUNode{Name: n.Name, GPUs: n.GPUs, Rack: n.Rack, Zone: n.Zone}
		if n.Spot {
			node.Labels = map[string]string{"cloud.google.com/gke-spot": "true"}
		}
		nodes = append(nodes, node)
	}
	if err := controlplane.CreateNodes(ctx, cp.Client, nodes...); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done, err := cp.StartScheduler(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { cancel(); <-done }()
	ns := cp.Namespace(tb, "scenario")

	rec := measure.NewRecorder("muster")
	type jobState struct {
		job              scenario.Job
		submittedAt      time.Time
		placed, finished bool
		endAt            time.Duration
	}
	jobs := make([]*jobState, len(plan.Jobs))
	for i, j := range plan.Jobs {
		jobs[i] = &jobState{job: j}
	}
	rack := map[string]string{}
	spot := map[string]bool{}
	var capacity int64
	for _, n := range plan.Nodes {
		rack[n.Name], spot[n.Name] = n.Rack, n.Spot
		capacity += n.GPUs
	}

	tick := sc.Tick.Duration
	ticker := time.NewTicker(opts.Scale * tick / time.Second)
	defer ticker.Stop()
	lastBound := 0
	// Binding a gang's members takes a few milliseconds, so a tick can land
	// mid-binding; a gang counts as partial only if it still is a tick later.
	wasPartial := map[string]bool{}
	var t time.Duration
	for ; t <= sc.Horizon.Duration; t += tick {
		for _, js := range jobs {
			if js.submittedAt.IsZero() && js.job.Submit <= t {
				if err := submitJob(ctx, cp, ns, js.job); err != nil {
					return nil, err
				}
				js.submittedAt = time.Now()
				rec.Submitted(js.job.Name, js.job.Workers, js.job.Priority, t)
			}
		}
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		bound := map[string][]string{}
		var held, running int64
		gpusOf := map[string]int64{}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
				continue
			}
			job := p.Labels[batchv1.JobNameLabel]
			bound[job] = append(bound[job], p.Spec.NodeName)
			q := p.Spec.Containers[0].Resources.Limits[controlplane.GPUResource]
			gpusOf[job] += q.Value()
			held += q.Value()
		}
		var partial []string
		partialNow := map[string]bool{}
		total, allDone := 0, true
		for _, js := range jobs {
			name, n := js.job.Name, len(bound[js.job.Name])
			total += n
			if !js.finished {
				allDone = false
			}
			switch {
			case !js.placed && n == js.job.Workers:
				js.placed, js.endAt = true, t+js.job.Duration
				rec.Placed(name, t, time.Since(js.submittedAt), measure.PlacementOf(bound[name], func(n string) string { return rack[n] }, func(n string) bool { return spot[n] }))
			case n > 0 && n < js.job.Workers:
				partialNow[name] = true
				if wasPartial[name] {
					partial = append(partial, name)
				}
			}
			if js.placed && !js.finished {
				running += gpusOf[name]
				if t >= js.endAt {
					if err := controlplane.DeleteJob(ctx, cp.Client, ns, name); err != nil {
						return nil, err
					}
					js.finished = true
					rec.Completed(name, t)
				}
			}
		}
		rec.Step(measure.Sample{T: t.Seconds(), CapacityGPUs: capacity, HeldGPUs: held, RunningGPUs: running},
			opts.Scale*tick/time.Second, max(total-lastBound, 0), partial)
		lastBound, wasPartial = total, partialNow
		if allDone {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ticker.C:
		}
	}
	rec.End(t, nil)
	m, d, samples, logs := rec.Result()
	run := &measure.Run{Scenario: sc.Name, Seed: opts.Seed, Nodes: len(plan.Nodes), GPUs: plan.TotalGPUs(),
		Metrics: m, Details: d, Series: samples, Gangs: logs}
	cmd := fmt.Sprintf("make demo (scenario %s on the in-process control plane, 1 virtual s = %s)", sc.Name, opts.Scale)
	if err := report.Write(opts.Dir, plan, []*measure.Run{run}, cmd, report.ThisMachine("v1.37.2")); err != nil {
		return nil, err
	}
	rep, _, err := report.Read(opts.Dir)
	return rep, err
}

func submitJob(ctx context.Context, cp *controlplane.ControlPlane, ns string, j scenario.Job) error {
	job := controlplane.GPUJob(ns, j.Name, int32(j.Workers), j.GPUs, "muster")
	if j.Policy != "" {
		job.Spec.Template.Annotations = map[string]string{"muster.dev/preemptible": j.Policy}
	}
	_, err := cp.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	return err
}

// ScenarioPath finds a bench/scenarios file from the working directory.
func ScenarioPath(name string) string {
	return filepath.Join("bench", "scenarios", name+".yaml")
}
