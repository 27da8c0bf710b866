package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
)

func (c *cluster) podGroups() *v1alpha1.Client {
	c.t.Helper()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		c.t.Fatal(err)
	}
	return v1alpha1.NewClient(dyn)
}

func (c *cluster) createPodGroup(name string, minMember int32, timeoutSeconds *int32) {
	c.t.Helper()
	_, err := c.podGroups().Create(c.ctx, &v1alpha1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec:       v1alpha1.PodGroupSpec{MinMember: minMember, ScheduleTimeoutSeconds: timeoutSeconds},
	})
	if err != nil {
		c.t.Fatalf("creating PodGroup %s: %v", name, err)
	}
}

func (c *cluster) createGroupPod(group, name string, gpus int64, mutate ...func(*corev1.Pod)) {
	c.t.Helper()
	pod := testobj.MakePod(c.ns, name).Label(v1alpha1.PodGroupLabel, group).PodSpec(testobj.WorkerPodSpec(schedulerName, gpus)).Obj()
	for _, m := range mutate {
		m(pod)
	}
	if _, err := c.Client.CoreV1().Pods(c.ns).Create(c.ctx, pod, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("creating pod %s: %v", name, err)
	}
}

func (c *cluster) groupPods(group string) []corev1.Pod {
	c.t.Helper()
	return c.podsLabelled(v1alpha1.PodGroupLabel, group)
}

// waitPodGroupCondition waits for the PodGroup's Scheduled condition to have
// reason and a message containing each of parts.
func (c *cluster) waitPodGroupCondition(name, reason string, parts ...string) *v1alpha1.PodGroup {
	c.t.Helper()
	var pg *v1alpha1.PodGroup
	c.waitFor(fmt.Sprintf("PodGroup %s condition Scheduled reason %s %q", name, reason, parts), 60*time.Second, func() (bool, error) {
		var err error
		if pg, err = c.podGroups().Get(c.ctx, c.ns, name); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(pg.Status.Conditions, "Scheduled")
		if cond == nil || cond.Reason != reason {
			return false, nil
		}
		for _, part := range parts {
			if !contains(cond.Message, part) {
				return false, nil
			}
		}
		return true, nil
	})
	return pg
}

func TestPodGroupQuorum(t *testing.T) {
	c := startCluster(t, gpuNodes(4, 8)...)

	// minMember 3 with 3 pods: all bound, status follows.
	c.createPodGroup("three", 3, nil)
	for i := range 3 {
		c.createGroupPod("three", fmt.Sprintf("three-%d", i), 8)
	}
	c.waitFor("PodGroup three bound", 60*time.Second, func() (bool, error) {
		return countBound(c.groupPods("three")) == 3, nil
	})
	pg := c.waitPodGroupCondition("three", "GangScheduled")
	if pg.Status.Phase != v1alpha1.PodGroupScheduled || pg.Status.Scheduled != 3 {
		t.Errorf("PodGroup three status = phase %q scheduled %d, want Scheduled 3", pg.Status.Phase, pg.Status.Scheduled)
	}
	for _, p := range c.groupPods("three") {
		if err := c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}

	// minMember 4 with 3 pods: nothing bound, explained; the 4th pod
	// completes the gang.
	c.createPodGroup("four", 4, nil)
	for i := range 3 {
		c.createGroupPod("four", fmt.Sprintf("four-%d", i), 8)
	}
	pg = c.waitPodGroupCondition("four", "GangWaitingForMembers", "has 3 of 4 members")
	if pg.Status.Phase != v1alpha1.PodGroupPending {
		t.Errorf("PodGroup four phase %q, want Pending", pg.Status.Phase)
	}
	// Events with the same reason on the same object form one series that
	// keeps its first note (k8s.io/client-go/tools/events), so the current
	// count is read from the condition above, not from the Event.
	c.waitForEvent("PodGroup", "four", "GangWaitingForMembers", "of 4 members")
	if held := c.holdingPods(); len(held) != 0 {
		t.Fatalf("pods of an incomplete gang hold nodes: %v", held)
	}
	c.createGroupPod("four", "four-3", 8)
	c.waitFor("PodGroup four bound", 60*time.Second, func() (bool, error) {
		return countBound(c.groupPods("four")) == 4, nil
	})
}

