package mustergang

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// onPodAdd is onPodChange, and a new pending member that completes its
// gang's quorum wakes the siblings held at PreEnqueue (the framework only
// delivers other pods' additions to them with native gangs on).
func (p *Plugin) onPodAdd(obj interface{}) {
	p.source.podEvent()
	p.onPodChange(obj)
	pod, ok := obj.(*v1.Pod)
	if !ok || pod.Spec.NodeName != "" || pod.Spec.SchedulerName != p.handle.ProfileName() {
		return
	}
	info, ok, _ := p.source.resolve(pod)
	if !ok || info.Quorum == 0 {
		return // alone, or its gang's owner cannot be read
	}
	p.provisioning.podAdded(info.Key)
	if p.source.liveCount(info.Key) >= info.Quorum {
		p.wake(p.logger(), info.Key, gang.WakeQuorumReached, p.source.members(info.Key).pending)
	}
}

// onPodChange keeps the gang manager current: a member seen bound is no longer
// in flight, and PodGroup status follows the gang.
func (p *Plugin) onPodChange(obj interface{}) {
	pod, ok := obj.(*v1.Pod)
	if !ok || pod.Spec.SchedulerName != p.handle.ProfileName() {
		return
	}
	if pod.Spec.NodeName != "" {
		p.source.facts.forget(pod.UID) // planned no more
	}
	key, ok := gang.KeyOf(pod)
	if !ok {
		if pod.Spec.NodeName != "" {
			p.forget(gang.LoneKey(pod)) // a lone pod's state ends with its binding
		}
		return
	}
	p.gangs.FirstSeen(key, pod.CreationTimestamp.Time)
	if pod.Spec.NodeName != "" {
		p.gangs.MemberBound(key, pod.UID, pod.CreationTimestamp.Time)
	}
	p.status.enqueue(key)
}

// onPodUpdate is onPodChange; a member that starts terminating is gone
// for its gang's plan (it will not run, though its grace period may be
// long); and a pending member whose last scheduling gate was removed wakes
// its gang's pending members: a sibling refused while it was gated ("held
// by scheduling gates") tries again. The framework delivers the member's
// own update to it alone.
func (p *Plugin) onPodUpdate(oldObj, obj interface{}) {
	p.source.podEvent()
	p.onPodChange(obj)
	old, ok := oldObj.(*v1.Pod)
	pod, ok2 := obj.(*v1.Pod)
	if ok && ok2 && old.DeletionTimestamp == nil && pod.DeletionTimestamp != nil && pod.Spec.SchedulerName == p.handle.ProfileName() {
		if key, inGang := gang.KeyOf(pod); inGang {
			p.carryOut(p.handlerCtx(), p.gangs.MemberGone(key, pod.UID, pod.Name, p.now(), p.backoffBase()), nil)
		}
	}
	if !ok || !ok2 || len(old.Spec.SchedulingGates) == 0 || len(pod.Spec.SchedulingGates) > 0 ||
		pod.Spec.NodeName != "" || pod.Spec.SchedulerName != p.handle.ProfileName() {
		return
	}
	if info, inGang, _ := p.source.resolve(pod); inGang {
		if set := p.source.members(info.Key); ungatingMayUnblock(info, set, p.gangs.Phase(info.Key)) {
			p.wake(p.logger(), info.Key, gang.WakeMemberUngated, set.pending)
		}
	}
}

// ungatingMayUnblock reports whether a member's ungating can let its gang go
// ahead: enough members are pending now to reach the quorum, and the gang
// is not already planned or placed. Members ungated one by one before that
// wake nobody: for a gang of 1000 that is a million activations saved.
// When the quorum cannot be read, it wakes.
func ungatingMayUnblock(info *gang.Resolved, set memberSet, phase gang.Phase) bool {
	switch phase {
	case gang.PhasePlanned, gang.PhasePreempting, gang.PhasePermitted, gang.PhaseBound:
		return false
	}
	if info.Quorum == 0 {
		return true
	}
	needed := info.Quorum - set.bound()
	return needed > 0 && len(set.pending) >= needed
}

