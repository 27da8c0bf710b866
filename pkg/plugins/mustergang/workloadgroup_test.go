package mustergang

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	"k8s.io/client-go/tools/cache"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// groupsHandle is a framework handle whose PodGroupManager knows groups.
type groupsHandle struct {
	fwk.Handle
	groups map[string]*schedulingv1beta1.PodGroup
}

func (h groupsHandle) PodGroupManager() fwk.PodGroupManager { return groupManager(h) }

type groupManager groupsHandle

func (m groupManager) PodGroups() fwk.PodGroupLister { return m }
func (m groupManager) PodGroupStates() fwk.PodGroupStateLister {
	panic("not used by muster")
}
func (m groupManager) CompositePodGroupStates() fwk.CompositePodGroupStateLister {
	panic("not used by muster")
}
func (m groupManager) CompositePodGroups() fwk.CompositePodGroupLister { panic("not used by muster") }
func (m groupManager) BuildHierarchySnapshotFromPod(*v1.Pod) (fwk.PodGroupManager, error) {
	panic("not used by muster")
}
func (m groupManager) GetRootKeyForGroup(fwk.EntityKey) (fwk.EntityKey, bool, error) {
	panic("not used by muster")
}
func (m groupManager) Get(namespace, name string) (*schedulingv1beta1.PodGroup, error) {
	if pg, ok := m.groups[namespace+"/"+name]; ok {
		return pg, nil
	}
	return nil, fmt.Errorf("podgroup %s/%s not found", namespace, name)
}

func workloadGroup(name string, mutate ...func(*schedulingv1beta1.PodGroup)) *schedulingv1beta1.PodGroup {
	pg := &schedulingv1beta1.PodGroup{}
	pg.Namespace, pg.Name = "ns", name
	pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: 4}
	for _, m := range mutate {
		m(pg)
	}
	return pg
}

func sourceWithGroups(groups ...*schedulingv1beta1.PodGroup) *gangSource {
	h := groupsHandle{groups: map[string]*schedulingv1beta1.PodGroup{}}
	for _, pg := range groups {
		h.groups[pg.Namespace+"/"+pg.Name] = pg
	}
	return &gangSource{handle: h, defaultTimeout: time.Minute,
		levels: []gang.Level{{Name: "node", Label: v1.LabelHostname}, {Name: "rack", Label: "example.com/rack"}, {Name: "zone", Label: v1.LabelTopologyZone}}}
}

// A basic group of a Job resolves to the Job's gang:
// TestWorkloadBasicGroupOfJobStaysAGang (integration).
func TestResolveWorkloadGroup(t *testing.T) {
	p := sourceWithGroups(
		workloadGroup("gang"),
		workloadGroup("in-rack", func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
				Topology: []schedulingv1beta1.TopologyConstraint{{Key: "example.com/rack"}}}
		}),
		workloadGroup("unknown-key", func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{
				Topology: []schedulingv1beta1.TopologyConstraint{{Key: "example.com/pod"}}}
		}),
		workloadGroup("basic", func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.SchedulingPolicy = schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}
		}),
	)
	tests := []struct {
		name         string
		pod          *v1.Pod
		inGang       bool
		quorum       int
		required     string
		errPart      string
		ownerIsGroup bool
	}{
		{name: "gang minCount", pod: testobj.MakePod("ns", "p").PodGroup("gang").Obj(), inGang: true, quorum: 4, ownerIsGroup: true},
		{name: "min-available lowers the quorum", pod: testobj.MakePod("ns", "p").PodGroup("gang").Annotation(gang.AnnotationMinAvailable, "3").Obj(),
			inGang: true, quorum: 3, ownerIsGroup: true},
		{name: "min-available above minCount", pod: testobj.MakePod("ns", "p").PodGroup("gang").Annotation(gang.AnnotationMinAvailable, "5").Obj(),
			inGang: true, errPart: "gang.minCount is 4"},
		{name: "topology key names a level", pod: testobj.MakePod("ns", "p").PodGroup("in-rack").Obj(), inGang: true, quorum: 4, required: "rack", ownerIsGroup: true},
		{name: "topology key names no level", pod: testobj.MakePod("ns", "p").PodGroup("unknown-key").Obj(), inGang: true, errPart: `"example.com/pod" is no topology level's nodeLabel`},
		{name: "missing group", pod: testobj.MakePod("ns", "p").PodGroup("nowhere").Obj(), inGang: true, errPart: "PodGroup nowhere not found"},
		{name: "basic group alone", pod: testobj.MakePod("ns", "p").PodGroup("basic").Obj(), inGang: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info, ref := resolved(t, p, tc.pod, tc.inGang, tc.errPart)
			if info == nil {
				return
			}
			assert.Equal(t, tc.quorum, info.Quorum)
			assert.Equal(t, tc.required, info.Required)
			assert.Equal(t, tc.ownerIsGroup, ref.APIVersion == "scheduling.k8s.io/v1beta1" && ref.Kind == "PodGroup")
		})
	}
}

