package kubectlmuster

import (
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/pkg/gang"
)

// Gang is one gang as `kubectl muster gangs -o json` prints it. Its fields
// are documented in docs/explain.md; they are only ever added to.
type Gang struct {
	// Kind is Job, StatefulSet, PodGroup (scheduler-plugins) or
	// PodGroup.scheduling.k8s.io (Kubernetes' own).
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Members counts live pods (not finished, not being deleted); Gated
	// those of them held by scheduling gates; Bound those on a node.
	Members int `json:"members"`
	Gated   int `json:"gated"`
	Bound   int `json:"bound"`
	// Quorum is how many members must run together (0 when unknown).
	Quorum int `json:"quorum"`
	// Phase is the gang's gang.Phase: the names docs/architecture.md's
	// lifecycle shows.
	Phase gang.Phase `json:"phase"`
	// Since is when the gang entered its phase, as far as the cluster
	// shows it.
	Since *metav1.Time `json:"since,omitempty"`
	// GPUs sums the members' GPU requests.
	GPUs     int64 `json:"gpus"`
	Priority int32 `json:"priority"`
	// Domain is the tightest topology domain holding every bound (or
	// nominated) member, "<level> <name>", empty when none.
	Domain string   `json:"domain,omitempty"`
	Nodes  []string `json:"nodes,omitempty"`
	// Reason is muster's latest word on the gang (a gang.Outcome such as
	// GangUnschedulable) and Message what it said.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Kueue is what Kueue says of a suspended Job it queues.
	Kueue *Kueue `json:"kueue,omitempty"`
}

// Ref is the gang's kind/name as explain accepts it.
func (g Gang) Ref() string { return kindArg(gang.Kind(g.Kind)) + "/" + g.Name }

// gangState is one gang with what was read about it.
type gangState struct {
	key      gang.Key
	pods     []*corev1.Pod // live members, by name
	finished int
	job      *batchv1.Job
	set      *appsv1.StatefulSet
	group    *v1alpha1.PodGroup
	workload *schedulingv1beta1.PodGroup
	events   []*eventsv1.Event // muster's, about the gang's owner
}

// lastFailedPlan is the scheduler's record on the gang's object; nil when
// there is none or it cannot be read (it is informative only).
func (st *gangState) lastFailedPlan() *gang.FailedPlan {
	var annotations map[string]string
	switch {
	case st.job != nil:
		annotations = st.job.Annotations
	case st.set != nil:
		annotations = st.set.Annotations
	case st.group != nil:
		annotations = st.group.Annotations
	case st.workload != nil:
		annotations = st.workload.Annotations
	}
	value, ok := annotations[gang.FailedPlanAnnotation]
	if !ok {
		return nil
	}
	f, err := gang.DecodeFailedPlan(value)
	if err != nil {
		return nil
	}
	return f
}

// index holds a snapshot's objects by key for the gang lookups.
type index struct {
	snap      *Snapshot
	opts      Options
	jobs      map[string]*batchv1.Job
	sets      map[string]*appsv1.StatefulSet
	groups    map[string]*v1alpha1.PodGroup
	workloads map[string]*schedulingv1beta1.PodGroup
	events    map[gang.Key][]*eventsv1.Event
	nodes     map[string]*corev1.Node
}

func nsName(ns, name string) string { return ns + "/" + name }

func newIndex(snap *Snapshot, opts Options) *index {
	ix := &index{snap: snap, opts: opts,
		jobs: map[string]*batchv1.Job{}, sets: map[string]*appsv1.StatefulSet{},
		groups: map[string]*v1alpha1.PodGroup{}, workloads: map[string]*schedulingv1beta1.PodGroup{},
		events: map[gang.Key][]*eventsv1.Event{}, nodes: make(map[string]*corev1.Node, len(snap.Nodes)),
	}
	for i := range snap.Jobs {
		ix.jobs[nsName(snap.Jobs[i].Namespace, snap.Jobs[i].Name)] = &snap.Jobs[i]
	}
	for i := range snap.StatefulSets {
		ix.sets[nsName(snap.StatefulSets[i].Namespace, snap.StatefulSets[i].Name)] = &snap.StatefulSets[i]
	}
	for i := range snap.PodGroups {
		ix.groups[nsName(snap.PodGroups[i].Namespace, snap.PodGroups[i].Name)] = &snap.PodGroups[i]
	}
	for i := range snap.WorkloadGroups {
		ix.workloads[nsName(snap.WorkloadGroups[i].Namespace, snap.WorkloadGroups[i].Name)] = &snap.WorkloadGroups[i]
	}
	for i := range snap.Nodes {
		ix.nodes[snap.Nodes[i].Name] = &snap.Nodes[i]
	}
	for i := range snap.Events {
		e := &snap.Events[i]
		if !strings.HasPrefix(e.Reason, "Gang") && !gang.IsProvisioningReason(e.Reason) {
			continue
		}
		if key, ok := eventKey(e); ok {
			ix.events[key] = append(ix.events[key], e)
		}
	}
	return ix
}