// Members already bound (as after a scheduler restart mid-bind) count toward
// the quorum: the rest of the gang is placed and the gang completes.
func TestPartlyBoundGangCompletes(t *testing.T) {
	c := startCluster(t, gpuNodes(4, 8)...)
	c.createPodGroup("resume", 4, nil)
	for i := range 2 {
		c.createGroupPod("resume", fmt.Sprintf("resume-bound-%d", i), 8, func(p *corev1.Pod) { p.Spec.NodeName = fmt.Sprintf("node-%d", i+1) })
	}
	for i := range 2 {
		c.createGroupPod("resume", fmt.Sprintf("resume-pending-%d", i), 8)
	}
	c.waitFor("all 4 members bound", 60*time.Second, func() (bool, error) {
		return countBound(c.groupPods("resume")) == 4, nil
	})
	if nodes := nodesOf(c.groupPods("resume")); len(nodes) != 4 {
		t.Errorf("members share nodes: %v", nodes)
	}
}

// A pod naming a PodGroup that does not exist waits with a message saying so.
func TestMissingPodGroupIsExplained(t *testing.T) {
	c := startCluster(t, gpuNodes(1, 8)...)
	c.createGroupPod("ghost", "orphan", 1)
	c.waitFor("pod orphan explained", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "orphan", metav1.GetOptions{})
		return err == nil && unschedulableWith(p, "PodGroup ghost not found in namespace "+c.ns), err
	})
	// Creating the PodGroup is enough for the pod to be scheduled.
	c.createPodGroup("ghost", 1, nil)
	c.waitFor("pod orphan bound", 30*time.Second, func() (bool, error) {
		return countBound(c.groupPods("ghost")) == 1, nil
	})
}

// Gangs never cross namespaces: a pod naming a PodGroup of another namespace
// neither joins nor completes it, and waits with its own explanation.
func TestGangsDoNotCrossNamespaces(t *testing.T) {
	c := startCluster(t, gpuNodes(3, 8)...)
	other := *c
	other.ns = c.Namespace(t, "other")

	c.createPodGroup("team", 2, nil)
	c.createGroupPod("team", "team-0", 8)
	other.createGroupPod("team", "intruder", 8)
	c.waitPodGroupCondition("team", "GangWaitingForMembers")
	other.waitFor("intruder explained", 30*time.Second, func() (bool, error) {
		p, err := other.Client.CoreV1().Pods(other.ns).Get(other.ctx, "intruder", metav1.GetOptions{})
		return err == nil && unschedulableWith(p, "PodGroup team not found in namespace "+other.ns), err
	})
	pg, err := c.podGroups().Get(c.ctx, c.ns, "team")
	if err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(pg.Status.Conditions, "Scheduled"); cond == nil || !contains(cond.Message, "has 1 of 2 members") {
		t.Fatalf("PodGroup team counts a pod of another namespace: %+v", cond)
	}
	c.createGroupPod("team", "team-1", 8)
	c.waitFor("team bound", 60*time.Second, func() (bool, error) { return countBound(c.groupPods("team")) == 2, nil })
	if n := countBound(other.groupPods("team")); n != 0 {
		t.Errorf("pod of another namespace was bound with the gang")
	}
	// A PodGroup of the same name in the other namespace is its own gang.
	other.createPodGroup("team", 1, nil)
	other.waitFor("other namespace's gang bound", 60*time.Second, func() (bool, error) {
		return countBound(other.groupPods("team")) == 1, nil
	})
}

// The CRD schema rejects PodGroups muster could not serve.
func TestInvalidPodGroupRejected(t *testing.T) {
	c := startCluster(t, gpuNodes(1, 8)...)
	_, err := c.podGroups().Create(c.ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "zero-timeout", Namespace: c.ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 1, ScheduleTimeoutSeconds: ptr.To[int32](0)}})
	if err == nil || !apierrors.IsInvalid(err) {
		t.Errorf("PodGroup with scheduleTimeoutSeconds 0: error %v, want Invalid", err)
	}
	// minMember 0 is omitted on the wire, so the API server accepts the
	// PodGroup; muster explains it on the pods instead of guessing a quorum.
	c.createPodGroup("zero-min", 0, nil)
	c.createGroupPod("zero-min", "zero-min-0", 1)
	defer func() {
		if t.Failed() {
			for _, p := range c.groupPods("zero-min") {
				t.Logf("pod %s: node %q conditions %+v", p.Name, p.Spec.NodeName, p.Status.Conditions)
			}
		}
	}()
	c.waitFor("pod explained", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, "zero-min-0", metav1.GetOptions{})
		return err == nil && unschedulableWith(p, "PodGroup spec.minMember must be at least 1, got 0"), err
	})
}