// recordFinished asks the API server whether a member that left the
// informer succeeded (the watch reports the last live state); if so it
// counts toward its PodGroup's quorum and the rest of the gang is woken.
func (p *Plugin) recordFinished(key gang.Key, pod *v1.Pod) {
	ctx, cancel := context.WithTimeout(p.handlerCtx(), 30*time.Second)
	defer cancel()
	current, err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || current.UID != pod.UID || current.Status.Phase != v1.PodSucceeded {
		return
	}
	if p.gangs.Succeed(key, pod.UID) {
		p.wake(p.logger(), key, gang.WakeMemberSucceeded, p.source.members(key).pending)
		p.status.enqueue(key)
	}
}

// onPodDelete releases a gang whose planned member disappeared (deleted,
// failed or succeeded: the informer only holds live pods) and forgets gangs
// that ended (gangEnded).
func (p *Plugin) onPodDelete(obj interface{}) {
	p.source.podEvent()
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	p.source.facts.forget(pod.UID)
	ctx := p.handlerCtx()
	p.carryOut(ctx, p.gangs.VictimGone(pod.UID, p.handle.ProfileName()), nil)
	if pod.Spec.SchedulerName != p.handle.ProfileName() {
		return
	}
	key, ok := gang.KeyOf(pod)
	if !ok {
		// A pod scheduled alone that preempted: its hold goes with it.
		lone := gang.LoneKey(pod)
		p.carryOut(ctx, p.gangs.MemberGone(lone, pod.UID, pod.Name, p.now(), p.backoffBase()), nil)
		p.forget(lone)
		return
	}
	if key.Kind == gang.KindPodGroup && pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil {
		// A bound member left the informer (which holds live pods only)
		// without being deleted first: it may have finished. (A Job's
		// quorum follows the Job's status instead.)
		go p.recordFinished(key, pod)
	}
	p.carryOut(ctx, p.gangs.MemberGone(key, pod.UID, pod.Name, p.now(), p.backoffBase()), nil)
	p.forgetIfEnded(key)
	p.status.enqueue(key)
}

// forgetIfEnded forgets the gang if it ended (gangEnded). Besides a pod's
// deletion, every cycle that records something of a gang (PreFilter, the
// PostFilters' preemption) asks it last: the gang may have ended during the
// cycle, its deletion's forget coming before what the cycle recorded (a
// refusal and its backoff, a preemption attempt), which would outlive the
// gang and be inherited by a new one of the same name.
func (p *Plugin) forgetIfEnded(key gang.Key) {
	if p.source.gangEnded(key) {
		p.forget(key)
	}
}

// forget drops a gang that has no pods left, releasing a plan it still
// had, and the timers that would wake its members. Every bound pod
// scheduled alone comes here: only a gang the manager knew can have timers.
func (p *Plugin) forget(key gang.Key) {
	e, known := p.gangs.Forget(key, p.now())
	p.carryOut(p.handlerCtx(), e, nil)
	if known {
		p.timers.forget(key)
	}
	p.provisioning.forget(key)
}

// onNodeChange drops the active plans that a node change breaks: a planned
// node deleted (a spot node reclaimed), cordoned, being reclaimed, or no
// longer matching a member planned there (a taint it does not tolerate, a
// label its node affinity needs). Members waiting at Permit on it are
// rejected at once instead of being bound to a node that cannot run them;
// the pairs are avoided so the next plan, made at once, goes elsewhere even
// before the scheduler's snapshot shows the change. Each profile drops its
// own plans. old is the node before the change (nil when deleted).
func (p *Plugin) onNodeChange(old, node *v1.Node, deleted bool) {
	for _, np := range p.gangs.PlansOn(node.Name) {
		if np.Profile != p.handle.ProfileName() {
			continue
		}
		why := p.brokenPlacement(old, node, deleted, np)
		if why == "" {
			continue
		}
		now := p.now()
		p.carryOut(p.handlerCtx(), p.gangs.NodeChanged(np.Key, np.PlanID, node.Name, why, now, now.Add(gang.AvoidFor)), nil)
	}
}