// Every Event about the pods of a basic PodGroup (with WorkloadWithJob,
// every Job's) goes on their Job, where kubectl muster looks for the Job's
// gang: the ones the scheduling cycle records (resolve's owner) and the
// ones recorded later by the gang's key (ownerRef); so does the record of
// its failed plan. A gang-policy group speaks for itself.
func TestBasicGroupEventsGoOnItsJob(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Obj()
	src := sourceWithGroups(
		workloadGroup("train", func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.SchedulingPolicy = schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}
		}),
		workloadGroup("gang"))
	jobs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	require.NoError(t, jobs.Add(job))
	src.jobs = batchlisters.NewJobLister(jobs)
	src.gangIndex = gangIndexPrefix + "muster"
	src.pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{src.gangIndex: gangIndexFunc("muster")})
	member := testobj.MakePod("ns", "train-0").SchedulerName("muster").PodGroup("train").JobMember(job, 0).Obj()
	require.NoError(t, src.pods.Add(member))

	info, inGang, err := src.resolve(member)
	require.NoError(t, err)
	require.True(t, inGang)
	jobRef := &v1.ObjectReference{APIVersion: "batch/v1", Kind: "Job", Namespace: "ns", Name: "train", UID: "job-uid"}
	assert.Equal(t, jobRef, info.Ref, "the cycle's Events")
	assert.Equal(t, jobRef, src.ownerRef(info.Key), "the Events recorded by the gang's key")
	assert.Equal(t, gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "train"}, src.speaker(info.Key), "the failed plan's record")
	assert.Equal(t, "PodGroup", src.ownerRef(gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: "ns", Name: "gang"}).Kind)
}

func TestVictimKeyFollowsDisruptionMode(t *testing.T) {
	job := testobj.MakeJob("ns", "train").UID("job-uid").Obj()
	all := &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}
	p := sourceWithGroups(
		workloadGroup("whole", func(pg *schedulingv1beta1.PodGroup) { pg.Spec.DisruptionMode = all }),
		workloadGroup("single"),
		workloadGroup("basic", func(pg *schedulingv1beta1.PodGroup) {
			pg.Spec.SchedulingPolicy = schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}
		}),
	)
	tests := []struct {
		name  string
		pod   *v1.Pod
		unit  gang.Key
		whole bool
	}{
		{"disruptionMode all: the group", testobj.MakePod("ns", "p").PodGroup("whole").Obj(), gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: "ns", Name: "whole"}, true},
		{"disruptionMode single: the pod", testobj.MakePod("ns", "p").PodGroup("single").Obj(), gang.Key{}, false},
		{"basic group of a Job: the Job's gang", testobj.MakePod("ns", "p").PodGroup("basic").JobMember(job, 0).Obj(), gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: "ns", Name: "basic"}, true},
		{"basic group of nothing: the pod", testobj.MakePod("ns", "p").PodGroup("basic").Obj(), gang.Key{}, false},
		{"a Job's pod: the Job", testobj.MakePod("ns", "p").JobMember(job, 0).Obj(), gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "train"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			unit, whole := p.victimKey(tc.pod)
			assert.Equal(t, tc.whole, whole)
			if whole {
				assert.Equal(t, tc.unit, unit)
			}
		})
	}
}