// Deleting a member while its siblings wait at Permit releases them at once
// and says why.
func TestMemberDeletedReleasesGang(t *testing.T) {
	ext := startHoldingExtender(t, 1) // the second member to come is held
	c := startClusterWith(t, ext.Config(), gpuNodes(2, 8)...)
	c.createPodGroup("pair", 2, ptr.To[int32](600))
	c.createGroupPod("pair", "pair-0", 8, held)
	c.createGroupPod("pair", "pair-1", 8, held)
	defer func() {
		if t.Failed() {
			for _, p := range c.groupPods("pair") {
				t.Logf("pod %s: node %q nominated %q conditions %+v", p.Name, p.Spec.NodeName, p.Status.NominatedNodeName, p.Status.Conditions)
			}
		}
	}()
	var waiting, slow string
	c.waitFor("a member waiting at Permit, the other held", 30*time.Second, func() (bool, error) {
		passed, held := ext.membersAtPermit()
		if len(passed) != 1 || !held {
			return false, nil
		}
		waiting = passed[0]
		for _, p := range c.groupPods("pair") {
			if p.Name != waiting {
				slow = p.Name
			}
		}
		return slow != "", nil
	})
	if err := c.Client.CoreV1().Pods(c.ns).Delete(c.ctx, slow, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	c.waitForEvent("PodGroup", "pair", "GangRejected", "member "+slow+" was deleted or finished")
	ext.Release() // the deleted member's cycle ends; the scheduler goes on
	c.waitFor(waiting+" released", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(c.ctx, waiting, metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "" && unschedulableWith(p, "gang "+c.ns+"/podgroup/pair"), err
	})
}

// A PodGroup's minMember raised while its plan's members are being
// reserved is read again before the gang is released: the plan is dropped
// (cause quorum_raised) instead of binding the gang below its new quorum,
// nothing is held while the gang lacks a member and the PodGroup says so,
// and the gang binds whole once that member exists.
func TestPodGroupMinMemberRaisedWhilePlanned(t *testing.T) {
	ext := startHoldingExtender(t, 1) // the second member to come is held
	nodes := gpuNodes(3, 8)
	c := startClusterWith(t, ext.Config(), nodes...)
	c.addBackground(2, nodes...)
	c.createPodGroup("pair", 2, ptr.To[int32](600))
	c.createGroupPod("pair", "pair-0", 8, held)
	c.createGroupPod("pair", "pair-1", 8, held)
	c.waitOneAtPermit(ext)

	woken := counterOf(t, "muster_gang_wakes_total", "reason", "owner_changed")
	require.NoError(t, c.podGroups().Patch(c.ctx, c.ns, "pair", types.MergePatchType, []byte(`{"spec":{"minMember":3}}`), metav1.PatchOptions{}))
	// The scheduler's informer has the new quorum once its owner handler
	// woke the gang for it.
	c.waitFor("the scheduler saw minMember 3", 30*time.Second, func() (bool, error) {
		return counterOf(t, "muster_gang_wakes_total", "reason", "owner_changed") > woken, nil
	})
	ext.Release() // the held member reaches Permit: the plan would be complete
	c.waitForEvent("PodGroup", "pair", "GangRejected", "the gang's quorum rose to 3 while its plan for 2 members was being reserved")
	// The member that waited at Permit gives its nomination back as its
	// rejection is handled.
	c.waitFor("nothing held by a gang short of its new quorum", 30*time.Second, func() (bool, error) {
		return len(c.holdingPods()) == 0, nil
	})
	c.waitPodGroupCondition("pair", "GangWaitingForMembers", "has 2 of 3 members")
	require.Zero(t, countBound(c.groupPods("pair")))

	c.createGroupPod("pair", "pair-2", 8)
	c.waitFor("PodGroup pair bound", 60*time.Second, func() (bool, error) {
		return countBound(c.groupPods("pair")) == 3, nil
	})
}