// brokenPlacement says why node can no longer take the members np planned
// on it ("" when it still can). It runs in an informer handler, outside any
// scheduling cycle, where the framework's filters cannot run (the snapshot
// is the cycle's), so it asks the planner's own screening
// (gang.NodeConstraints: taints, node selector, required node affinity, as
// the framework's helpers evaluate them). A member not yet reserved is
// checked again by the filters in its own cycle anyway; this is what
// releases members already waiting at Permit.
//
// A member also no longer fits when the node's allocatable of a resource it
// asks for went down (a GPU the device plugin found unhealthy): the kubelet
// would refuse a member bound over what is left. Whether what is left still
// holds it cannot be told here, so any loss breaks the plan, which is
// planned again at once.
func (p *Plugin) brokenPlacement(old, node *v1.Node, deleted bool, np gang.NodePlan) string {
	switch {
	case deleted:
		return "was deleted"
	case node.Spec.Unschedulable:
		return "was cordoned"
	case p.nodes.reclaiming(node):
		return "is being reclaimed"
	}
	// Relabelled out of the domain the gang was placed in: the members
	// planned elsewhere stay in the old one.
	if domain, ok := p.nodes.topology.LabelDomain(np.Level, node); ok && domain != np.Domain {
		return fmt.Sprintf("left %s %s (it is now in %s %q)", np.Level, np.Domain, np.Level, domain)
	}
	logger := p.logger()
	preemptible := p.nodes.preemptible(node)
	for _, m := range p.plannedPending(np) {
		if !gang.ConstraintsOf(logger, m).Match(node) {
			return fmt.Sprintf("no longer fits member %s (a taint it does not tolerate, or its node selector or affinity)", m.Name)
		}
		if lost := lostAllocatable(old, node, m); lost != "" {
			return fmt.Sprintf("lost allocatable %s, which member %s asks for", lost, m.Name)
		}
		// The planner applied the policy; Filter does not ask again for a
		// planned member.
		if c, err := gang.ConstraintsFromPod(m, p.nodes.levels); err == nil && c.Policy.Excludes(preemptible) {
			return fmt.Sprintf("is preemptible=%t now, which member %s's preemptible policy %s excludes", preemptible, m.Name, c.Policy)
		}
	}
	return ""
}

// plannedPending are the gang's pending members that np planned on its node.
func (p *Plugin) plannedPending(np gang.NodePlan) []*v1.Pod {
	planned := make(map[types.UID]bool, len(np.Members))
	for _, uid := range np.Members {
		planned[uid] = true
	}
	var out []*v1.Pod
	for _, m := range p.source.members(np.Key).pending {
		if planned[m.UID] {
			out = append(out, m)
		}
	}
	return out
}

// lostAllocatable names a resource pod asks for of which node has less
// allocatable than old had ("" for none).
func lostAllocatable(old, node *v1.Node, pod *v1.Pod) string {
	if old == nil {
		return ""
	}
	for _, name := range slices.Sorted(maps.Keys(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}))) {
		was, now := old.Status.Allocatable[name], node.Status.Allocatable[name]
		if now.Cmp(was) < 0 {
			return fmt.Sprintf("%s (%s, was %s)", name, now.String(), was.String())
		}
	}
	return ""
}

// nodeHandler feeds onNodeChange from the scheduler's node informer.
func (p *Plugin) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, obj interface{}) {
			old, ok1 := oldObj.(*v1.Node)
			node, ok2 := obj.(*v1.Node)
			// Most updates are the kubelet's status heartbeats: nothing a
			// placement depends on.
			if ok1 && ok2 && !(equality.Semantic.DeepEqual(old.Spec, node.Spec) && maps.Equal(old.Labels, node.Labels) &&
				equality.Semantic.DeepEqual(old.Status.Allocatable, node.Status.Allocatable)) {
				p.onNodeChange(old, node, false)
			}
		},
		DeleteFunc: func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if node, ok := obj.(*v1.Node); ok {
				p.nodes.forget(node.Name)
				p.onNodeChange(nil, node, true)
			}
		},
	}
}

// sliceHandler drops the plans that a ResourceSlice change breaks: a
// node's slice that lost devices (the driver took an unhealthy GPU out of
// it, or the slice was deleted) changes no Node, and a member planned on
// that node's DRA devices would otherwise stay reserved, bind when its
// siblings come and find its devices gone.
func (p *Plugin) sliceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, obj interface{}) {
			old, ok1 := oldObj.(*resourceapi.ResourceSlice)
			slice, ok2 := obj.(*resourceapi.ResourceSlice)
			if ok1 && ok2 {
				if lost := lostDevices(old, slice); lost != "" {
					p.onDevicesLost(slice, lost)
				}
			}
		},
		DeleteFunc: func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if slice, ok := obj.(*resourceapi.ResourceSlice); ok && len(slice.Spec.Devices) > 0 {
				p.onDevicesLost(slice, fmt.Sprintf("ResourceSlice %s was deleted", slice.Name))
			}
		},
	}
}