// eventKey is the gang an Event of muster's is about: the object it
// regards is the gang's owner.
func eventKey(e *eventsv1.Event) (gang.Key, bool) {
	r := e.Regarding
	key := gang.Key{Namespace: r.Namespace, Name: r.Name}
	switch {
	case r.Kind == "Job":
		key.Kind = gang.KindJob
	case r.Kind == "StatefulSet":
		key.Kind = gang.KindStatefulSet
	case r.Kind == "PodGroup" && strings.HasPrefix(r.APIVersion, v1alpha1.GroupName+"/"):
		key.Kind = gang.KindPodGroup
	case r.Kind == "PodGroup" && strings.HasPrefix(r.APIVersion, schedulingv1beta1.GroupName+"/"):
		key.Kind = gang.KindWorkloadPodGroup
	default:
		return key, false
	}
	return key, true
}

// keyOf is the gang of a muster pod, as muster resolves it (gang.Resolve):
// a Kubernetes PodGroup with the basic policy is no gang, its pods stay
// their Job's or StatefulSet's.
func (ix *index) keyOf(pod *corev1.Pod) (gang.Key, bool) {
	r, ok, _ := gang.Resolver{Owners: ix, Levels: ix.opts.Levels}.Resolve(pod)
	return r.OwnerKey, ok
}

// Job, StatefulSet, PodGroup and WorkloadPodGroup read gangs' owners from
// the snapshot, for gang.OwnerOf.

func (ix *index) Job(namespace, name string) (*batchv1.Job, error) {
	return inSnapshot(ix.jobs, batchv1.Resource("jobs"), namespace, name)
}

func (ix *index) StatefulSet(namespace, name string) (*appsv1.StatefulSet, error) {
	return inSnapshot(ix.sets, appsv1.Resource("statefulsets"), namespace, name)
}

func (ix *index) PodGroup(namespace, name string) (*v1alpha1.PodGroup, error) {
	return inSnapshot(ix.groups, v1alpha1.SchemeGroupVersion.WithResource("podgroups").GroupResource(), namespace, name)
}

func (ix *index) WorkloadPodGroup(namespace, name string) (*schedulingv1beta1.PodGroup, error) {
	return inSnapshot(ix.workloads, schedulingv1beta1.Resource("podgroups"), namespace, name)
}

// inSnapshot is the object of namespace/name in objects, or NotFound.
func inSnapshot[T any](objects map[string]*T, resource schema.GroupResource, namespace, name string) (*T, error) {
	if o := objects[nsName(namespace, name)]; o != nil {
		return o, nil
	}
	return nil, apierrors.NewNotFound(resource, name)
}

// isMuster reports whether the pod is scheduled by muster.
func (ix *index) isMuster(pod *corev1.Pod) bool {
	return pod.Spec.SchedulerName == ix.opts.SchedulerName
}

