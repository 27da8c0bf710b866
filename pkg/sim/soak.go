package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/sim/measure"
)

// A soak (scenario soak block) samples, every soak.sampleEvery of virtual
// time, what the scheduler keeps: the live heap after a full garbage
// collection and, for muster, the size of every keyed structure of its
// plugin. A scheduler that runs for months must keep each of them bounded
// by what the cluster holds at the time, not by everything it has seen.

// sizer is what muster's plugin answers (mustergang.Plugin.Sizes); asked
// through an interface so the simulator does not reach into the plugin.
type sizer interface{ Sizes() map[string]int }

// soakSampler takes the samples of one run.
type soakSampler struct {
	every   time.Duration
	next    time.Duration
	samples []measure.SoakSample
	// stopCPU ends the CPU profile of the period since the last sample
	// (nil: none is written).
	stopCPU func()
}

func newSoakSampler(h *harness) *soakSampler {
	so := h.opts.Plan.Scenario.Soak
	if so == nil {
		return nil
	}
	return &soakSampler{every: so.SampleEvery.Duration}
}

// profileUntil starts the CPU profile of the period that ends at virtual
// time t, ending the one before.
func (s *soakSampler) profileUntil(h *harness, t time.Duration) {
	s.stopProfile()
	dir := h.opts.CPUProfiles
	if dir == "" {
		return
	}
	name := filepath.Join(dir, fmt.Sprintf("%s.cpu-%04.0fh.pprof", h.opts.Scheduler, t.Hours()))
	stop, err := startCPUProfile(name)
	if err != nil {
		klog.Background().Error(err, "Soak: CPU profile not started", "file", name)
		return
	}
	s.stopCPU = stop
}

// maybe samples when virtual time t reached the next sample's time.
func (s *soakSampler) maybe(h *harness, t time.Duration) {
	if s == nil || t < s.next {
		return
	}
	for s.next <= t {
		s.next += s.every
	}
	s.take(h, t)
	s.profileUntil(h, s.next)
}

// finish ends the last CPU profile and takes the last sample, at virtual
// time t.
func (s *soakSampler) finish(h *harness, t time.Duration) {
	s.stopProfile()
	s.take(h, t)
}

// stopProfile ends the CPU profile being written, if any.
func (s *soakSampler) stopProfile() {
	if s.stopCPU != nil {
		s.stopCPU()
		s.stopCPU = nil
	}
}

// take samples now (virtual time t).
func (s *soakSampler) take(h *harness, t time.Duration) {
	c := h.cluster
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	live := c.work.liveGangs()
	sample := measure.SoakSample{VirtualHours: t.Hours(), HeapMiB: float64(m.HeapAlloc) / (1 << 20),
		Nodes: len(c.nodes.byName), Pods: len(c.work.podGang), JobsSubmitted: c.work.finished + len(live),
		JobsFinished: c.work.finished, NodesReplaced: c.nodesReplaced}
	sample.Structures = structureSizes(h)
	work := h.driver.metrics.counterValues()
	sample.BusySeconds, sample.Attempts = h.rec.Busy().Seconds(), work["schedule_attempts"]-h.driver.metrics.baseline["schedule_attempts"]
	if isMuster(h.opts.Scheduler) {
		sample.PlanSeconds, sample.Plans = histogramTotals("muster_gang_plan_duration_seconds")
	}
	s.samples = append(s.samples, sample)
	if dir := h.opts.HeapProfiles; dir != "" {
		name := filepath.Join(dir, fmt.Sprintf("%s.heap-%04.0fh.pprof", h.opts.Scheduler, t.Hours()))
		if err := writeHeapProfile(name); err != nil {
			klog.Background().Error(err, "Soak: heap profile not written", "file", name)
		}
	}
}

// structureSizes asks the first plugin of the scheduler that keeps sizes
// (muster's: one gang manager serves every profile); nil for the others.
func structureSizes(h *harness) map[string]int {
	for _, fw := range h.driver.sched.Profiles {
		for _, pl := range fw.PreEnqueuePlugins() {
			if sz, ok := pl.(sizer); ok {
				return sz.Sizes()
			}
		}
	}
	return nil
}

// startCPUProfile profiles the process's CPU into name until stop is called.
func startCPUProfile(name string) (stop func(), err error) {
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			klog.Background().Error(err, "CPU profile not written", "file", name)
		}
	}, nil
}

// writeHeapProfile writes the heap profile (as of the last GC) to name.
func writeHeapProfile(name string) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