// lostDevices says which devices of old slice are gone from slice, or newly
// tainted there so that no new pod gets them (NoSchedule) or their pods are
// evicted (NoExecute) ("" for none).
func lostDevices(old, slice *resourceapi.ResourceSlice) string {
	left := make(map[string]*resourceapi.Device, len(old.Spec.Devices)) // old's devices not seen in slice yet
	for i := range old.Spec.Devices {
		left[old.Spec.Devices[i].Name] = &old.Spec.Devices[i]
	}
	var tainted []string
	for _, d := range slice.Spec.Devices {
		before := left[d.Name]
		if before == nil {
			continue // a new device
		}
		delete(left, d.Name)
		for _, t := range d.Taints {
			if keepsPodsOff(t) && !slices.ContainsFunc(before.Taints, func(o resourceapi.DeviceTaint) bool { return sameTaint(o, t) }) {
				tainted = append(tainted, fmt.Sprintf("%s (%s=%s:%s)", d.Name, t.Key, t.Value, t.Effect))
			}
		}
	}
	var gone []string
	for _, d := range old.Spec.Devices { // in the slice's order
		if left[d.Name] != nil {
			gone = append(gone, d.Name)
		}
	}
	var parts []string
	if len(gone) > 0 {
		parts = append(parts, "lost devices "+strings.Join(gone, ", "))
	}
	if len(tainted) > 0 {
		parts = append(parts, "tainted devices "+strings.Join(tainted, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("ResourceSlice %s %s", slice.Name, strings.Join(parts, "; "))
}

// keepsPodsOff reports whether a device taint keeps new pods off the device
// (NoSchedule) or evicts them (NoExecute): a planned member's device is lost.
func keepsPodsOff(t resourceapi.DeviceTaint) bool {
	return t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute
}

func sameTaint(a, b resourceapi.DeviceTaint) bool {
	return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
}

// taintRuleHandler drops the plans whose DRA devices a DeviceTaintRule
// newly taints NoSchedule or NoExecute: the rule changes no ResourceSlice
// (the scheduler applies it to its own copy), so the slice handler never
// sees it, and a member reserved on such a device would bind with its
// siblings and be evicted by the taint after the gang started.
func (p *Plugin) taintRuleHandler(sliceLister resourcelisters.ResourceSliceLister) cache.ResourceEventHandler {
	onRule := func(old, rule *resourceapi.DeviceTaintRule) {
		if !keepsPodsOff(rule.Spec.Taint) || (old != nil && sameTaint(old.Spec.Taint, rule.Spec.Taint) &&
			equality.Semantic.DeepEqual(old.Spec.DeviceSelector, rule.Spec.DeviceSelector)) {
			return
		}
		all, err := sliceLister.List(labels.Everything())
		if err != nil {
			return
		}
		t := rule.Spec.Taint
		for _, slice := range all {
			if devices := taintedBy(rule.Spec.DeviceSelector, slice); len(devices) > 0 {
				p.onDevicesLost(slice, fmt.Sprintf("DeviceTaintRule %s taints devices %s of ResourceSlice %s (%s=%s:%s)",
					rule.Name, strings.Join(devices, ", "), slice.Name, t.Key, t.Value, t.Effect))
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			if rule, ok := obj.(*resourceapi.DeviceTaintRule); ok {
				onRule(nil, rule)
			}
		},
		UpdateFunc: func(oldObj, obj interface{}) {
			old, ok1 := oldObj.(*resourceapi.DeviceTaintRule)
			rule, ok2 := obj.(*resourceapi.DeviceTaintRule)
			if ok1 && ok2 {
				onRule(old, rule)
			}
		},
	}
}

// taintedBy lists the devices of slice that sel selects (by driver, pool
// and device name; a nil selector selects every device).
func taintedBy(sel *resourceapi.DeviceTaintSelector, slice *resourceapi.ResourceSlice) []string {
	if sel != nil && ((sel.Driver != nil && *sel.Driver != slice.Spec.Driver) || (sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name)) {
		return nil
	}
	var out []string
	for _, d := range slice.Spec.Devices {
		if sel == nil || sel.Device == nil || *sel.Device == d.Name {
			out = append(out, d.Name)
		}
	}
	return out
}

// onDevicesLost drops the plans with a member on the slice's node that
// takes DRA devices there: one with ResourceClaims, or an extended resource
// the node's allocatable does not serve (a DeviceClass does). Whether the
// devices left still hold it cannot be told here, as for a device-plugin
// GPU lost from allocatable: the plan is made again at once.
func (p *Plugin) onDevicesLost(slice *resourceapi.ResourceSlice, lost string) {
	if slice.Spec.NodeName == nil || *slice.Spec.NodeName == "" {
		return // not a node's own devices: no plan counts them
	}
	nodeName := *slice.Spec.NodeName
	node, err := p.handle.SharedInformerFactory().Core().V1().Nodes().Lister().Get(nodeName)
	if err != nil {
		return // the node is gone: its deletion dropped the plans
	}
	for _, np := range p.gangs.PlansOn(nodeName) {
		if np.Profile != p.handle.ProfileName() {
			continue
		}
		for _, m := range p.plannedPending(np) {
			if !takesDRADevices(m, node) {
				continue
			}
			why := fmt.Sprintf("lost DRA devices, which member %s takes (%s)", m.Name, lost)
			now := p.now()
			p.carryOut(p.handlerCtx(), p.gangs.NodeChanged(np.Key, np.PlanID, nodeName, why, now, now.Add(gang.AvoidFor)), nil)
			break
		}
	}
}

// takesDRADevices reports whether pod would take DRA devices on node: it
// has ResourceClaims, or asks for an extended resource that node's
// allocatable does not list (so only a DeviceClass can serve it).
func takesDRADevices(pod *v1.Pod, node *v1.Node) bool {
	if len(pod.Spec.ResourceClaims) > 0 {
		return true
	}
	for name := range resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{}) {
		if _, served := node.Status.Allocatable[name]; !served && schedutil.IsDRAExtendedResourceName(name) {
			return true
		}
	}
	return false
}

// watchPodGroups watches PodGroups when discovery shows the CRD, so the
// scheduler never waits on an API that is not served. The informer starts
// with the scheduler's own, once active has synced (the scheduler's pod
// informer): with delayCacheUntilActive (manifests/scheduler) that is when
// this replica becomes the leader. A standby that watched PodGroups would
// write their status from its own view, which holds no plans, over the
// leader's.
func (p *Plugin) watchPodGroups(ctx context.Context, active cache.InformerSynced) error {
	logger := klog.FromContext(ctx)
	cfg := p.handle.KubeConfig()
	if cfg == nil {
		return nil
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	if !podGroupsServed(disco) {
		logger.Info("PodGroup API not served; PodGroup gangs are disabled until the CRD is installed and the scheduler restarted",
			"resource", v1alpha1.Resource.String())
		return nil
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	informer := factory.ForResource(v1alpha1.Resource)
	handled, err := informer.Informer().AddEventHandler(p.ownerHandler(gang.KindPodGroup))
	if err != nil {
		return err
	}
	p.source.pgClient = v1alpha1.NewClient(dyn)
	p.source.podGroups, p.source.podGroupsSynced = informer.Lister(), handled.HasSynced
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), active) {
			return
		}
		logger.Info("Watching PodGroups", "resource", v1alpha1.Resource.String())
		factory.Start(ctx.Done())
		// PreEnqueue holds PodGroup gangs until the list is in; say so if
		// it takes long (RBAC that does not let muster list PodGroups).
		slow := time.AfterFunc(podGroupsListWarning, func() {
			logger.Error(nil, "PodGroups not listed yet; PodGroup gangs wait until they are (can muster list and watch them?)",
				"resource", v1alpha1.Resource.String(), "after", podGroupsListWarning)
		})
		if cache.WaitForCacheSync(ctx.Done(), handled.HasSynced) {
			slow.Stop()
			p.wakePodGroupGangs()
		}
	}()
	return nil
}

// podGroupsListWarning is how long listing PodGroups may take before
// muster logs that PodGroup gangs wait for it.
const podGroupsListWarning = 30 * time.Second

// wakePodGroupGangs wakes the pending members of every PodGroup gang once
// muster has listed the PodGroups. PreEnqueue turned such a member away
// while the list was under way (gangSource.PodGroup), and its PodGroup's
// Add may have been handled before that, waking nothing.
func (p *Plugin) wakePodGroupGangs() {
	groups := map[gang.Key]bool{}
	for _, value := range p.source.pods.ListIndexFuncValues(p.source.gangIndex) {
		// A value is one gang's key, or a controller's whose pods are in
		// Kubernetes PodGroups: the first pod tells which.
		if objs, _ := p.source.pods.ByIndex(p.source.gangIndex, value); len(objs) > 0 {
			if key, ok := gang.KeyOf(objs[0].(*v1.Pod)); ok && key.Kind == gang.KindPodGroup {
				groups[key] = true
			}
		}
	}
	for key := range groups {
		p.wake(p.logger(), key, gang.WakeOwnerChanged, p.source.members(key).pending)
	}
}

func podGroupsServed(disco discovery.DiscoveryInterface) bool {
	list, err := disco.ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	if err != nil || list == nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == v1alpha1.Resource.Resource {
			return true
		}
	}
	return false
}

// ownerHandler wakes a gang's pods when its Job, StatefulSet or PodGroup is
// added or changes its quorum. This is the only path by which an owner's
// change reaches the queue (see EventsToRegister): the handler runs on the
// informer whose lister the plugin reads, so the woken pods see the change.
func (p *Plugin) ownerHandler(kind gang.Kind) cache.ResourceEventHandler {
	wake := func(obj interface{}) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		key := gang.Key{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName()}
		p.wake(p.logger(), key, gang.WakeOwnerChanged, p.source.members(key).pending)
		// Kubernetes PodGroups of the basic policy take their quorum from
		// the Job or StatefulSet that made them (resolve).
		for _, group := range p.source.groupsControlledBy(key) {
			p.wake(p.logger(), group, gang.WakeOwnerChanged, p.source.members(group).pending)
		}
		p.status.enqueue(key)
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: wake,
		UpdateFunc: func(oldObj, obj interface{}) {
			if quorumUnchanged(oldObj, obj) {
				return // most status writes (ours included) change no quorum
			}
			wake(obj)
		},
	}
	if kind == gang.KindPodGroup {
		// A PodGroup's gang outlives its pods until the object goes
		// (gangEnded).
		handler.DeleteFunc = func(obj interface{}) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if m, err := meta.Accessor(obj); err == nil {
				if key := (gang.Key{Kind: kind, Namespace: m.GetNamespace(), Name: m.GetName()}); p.source.gangEnded(key) {
					p.forget(key)
				}
			}
		}
	}
	return handler
}