// live reports whether a pod counts as a member: not finished, not going.
func live(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// gangStates groups the scope's muster pods into gangs, adding muster's
// Jobs and StatefulSets that have no pods (suspended, not created yet).
func (ix *index) gangStates(scope Scope) []*gangState {
	byKey := map[gang.Key]*gangState{}
	get := func(key gang.Key) *gangState {
		st := byKey[key]
		if st == nil {
			st = &gangState{key: key}
			byKey[key] = st
		}
		return st
	}
	inScope := func(ns string) bool { return scope.AllNamespaces || ns == scope.Namespace }
	// Controllers whose pods are another gang's members (a Job's pods in a
	// PodGroup) are no gang of their own.
	elsewhere := map[gang.Key]bool{}
	for i := range ix.snap.Pods {
		pod := &ix.snap.Pods[i]
		if !ix.isMuster(pod) || !inScope(pod.Namespace) {
			continue
		}
		key, ok := ix.keyOf(pod)
		if !ok {
			continue
		}
		if owner, ok := gang.ControllerKey(pod); ok && owner != key {
			elsewhere[owner] = true
		}
		st := get(key)
		if live(pod) {
			st.pods = append(st.pods, pod)
		} else if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			st.finished++
		}
	}
	ownGang := func(key gang.Key, tmpl *corev1.PodTemplateSpec) bool {
		g := tmpl.Spec.SchedulingGroup
		inGroup := g != nil && g.PodGroupName != nil && *g.PodGroupName != ""
		return tmpl.Spec.SchedulerName == ix.opts.SchedulerName && inScope(key.Namespace) && !elsewhere[key] && !inGroup &&
			tmpl.Labels[v1alpha1.PodGroupLabel] == ""
	}
	for _, job := range ix.jobs {
		if key := (gang.Key{Kind: gang.KindJob, Namespace: job.Namespace, Name: job.Name}); ownGang(key, &job.Spec.Template) {
			get(key)
		}
	}
	for _, set := range ix.sets {
		if key := (gang.Key{Kind: gang.KindStatefulSet, Namespace: set.Namespace, Name: set.Name}); ownGang(key, &set.Spec.Template) {
			get(key)
		}
	}
	out := make([]*gangState, 0, len(byKey))
	for _, st := range byKey {
		ix.fill(st)
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].key, out[j].key
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Name < b.Name
	})
	return out
}

// fill attaches the gang's owner and Events and orders its pods.
func (ix *index) fill(st *gangState) {
	k := nsName(st.key.Namespace, st.key.Name)
	switch st.key.Kind {
	case gang.KindJob:
		st.job = ix.jobs[k]
	case gang.KindStatefulSet:
		st.set = ix.sets[k]
	case gang.KindPodGroup:
		st.group = ix.groups[k]
	case gang.KindWorkloadPodGroup:
		st.workload = ix.workloads[k]
	}
	st.events = ix.events[st.key]
	sort.Slice(st.pods, func(i, j int) bool { return st.pods[i].Name < st.pods[j].Name })
}

// ask is what the gang's owner asks, read as muster reads it
// (gang.AskOf), or why muster cannot: the owner is missing or invalid
// (with an empty Ask), or its pods can never be one gang (Ask.NoGang).
func (ix *index) ask(st *gangState) (gang.Ask, string) {
	pod := &corev1.Pod{}
	if len(st.pods) > 0 {
		pod = st.pods[0]
	}
	owner, err := gang.OwnerOf(st.key, ix)
	if err != nil {
		return gang.Ask{}, err.Error()
	}
	if len(st.pods) == 0 {
		// A workload with no pods yet: its template's annotations.
		switch o := owner.(type) {
		case *batchv1.Job:
			pod = &corev1.Pod{ObjectMeta: o.Spec.Template.ObjectMeta}
		case *appsv1.StatefulSet:
			pod = &corev1.Pod{ObjectMeta: o.Spec.Template.ObjectMeta}
		}
	}
	ask, err := gang.AskOf(owner, pod, ix.opts.Levels, 0)
	if err != nil {
		return gang.Ask{}, err.Error()
	}
	return ask, ask.NoGang
}

// signal is one thing the cluster says about a gang, with when.
type signal struct {
	at      time.Time
	since   time.Time
	phase   gang.Phase
	reason  string
	message string
}

// eventTime is when the Event (or its series) was last seen.
func eventTime(e *eventsv1.Event) time.Time {
	t := e.EventTime.Time
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if e.DeprecatedLastTimestamp.After(t) {
		t = e.DeprecatedLastTimestamp.Time
	}
	if t.IsZero() {
		t = e.CreationTimestamp.Time
	}
	return t
}

// phaseOfMessage reads a pod's PodScheduled=False message, which muster's
// PreFilter writes (pkg/plugins/mustergang); anything it does not recognise
// is a plan that was not found.
func phaseOfMessage(msg string) (gang.Phase, string) {
	switch {
	case strings.Contains(msg, "backs off until"):
		return gang.PhaseBackingOff, string(gang.OutcomeRejected)
	case strings.Contains(msg, "preempted pods"):
		return gang.PhasePreempting, string(gang.OutcomePreempting)
	case strings.Contains(msg, "other members; this pod waits"), strings.Contains(msg, "members reserved"),
		strings.Contains(msg, "is being planned again"):
		return gang.PhasePlanned, string(gang.OutcomePlanned)
	case strings.Contains(msg, "held by scheduling gates"), strings.Contains(msg, "waiting for the rest to be created"):
		return gang.PhaseWaitingForMembers, string(gang.OutcomeWaitingForMembers)
	}
	return gang.PhaseUnschedulable, string(gang.OutcomeUnschedulable)
}

