package mustergang

import (
	"bytes"
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// Pods alone are signed by their preemptible policy, so the framework's
// opportunistic batching works in muster's profile; gang members and pods
// with a malformed policy are not signed.
func TestSignPod(t *testing.T) {
	f := newTestFramework(t, 4, []*v1.Node{gpuNode("n1", 8)}, nil)
	ctx := context.Background()
	lone := func(name, policy string) *v1.Pod {
		w := testobj.MakePod("ns", name).UID(name).SchedulerName("muster").
			Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj())
		if policy != "" {
			w.Annotation(gang.AnnotationPreemptible, policy)
		}
		return w.Obj()
	}

	a, b := f.fw.SignPod(ctx, lone("a", "")), f.fw.SignPod(ctx, lone("b", ""))
	if a == nil || b == nil {
		t.Fatalf("the profile signs no pod alone: every plugin must implement SignPod (a=%s b=%s)", a, b)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two pods alone of the same shape and policy: signatures %s and %s differ", a, b)
	}
	if forbid := f.fw.SignPod(ctx, lone("c", "forbid")); bytes.Equal(a, forbid) {
		t.Errorf("policy forbid signs like the default policy: %s", forbid)
	}

	if _, status := f.plugin.SignPod(ctx, worker("j", 0, 8, "")); status.IsSuccess() {
		t.Error("a gang member was signed; its plan places it, not a batch")
	}
	if _, status := f.plugin.SignPod(ctx, lone("d", "sometimes")); status.IsSuccess() {
		t.Error("a pod with a malformed policy was signed")
	}
}