// quorumUnchanged reports whether an update of a gang's owner cannot change
// its quorum: the spec (metadata.generation) is the same and so are the
// counts of finished members the quorum subtracts (a Job's status, a
// PodGroup's status.succeeded).
func quorumUnchanged(oldObj, newObj interface{}) bool {
	o, err1 := meta.Accessor(oldObj)
	n, err2 := meta.Accessor(newObj)
	if err1 != nil || err2 != nil || o.GetGeneration() != n.GetGeneration() {
		return false
	}
	oj, ok1 := oldObj.(*batchv1.Job)
	nj, ok2 := newObj.(*batchv1.Job)
	if ok1 && ok2 {
		return oj.Status.Succeeded == nj.Status.Succeeded && oj.Status.Failed == nj.Status.Failed &&
			ptr.Deref(oj.Status.FailedIndexes, "") == ptr.Deref(nj.Status.FailedIndexes, "")
	}
	opg, ok1 := oldObj.(*unstructured.Unstructured)
	npg, ok2 := newObj.(*unstructured.Unstructured)
	if ok1 && ok2 {
		a, _, _ := unstructured.NestedFieldNoCopy(opg.Object, "status", "succeeded")
		b, _, _ := unstructured.NestedFieldNoCopy(npg.Object, "status", "succeeded")
		return a == b
	}
	return true
}