func TestPriorityOfIsTheGroupsPriority(t *testing.T) {
	p := sourceWithGroups(workloadGroup("prio", func(pg *schedulingv1beta1.PodGroup) { pg.Spec.Priority = ptr.To[int32](500) }), workloadGroup("none"))
	assert.Equal(t, int32(500), p.priorityOf(testobj.MakePod("ns", "a").PodGroup("prio").Priority(10).Obj()))
	assert.Equal(t, int32(10), p.priorityOf(testobj.MakePod("ns", "b").PodGroup("none").Priority(10).Obj()))
	assert.Equal(t, int32(10), p.priorityOf(testobj.MakePod("ns", "c").Priority(10).Obj()))
}

func TestGroupPassFindsTheRefusedMember(t *testing.T) {
	cs := framework.NewCycleState()
	pods := []*v1.Pod{
		testobj.MakePod("ns", "w0").UID("u0").Obj(),
		testobj.MakePod("ns", "w1").UID("u1").Obj(),
		testobj.MakePod("ns", "w2").UID("u2").Obj(),
	}
	pass := passOf(cs, 7)
	require.Same(t, pass, passOf(cs, 7), "one record per pass and plan")
	for i, pod := range pods {
		pass.steered(pod, fmt.Sprintf("node-%d", i))
	}
	pass.reserved("u0")
	pass.reserved("u2")
	refused := pass.refusedMember()
	require.NotNil(t, refused)
	assert.Equal(t, passMember{uid: types.UID("u1"), name: "w1", node: "node-1"}, *refused)

	pass.reserved("u1")
	assert.Nil(t, pass.refusedMember(), "every steered member reserved")
	assert.Nil(t, (*groupPass)(nil).refusedMember(), "a member not steered in a pass")
	assert.NotSame(t, pass, passOf(cs, 8), "another plan's pass starts afresh")
}

// A planned member that another plugin's PreFilter refused never reaches
// muster's in the pass: it is found among the group's unscheduled pods.
// Members muster saw and held back (their devices not released yet), those
// reserved earlier, gated ones and pods outside the plan are not refused.
func TestGroupPassFindsTheUnseenMember(t *testing.T) {
	pod := func(name string) *v1.Pod { return testobj.MakePod("ns", name).UID("u-" + name).Obj() }
	plan := &gang.ActivePlan{
		Plan:     gang.Plan{Slots: map[types.UID]string{"u-placed": "n1", "u-held": "n2", "u-earlier": "n3", "u-gated": "n4", "u-refused": "n5"}},
		Reserved: sets.New[types.UID]("u-earlier", "u-placed"),
	}
	pass := passOf(framework.NewCycleState(), 7)
	pass.saw("u-placed")
	pass.steered(pod("placed"), "n1")
	pass.reserved("u-placed")
	pass.saw("u-held") // muster held it back for its devices
	gated := testobj.MakePod("ns", "gated").UID("u-gated").SchedulingGate("example.com/wait").Obj()
	unscheduled := map[string]*v1.Pod{"held": pod("held"), "gated": gated, "refused": pod("refused"), "stranger": pod("stranger")}

	require.Nil(t, pass.refusedMember(), "every steered member reserved")
	refused := pass.unseenMember(plan, unscheduled)
	require.NotNil(t, refused)
	assert.Equal(t, passMember{uid: "u-refused", name: "refused", node: "n5"}, *refused)

	delete(unscheduled, "refused")
	assert.Nil(t, pass.unseenMember(plan, unscheduled), "no planned member unseen")
}

