//go:build perf

// Command table reads the DataItems JSON files that upstream's
// scheduler_perf wrote for `make bench-perf` (and test/perf's rss.json) and
// prints a Markdown table: scheduler × workload, SchedulingThroughput
// average/p50/p90/p99 (median over runs, and the range of p50), the
// scheduling duration, peak RSS, and muster ÷ default on the medians.
//
//	go run -tags perf ./test/perf/table bench/results/perf
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type dataItems struct {
	DataItems []struct {
		Data   map[string]float64 `json:"data"`
		Unit   string             `json:"unit"`
		Labels map[string]string  `json:"labels"`
	} `json:"dataItems"`
}

// key is one workload run by one scheduler.
type key struct{ workload, sched string }

type samples struct {
	avg, p50, p90, p99, dur []float64
	runs                    map[string]bool
	rss, etcd               int64
	groups, whole, partial  int // summed over runs
	multiRack               int
	plans, refused          int       // muster's plans and those a member's own cycle refused, summed over runs
	createRate, bindTail    []float64 // per run: pods created per second by the harness, seconds from the last creation to the last binding
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(v []float64) (float64, float64) {
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// parseName splits BenchmarkPerf/run<r>/<topic>/<sched>/<test case>/<workload>[/<ns>].
func parseName(name string) (run string, k key, ok bool) {
	p := strings.Split(name, "/")
	if len(p) < 6 || p[0] != "BenchmarkPerf" {
		return "", key{}, false
	}
	return p[1], key{workload: p[2] + "/" + p[4] + "/" + p[5], sched: p[3]}, true
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: table <results dir>")
		os.Exit(2)
	}
	dir := os.Args[1]
	all := results{}
	if err := all.readDataItems(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	all.readRunInfo(dir)
	all.print()
}

// results are the samples of every (workload, scheduler).
type results map[key]*samples

func (all results) get(k key) *samples {
	if all[k] == nil {
		all[k] = &samples{runs: map[string]bool{}}
	}
	return all[k]
}

// readDataItems reads the throughput and duration of every run from the
// DataItems files in dir.
func (all results) readDataItems(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "BenchmarkPerf_*.json"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var d dataItems
		if err := json.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("%s: %v", f, err)
		}
		for _, it := range d.DataItems {
			run, k, ok := parseName(it.Labels["Name"])
			if !ok {
				continue
			}
			s := all.get(k)
			switch it.Labels["Metric"] {
			case "SchedulingThroughput":
				s.runs[run] = true
				s.avg = append(s.avg, it.Data["Average"])
				s.p50 = append(s.p50, it.Data["Perc50"])
				s.p90 = append(s.p90, it.Data["Perc90"])
				s.p99 = append(s.p99, it.Data["Perc99"])
			case "SchedulingDuration":
				s.runs[run] = true
				s.dur = append(s.dur, it.Data["Duration"])
			}
		}
	}
	return nil
}

