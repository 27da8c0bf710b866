package mustergang

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/muster-sched/muster/pkg/gang"
)

func TestMemberPlacedInTwoTrialsKeepsEachPlacement(t *testing.T) {
	// A plan that tries a second domain places a member again: each trial's
	// copy of the member names its own node and counts against that node
	// only, and neither the member nor the snapshot's NodeInfo changes.
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	a.Spec.Affinity, b.Spec.Affinity = nil, nil // resources alone decide
	n1, n2 := gpuNode("n1", 8), gpuNode("n2", 8)
	f := newTestFramework(t, 2, []*v1.Node{n1, n2}, []*v1.Pod{a, b})
	key, _ := gang.KeyOf(a)
	check, err := f.plugin.newFilterCheck(context.Background(), key, podInfos(t, a, b), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := &gang.Member{UID: a.UID, Name: a.Name}, &gang.Member{UID: b.UID, Name: b.Name}

	first := check.Trial().(*filterTrial)
	if !first.Fits(ma, n1) {
		t.Fatal("a does not fit on the empty n1")
	}
	first.Assign(ma, n1)
	if first.Fits(mb, n1) {
		t.Error("first trial: b fits on n1 beside a (a's GPUs not counted there)")
	}
	if !first.Fits(mb, n2) {
		t.Error("first trial: b does not fit on the empty n2")
	}

	second := check.Trial().(*filterTrial)
	second.Assign(ma, n2)
	if !second.Fits(mb, n1) {
		t.Error("second trial: b does not fit on n1, which only the first trial used")
	}
	if second.Fits(mb, n2) {
		t.Error("second trial: b fits on n2 beside a")
	}

	if got := first.placed[0].info.GetPod().Spec.NodeName; got != "n1" {
		t.Errorf("first trial's a is on %q, want n1", got)
	}
	if got := second.placed[0].info.GetPod().Spec.NodeName; got != "n2" {
		t.Errorf("second trial's a is on %q, want n2", got)
	}
	if a.Spec.NodeName != "" {
		t.Errorf("placing changed the member itself: on %q", a.Spec.NodeName)
	}
	for _, name := range []string{"n1", "n2"} {
		ni, err := check.nodes.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(ni.GetPods()); n != 0 {
			t.Errorf("the snapshot's %s has %d pods after the trials, want 0", name, n)
		}
	}
}