// snapshotHandle is a framework handle whose cycle snapshot holds one
// group's unscheduled pods, and whose live PodGroupManager holds live.
type snapshotHandle struct {
	fwk.Handle
	unscheduled map[string]*v1.Pod
	live        map[string]*v1.Pod
}

func (h snapshotHandle) SnapshotSharedLister() fwk.SharedLister { return snapshotLister(h) }
func (h snapshotHandle) PodGroupManager() fwk.PodGroupManager {
	return liveManager{unscheduled: snapshotLister{unscheduled: h.live}}
}

type liveManager struct {
	fwk.PodGroupManager
	unscheduled snapshotLister
}

func (m liveManager) PodGroupStates() fwk.PodGroupStateLister { return m.unscheduled }

type snapshotLister snapshotHandle

func (l snapshotLister) NodeInfos() fwk.NodeInfoLister                             { panic("not used") }
func (l snapshotLister) StorageInfos() fwk.StorageInfoLister                       { panic("not used") }
func (l snapshotLister) PodGroups() fwk.PodGroupLister                             { panic("not used") }
func (l snapshotLister) CompositePodGroupStates() fwk.CompositePodGroupStateLister { panic("not used") }
func (l snapshotLister) CompositePodGroups() fwk.CompositePodGroupLister           { panic("not used") }
func (l snapshotLister) PodGroupStates() fwk.PodGroupStateLister                   { return l }
func (l snapshotLister) Get(_, _ string) (fwk.PodGroupState, error) {
	return snapshotGroup{unscheduled: l.unscheduled}, nil
}

type snapshotGroup struct {
	fwk.PodGroupState
	unscheduled map[string]*v1.Pod
}

func (g snapshotGroup) UnscheduledPods() map[string]*v1.Pod { return g.unscheduled }

// Permit finds a planned member the pass never saw among the group's
// unscheduled pods of the cycle's snapshot: one created after the core took
// it (muster planned it from its informer) is not in the pass, and is left
// to a later cycle rather than taken for a member another plugin refused.
func TestMemberCreatedAfterTheGroupCycleBeganIsNotRefused(t *testing.T) {
	pod := func(name string) *v1.Pod { return testobj.MakePod("ns", name).UID("u-" + name).PodGroup("pg").Obj() }
	placed, refused, late := pod("placed"), pod("refused"), pod("late")
	key := gang.Key{Kind: gang.KindWorkloadPodGroup, Namespace: "ns", Name: "pg"}
	h := snapshotHandle{unscheduled: map[string]*v1.Pod{"refused": refused}, live: map[string]*v1.Pod{"refused": refused, "late": late}}
	p := &Plugin{handle: h, gangs: gang.NewManager()}
	plan := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{placed.UID: "n1", refused.UID: "n2", late.UID: "n3"}},
		Reserved: sets.New[types.UID]()}
	_, ok := p.gangs.Install(key, plan, placed.UID, "planned", t0, nil, 0)
	require.True(t, ok)
	installed := p.gangs.Plan(key)
	pass := passOf(framework.NewCycleState(), installed.ID)
	pass.saw(placed.UID)
	pass.steered(placed, "n1")
	pass.reserved(placed.UID)
	s := &cycleState{slot: "n1", planID: installed.ID, key: key, pass: pass}

	got, atSlot := p.refusedInPass(s)
	require.NotNil(t, got, "the member another plugin refused in the pass")
	assert.Equal(t, "refused", got.name)
	assert.False(t, atSlot)

	delete(h.unscheduled, "refused")
	got, _ = p.refusedInPass(s)
	assert.Nil(t, got, "the member created after the snapshot is not in the pass, and not refused")
}

// unscheduledGroup is a pod group cycle's group of pods.
type unscheduledGroup struct {
	fwk.PodGroupInfo
	pods []*v1.Pod
}

func (g unscheduledGroup) GetUnscheduledPods() []*v1.Pod { return g.pods }