// latestSignal is the newest of muster's Events about the gang and its
// pending members' PodScheduled=False conditions.
func latestSignal(st *gangState) *signal {
	var best *signal
	consider := func(s signal) {
		if best == nil || s.at.After(best.at) {
			best = &s
		}
	}
	for _, e := range st.events {
		if gang.IsProvisioningReason(e.Reason) {
			continue // the autoscaler's answer, not the gang's phase
		}
		// A series keeps its first note; its first time is when the phase began.
		consider(signal{at: eventTime(e), since: firstTime(e), phase: gang.Outcome(e.Reason).Phase(e.Note), reason: e.Reason, message: e.Note})
	}
	for _, pod := range st.pods {
		if pod.Spec.NodeName != "" {
			continue
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
				phase, reason := phaseOfMessage(c.Message)
				consider(signal{at: c.LastTransitionTime.Time, since: c.LastTransitionTime.Time, phase: phase, reason: reason, message: c.Message})
			}
		}
	}
	return best
}

func firstTime(e *eventsv1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	if !e.DeprecatedFirstTimestamp.IsZero() {
		return e.DeprecatedFirstTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// summarize turns a gang's state into what the commands print.
func (ix *index) summarize(st *gangState) Gang {
	g, earliest := ix.countMembers(st)
	ask, invalid := ix.ask(st)
	quorum := ask.Quorum
	g.Quorum = quorum
	setPhase := func(p gang.Phase, since time.Time, reason, msg string) {
		g.Phase, g.Reason, g.Message = p, reason, msg
		if !since.IsZero() {
			g.Since = &metav1.Time{Time: since}
		}
	}
	sig := latestSignal(st)
	switch {
	case st.job != nil && jobFinished(st.job) != nil:
		c := jobFinished(st.job)
		setPhase(gang.PhaseFinished, c.LastTransitionTime.Time, string(c.Type), c.Message)
	case st.job != nil && st.job.Spec.Suspend != nil && *st.job.Spec.Suspend:
		since := st.job.CreationTimestamp.Time
		for _, c := range st.job.Status.Conditions {
			if c.Type == batchv1.JobSuspended && c.Status == corev1.ConditionTrue {
				since = c.LastTransitionTime.Time
			}
		}
		g.Kueue = ix.kueueOf(st.job)
		setPhase(gang.PhaseSuspended, since, "", ix.suspendedMessage(st.job, g.Kueue))
	case quorum == 0 && invalid != "":
		setPhase(gang.PhaseInvalid, earliest, string(gang.OutcomeInvalid), invalid)
	case g.Bound >= quorum && g.Bound > 0:
		since := boundSince(st.pods)
		setPhase(gang.PhaseBound, since, string(gang.OutcomeScheduled), fmt.Sprintf("%d of %d members bound on %d nodes%s", g.Bound, g.Members, len(g.Nodes), inDomain(g.Domain)))
	case g.Members < quorum:
		since := earliest
		if sig != nil && sig.phase == gang.PhaseWaitingForMembers {
			since = sig.since
		}
		setPhase(gang.PhaseWaitingForMembers, since, string(gang.OutcomeWaitingForMembers),
			fmt.Sprintf("%d of %d members exist; waiting for the rest to be created", g.Members, quorum))
	case g.Members-g.Gated < quorum:
		setPhase(gang.PhaseWaitingForMembers, earliest, string(gang.OutcomeWaitingForMembers),
			fmt.Sprintf("%d of %d members exist but %d are held by scheduling gates", g.Members, quorum, g.Gated))
	case sig != nil:
		if sig.phase == gang.PhasePermitted && g.Bound == 0 && len(g.Nodes) == 0 {
			// Released members not bound and not nominated: the gang
			// was bound once and lost members since.
			sig.phase = gang.PhasePending
		}
		setPhase(sig.phase, sig.since, sig.reason, sig.message)
	case len(g.Nodes) > 0:
		setPhase(gang.PhasePlanned, earliest, string(gang.OutcomePlanned), fmt.Sprintf("%d members nominated or bound", len(g.Nodes)))
	default:
		setPhase(gang.PhasePending, earliest, "", "muster has not reported on this gang yet")
	}
	if invalid != "" && g.Phase != gang.PhaseInvalid && g.Message == "" {
		g.Message = invalid
	}
	return g
}

// countMembers is the gang with its members counted (gated, bound, GPUs,
// priority, nodes and domain), and when its first member was created.
func (ix *index) countMembers(st *gangState) (Gang, time.Time) {
	g := Gang{Kind: string(st.key.Kind), Namespace: st.key.Namespace, Name: st.key.Name, Members: len(st.pods)}
	var nodes []string
	var earliest time.Time
	for _, pod := range st.pods {
		if len(pod.Spec.SchedulingGates) > 0 {
			g.Gated++
		}
		node := pod.Spec.NodeName
		if node != "" {
			g.Bound++
		} else {
			node = pod.Status.NominatedNodeName
		}
		if node != "" {
			nodes = append(nodes, node)
		}
		g.GPUs += ix.requestOf(pod).Scalars[ix.opts.GPU]
		if pod.Spec.Priority != nil && *pod.Spec.Priority > g.Priority {
			g.Priority = *pod.Spec.Priority
		}
		if earliest.IsZero() || pod.CreationTimestamp.Time.Before(earliest) {
			earliest = pod.CreationTimestamp.Time
		}
	}
	if st.workload != nil && st.workload.Spec.Priority != nil {
		g.Priority = *st.workload.Spec.Priority
	}
	g.Nodes = uniqueSorted(nodes)
	g.Domain = ix.domainOf(g.Nodes)
	return g, earliest
}

func jobFinished(job *batchv1.Job) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

// boundSince is when the last member was bound (PodScheduled=True).
func boundSince(pods []*corev1.Pod) time.Time {
	var t time.Time
	for _, pod := range pods {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(t) {
				t = c.LastTransitionTime.Time
			}
		}
	}
	return t
}

func inDomain(domain string) string {
	if domain == "" {
		return ""
	}
	return " in " + domain
}

func uniqueSorted(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	sort.Strings(in)
	out := in[:1]
	for _, s := range in[1:] {
		if s != out[len(out)-1] {
			out = append(out, s)
		}
	}
	return out
}

// domainOf is the tightest level above the node whose one domain holds
// every node ("rack r1"), or the node itself when there is one node.
func (ix *index) domainOf(nodes []string) string {
	if len(nodes) == 0 {
		return ""
	}
	if len(nodes) == 1 {
		return "node " + nodes[0]
	}
	for _, level := range ix.opts.Levels {
		if level.Label == "" || level.Label == corev1.LabelHostname {
			continue
		}
		value, same := "", true
		for _, name := range nodes {
			n := ix.nodes[name]
			if n == nil {
				same = false
				break
			}
			v := n.Labels[level.Label]
			if v == "" || (value != "" && v != value) {
				same = false
				break
			}
			value = v
		}
		if same {
			return level.Name + " " + value
		}
	}
	return fmt.Sprintf("%d nodes, no shared domain", len(nodes))
}

// requestOf is what a pod requests, as the scheduler counts it on a node.
func (ix *index) requestOf(pod *corev1.Pod) gang.Resources {
	return resourcesOf(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true}), 1)
}

// resourcesOf converts a resource list into the planner's vector; pods is
// the pod count it stands for.
func resourcesOf(list corev1.ResourceList, pods int64) gang.Resources {
	r := gang.Resources{Pods: pods}
	for name, q := range list {
		switch name {
		case corev1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case corev1.ResourceMemory:
			r.Memory = q.Value()
		case corev1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		case corev1.ResourcePods:
			r.Pods = q.Value()
		default:
			if r.Scalars == nil {
				r.Scalars = map[corev1.ResourceName]int64{}
			}
			r.Scalars[name] = q.Value()
		}
	}
	return r
}

// Gangs lists the gangs muster knows of in scope.
func Gangs(snap *Snapshot, scope Scope, opts Options) []Gang {
	ix := newIndex(snap, opts)
	states := ix.gangStates(scope)
	out := make([]Gang, 0, len(states))
	for _, st := range states {
		out = append(out, ix.summarize(st))
	}
	return out
}