// readRunInfo adds what the harness recorded in dir/run-info.json.
func (all results) readRunInfo(dir string) {
	// run-info.json: peakRSSKiB: BenchmarkPerf/run<r>/<topic>/<sched>[ etcd] -> KiB
	// (the largest over runs is shown); placement: per workload run, the
	// native pod groups whole, partial, unbound and across racks.
	var info struct {
		PeakRSSKiB map[string]int64
		Placement  map[string]struct {
			Groups, Whole, Partial, Unbound, MultiRack, Plans, Refused, Created int
			CreateSeconds, BindTailSec                                          float64
		}
	}
	if data, err := os.ReadFile(filepath.Join(dir, "run-info.json")); err == nil {
		if err := json.Unmarshal(data, &info); err == nil {
			for name, pl := range info.Placement {
				if _, k, ok := parseName(name); ok && pl.Created > 0 && pl.CreateSeconds > 0 {
					s := all.get(k)
					s.createRate = append(s.createRate, float64(pl.Created)/pl.CreateSeconds)
					s.bindTail = append(s.bindTail, pl.BindTailSec)
				}
				if _, k, ok := parseName(name); ok && pl.Plans > 0 {
					s := all.get(k)
					s.plans += pl.Plans
					s.refused += pl.Refused
				}
				if _, k, ok := parseName(name); ok && pl.Groups > 0 {
					s := all.get(k)
					s.groups += pl.Groups
					s.whole += pl.Whole
					s.partial += pl.Partial
					s.multiRack += pl.MultiRack
				}
			}
			for name, kib := range info.PeakRSSKiB {
				etcd := strings.HasSuffix(name, " etcd")
				p := strings.Split(strings.TrimSuffix(name, " etcd"), "/")
				if len(p) != 4 {
					continue
				}
				for k, s := range all {
					if k.sched == p[3] && strings.HasPrefix(k.workload, p[2]+"/") {
						if etcd {
							s.etcd = max(s.etcd, kib)
						} else {
							s.rss = max(s.rss, kib)
						}
					}
				}
			}
		}
	}

}

// print writes the table, muster beside the default profile per workload.
func (all results) print() {
	var workloads []string
	seen := map[string]bool{}
	for k := range all {
		if !seen[k.workload] {
			seen[k.workload] = true
			workloads = append(workloads, k.workload)
		}
	}
	sort.Strings(workloads)
	scheds := []string{"default", "muster"}

	fmt.Println("| workload | scheduler | runs | pods/s average | p50 (range) | p90 | p99 | scheduling s | peak RSS MiB (etcd) | groups whole / partial / across racks | plans refused by a member's own cycle, per 100 plans | harness creates pods/s; last binding s after the last creation | muster ÷ default, p50 (average) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range workloads {
		for _, sc := range scheds {
			s := all[key{w, sc}]
			if s == nil {
				continue
			}
			tp := "no sample (under 1 s)"
			p50, p90, p99 := "", "", ""
			if len(s.p50) > 0 {
				lo, hi := minMax(s.p50)
				tp = fmt.Sprintf("%.0f", median(s.avg))
				p50 = fmt.Sprintf("%.0f (%.0f–%.0f)", median(s.p50), lo, hi)
				p90 = fmt.Sprintf("%.0f", median(s.p90))
				p99 = fmt.Sprintf("%.0f", median(s.p99))
			}
			dur := ""
			if len(s.dur) > 0 {
				dur = fmt.Sprintf("%.2f", median(s.dur))
			}
			mem := ""
			if s.rss > 0 {
				mem = fmt.Sprintf("%d (%d)", s.rss/1024, s.etcd/1024)
			}
			ratio := ""
			if d := all[key{w, "default"}]; sc == "muster" && d != nil {
				if len(s.p50) > 0 && len(d.p50) > 0 && median(d.p50) > 0 {
					ratio = fmt.Sprintf("%.2f (%.2f)", median(s.p50)/median(d.p50), median(s.avg)/median(d.avg))
				} else if len(s.dur) > 0 && len(d.dur) > 0 && median(s.dur) > 0 {
					ratio = fmt.Sprintf("duration %.2f", median(s.dur)/median(d.dur))
				}
			}
			groups := ""
			if s.groups > 0 {
				groups = fmt.Sprintf("%d / %d / %d", s.whole, s.partial, s.multiRack)
			}
			refused := ""
			if s.plans > 0 {
				refused = fmt.Sprintf("%.2f (%d of %d)", 100*float64(s.refused)/float64(s.plans), s.refused, s.plans)
			}
			pace := ""
			if len(s.createRate) > 0 {
				pace = fmt.Sprintf("%.0f; %.2f", median(s.createRate), median(s.bindTail))
			}
			fmt.Printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w, sc, len(s.runs), tp, p50, p90, p99, dur, mem, groups, refused, pace, ratio)
		}
	}
}