// muster's PreFilter held the group's members back for the plan's victims;
// the last victim went before PodGroupPostFilter ran (the core requeues the
// group on the deletion before muster's handler counts it gone). The plan
// stands: it was waiting, not refused.
func TestPodGroupPostFilterKeepsAPlanHeldBackForItsVictims(t *testing.T) {
	high := worker("j", 0, 8, "")
	f := newTestFramework(t, 1, []*v1.Node{gpuNode("n1", 8)}, []*v1.Pod{high})
	key, _ := gang.KeyOf(high)
	plan := &gang.ActivePlan{Plan: gang.Plan{Slots: map[types.UID]string{high.UID: "n1"}}, Reserved: sets.New[types.UID](),
		Victims: sets.New[types.UID]("victim"), Profile: f.plugin.handle.ProfileName(), Created: f.clock.Now(), Deadline: f.clock.Now().Add(time.Minute)}
	_, ok := f.plugin.gangs.Install(key, plan, high.UID, "preempting", t0, nil, 0)
	require.True(t, ok)
	cs := framework.NewCycleState() // the group's
	state := framework.NewCycleState()
	state.SetPodGroupSchedulingCycle(cs)
	_, status := f.plugin.PreFilter(context.Background(), state, high, f.nodes)
	require.Contains(t, status.Message(), "waits for them; 1 of them still terminating", "PreFilter holds the member back")
	f.plugin.carryOut(context.Background(), f.plugin.gangs.VictimGone("victim", f.plugin.handle.ProfileName()), nil)

	result, status := f.plugin.PodGroupPostFilter(context.Background(), cs, unscheduledGroup{pods: []*v1.Pod{high}}, nil)
	assert.Equal(t, fwk.Unschedulable, status.Code())
	assert.Contains(t, status.Message(), "waited for the pods it preempted")
	require.NotNil(t, f.plugin.gangs.Plan(key), "the plan waiting for its victims was dropped")
	require.NotNil(t, result)
	assert.Equal(t, "n1", result.NominatingInfos[types.NamespacedName{Namespace: "ns", Name: high.Name}].NominatedNodeName)
}

// A group's cycle placed none of three members, of whom two make the
// quorum. Its PodGroupPostFilter preempts for the gang through the first
// member, which the plan leaves out (it places j-0 and j-1): the others are
// still nominated to their slots and the group's preemption succeeds.
func TestPodGroupPostFilterNominatesThePlanWhateverMemberPreempted(t *testing.T) {
	low := lowGang("low", "n1", "n2")
	var high []*v1.Pod
	for i := range 3 {
		p := worker("j", i, 8, "")
		p.Spec.Priority = ptr.To[int32](100)
		p.Annotations = map[string]string{gang.AnnotationMinAvailable: "2"}
		high = append(high, p)
	}
	f := newTestFramework(t, 3, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, append(low, high...))
	_, status := f.preFilter(t, high[2])
	require.False(t, status.IsSuccess(), "the low gang fills both nodes")

	cs := framework.NewCycleState()
	group := unscheduledGroup{pods: []*v1.Pod{high[2], high[0], high[1]}}
	result, status := f.plugin.PodGroupPostFilter(context.Background(), cs, group, nil)
	require.True(t, status.IsSuccess(), "status %v", status)
	key, _ := gang.KeyOf(high[0])
	plan := f.plugin.gangs.Plan(key)
	require.NotNil(t, plan)
	require.NotContains(t, plan.Slots, high[2].UID, "the test wants the first member left out")
	require.NotNil(t, result)
	for _, p := range high[:2] {
		info := result.NominatingInfos[types.NamespacedName{Namespace: "ns", Name: p.Name}]
		require.NotNil(t, info, "%s not nominated", p.Name)
		assert.Equal(t, plan.Slots[p.UID], info.NominatedNodeName)
	}
	assert.Len(t, result.NominatingInfos, 2)
}
