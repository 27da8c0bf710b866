package kubectlmuster

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/gang"
)

// Explanation is `kubectl muster explain -o json`. Its fields are
// documented in docs/explain.md; they are only ever added to.
type Explanation struct {
	Gang        Gang        `json:"gang"`
	Constraints Constraints `json:"constraints"`
	// Findings say what keeps the gang from running and what would make
	// it fit, most direct first.
	Findings []Finding `json:"findings"`
	// Nodes counts every node once, by the first reason it cannot take
	// one of the gang's pending members (reason HasRoom: it can).
	Nodes []NodeCount `json:"nodes,omitempty"`
	// LastFailedPlan is the scheduler's own count of the nodes at the
	// gang's last failed plan (annotation muster.dev/last-failed-plan on
	// the gang's object); omitted once the gang is bound or finished.
	LastFailedPlan *gang.FailedPlan `json:"lastFailedPlan,omitempty"`
	// Members are the gang's live pods.
	Members []MemberState `json:"members"`
	// Events are muster's Events about the gang, newest first (at most 5).
	Events []EventNote `json:"events,omitempty"`
}

// Constraints are what the gang asks of its placement.
type Constraints struct {
	TopologyRequired  string `json:"topologyRequired,omitempty"`
	TopologyPreferred string `json:"topologyPreferred,omitempty"`
	Preemptible       string `json:"preemptible"`
	PreemptionPolicy  string `json:"preemptionPolicy,omitempty"`
}

// Finding is one thing that explains the gang's state.
type Finding struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Finding reasons.
const (
	FindingBound            = "Bound"
	FindingFinished         = "Finished"
	FindingSuspended        = "Suspended"
	FindingWaitingMembers   = "WaitingForMembers"
	FindingGated            = "Gated"
	FindingPVC              = "WaitingForPVC"
	FindingInvalid          = "Invalid"
	FindingFitsNow          = "FitsNow"
	FindingCapacity         = "NeedsCapacity"
	FindingPreemptBlocked   = "PreemptionNotAllowed"
	FindingPreemptPossible  = "PreemptionPossible"
	FindingPlanner          = "Planner"
	FindingSchedulerMessage = "SchedulerMessage"
)

// NodeCount is how many nodes share a reason.
type NodeCount struct {
	Reason   string   `json:"reason"`
	Message  string   `json:"message"`
	Nodes    int      `json:"nodes"`
	Examples []string `json:"examples,omitempty"`
}

// Node reasons, in the order a node is checked: the scheduler's words
// (gang.TallyNodes).
const (
	NodeCordoned          = gang.NodeCordoned
	NodeReclaiming        = gang.NodeReclaiming
	NodePolicy            = gang.NodePolicy
	NodeConstraints       = gang.NodeUnmatched
	NodeNoDomain          = gang.NodeNoDomain
	NodeInsufficientGPUs  = gang.NodeInsufficientGPUs
	NodeInsufficientOther = gang.NodeInsufficientOther
	NodeOutsideDomain     = gang.NodeOutsideDomain
	NodeHasRoom           = gang.NodeHasRoom
)

// MemberState is one live member.
type MemberState struct {
	Name      string   `json:"name"`
	Node      string   `json:"node,omitempty"`
	Nominated string   `json:"nominated,omitempty"`
	Domain    string   `json:"domain,omitempty"`
	GPUs      int64    `json:"gpus"`
	Gates     []string `json:"gates,omitempty"`
	Message   string   `json:"message,omitempty"`
}

// EventNote is one of muster's Events.
type EventNote struct {
	Reason  string       `json:"reason"`
	Message string       `json:"message"`
	Count   int32        `json:"count"`
	Last    *metav1.Time `json:"last,omitempty"`
}

// ErrNotFound marks an explain argument that names nothing.
var ErrNotFound = errors.New("not found")

// kinds maps what users write to gang kinds ("pod" resolves the pod's gang).
var kinds = map[string]gang.Kind{
	"job": gang.KindJob, "jobs": gang.KindJob, "job.batch": gang.KindJob,
	"statefulset": gang.KindStatefulSet, "statefulsets": gang.KindStatefulSet, "sts": gang.KindStatefulSet,
	"statefulset.apps": gang.KindStatefulSet,
	"podgroup":         gang.KindPodGroup, "podgroups": gang.KindPodGroup, "pg": gang.KindPodGroup,
	"podgroup.scheduling.x-k8s.io": gang.KindPodGroup,
	"podgroup.scheduling.k8s.io":   gang.KindWorkloadPodGroup, "workloadpodgroup": gang.KindWorkloadPodGroup,
	"pod": gang.KindPod, "pods": gang.KindPod, "po": gang.KindPod,
}

// KindNames are the kinds explain accepts, as documented.
var KindNames = []string{"job", "statefulset (sts)", "podgroup (scheduler-plugins, podgroup.scheduling.x-k8s.io)",
	"podgroup.scheduling.k8s.io (workloadpodgroup)", "pod (its gang)"}

// kindArg is how explain names a kind.
func kindArg(k gang.Kind) string {
	switch k {
	case gang.KindJob:
		return "job"
	case gang.KindStatefulSet:
		return "statefulset"
	case gang.KindPodGroup:
		return "podgroup"
	case gang.KindWorkloadPodGroup:
		return "podgroup.scheduling.k8s.io"
	}
	return "pod"
}

// ParseRef reads "<kind>/<name>".
func ParseRef(arg string) (gang.Kind, string, error) {
	kind, name, ok := strings.Cut(arg, "/")
	if !ok || name == "" || kind == "" {
		return "", "", fmt.Errorf("want <kind>/<name>, e.g. job/mnist; got %q", arg)
	}
	k, ok := kinds[strings.ToLower(kind)]
	if !ok {
		known := make([]string, 0, len(kinds))
		for name := range kinds {
			known = append(known, name)
		}
		sort.Strings(known)
		return "", "", fmt.Errorf("unknown kind %q%s (known: %s)", kind, didYouMean(strings.ToLower(kind), known), strings.Join(KindNames, ", "))
	}
	return k, name, nil
}

// Explain explains the gang kind/name of namespace ns.
func Explain(snap *Snapshot, ns string, kind gang.Kind, name string, opts Options) (*Explanation, error) {
	ix := newIndex(snap, opts)
	scope := Scope{Namespace: ns}
	key := gang.Key{Kind: kind, Namespace: ns, Name: name}
	if kind == gang.KindPod {
		var err error
		if key, err = ix.gangOfPod(ns, name); err != nil {
			return nil, err
		}
	}
	var st *gangState
	states := ix.gangStates(scope)
	for _, s := range states {
		if s.key == key {
			st = s
		}
	}
	if st == nil {
		var err error
		if st, err = ix.ownerWithoutPods(key, states); err != nil {
			return nil, err
		}
	}
	return ix.explain(st), nil
}

// gangOfPod resolves a pod argument to its gang.
func (ix *index) gangOfPod(ns, name string) (gang.Key, error) {
	var names []string
	for i := range ix.snap.Pods {
		pod := &ix.snap.Pods[i]
		if pod.Namespace != ns {
			continue
		}
		if pod.Name != name {
			names = append(names, pod.Name)
			continue
		}
		if !ix.isMuster(pod) {
			return gang.Key{}, fmt.Errorf("pod %s/%s is not scheduled by muster (schedulerName %q)", ns, name, pod.Spec.SchedulerName)
		}
		key, ok := ix.keyOf(pod)
		if !ok {
			return gang.Key{}, fmt.Errorf("pod %s/%s belongs to no gang: muster schedules it alone", ns, name)
		}
		return key, nil
	}
	return gang.Key{}, fmt.Errorf("%w: pod %q in namespace %q%s", ErrNotFound, name, ns, didYouMean(name, names))
}

// ownerWithoutPods explains a gang none of whose pods is muster's in
// scope: a PodGroup waiting for all its members, or a name that is wrong.
func (ix *index) ownerWithoutPods(key gang.Key, states []*gangState) (*gangState, error) {
	k := nsName(key.Namespace, key.Name)
	st := &gangState{key: key}
	switch key.Kind {
	case gang.KindJob:
		if job := ix.jobs[k]; job != nil {
			return nil, fmt.Errorf("job %s is not scheduled by muster (its pods' schedulerName is %q)", k, job.Spec.Template.Spec.SchedulerName)
		}
	case gang.KindStatefulSet:
		if set := ix.sets[k]; set != nil {
			return nil, fmt.Errorf("statefulset %s is not scheduled by muster (its pods' schedulerName is %q)", k, set.Spec.Template.Spec.SchedulerName)
		}
	case gang.KindPodGroup:
		if ix.groups[k] != nil {
			ix.fill(st)
			return st, nil
		}
	case gang.KindWorkloadPodGroup:
		if ix.workloads[k] != nil {
			ix.fill(st)
			return st, nil
		}
	}
	var names []string
	for _, s := range states {
		names = append(names, kindArg(s.key.Kind)+"/"+s.key.Name)
	}
	for _, g := range ix.snap.PodGroups {
		if g.Namespace == key.Namespace {
			names = append(names, "podgroup/"+g.Name)
		}
	}
	return nil, fmt.Errorf("%w: %s %q in namespace %q%s", ErrNotFound, kindArg(key.Kind), key.Name, key.Namespace,
		didYouMean(kindArg(key.Kind)+"/"+key.Name, names))
}

// explain builds the explanation of one gang.
func (ix *index) explain(st *gangState) *Explanation {
	g := ix.summarize(st)
	ex := &Explanation{Gang: g, Findings: []Finding{}, Members: []MemberState{}}
	rep := ix.representative(st)
	c, cErr := gang.ConstraintsFromPod(rep, ix.opts.Levels)
	if cErr == nil {
		ask, _ := ix.ask(st)
		c.Required = gang.NarrowerLevel(ix.opts.Levels, c.Required, ask.Required)
	}
	ex.Constraints = Constraints{TopologyRequired: c.Required, TopologyPreferred: c.Preferred, Preemptible: string(c.Policy)}
	if p := rep.Spec.PreemptionPolicy; p != nil {
		ex.Constraints.PreemptionPolicy = string(*p)
	}
	for _, pod := range st.pods {
		m := MemberState{Name: pod.Name, Node: pod.Spec.NodeName, Nominated: pod.Status.NominatedNodeName,
			GPUs: ix.requestOf(pod).Scalars[ix.opts.GPU]}
		for _, gate := range pod.Spec.SchedulingGates {
			m.Gates = append(m.Gates, gate.Name)
		}
		if m.Node != "" {
			m.Domain = ix.nodeDomains(m.Node)
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
				m.Message = cond.Message
			}
		}
		ex.Members = append(ex.Members, m)
	}
	ex.Events = eventNotes(st.events)
	ex.LastFailedPlan = st.lastFailedPlan()
	add := func(reason, format string, args ...any) {
		ex.Findings = append(ex.Findings, Finding{Reason: reason, Message: fmt.Sprintf(format, args...)})
	}

	switch g.Phase {
	case gang.PhaseFinished:
		add(FindingFinished, "the Job finished (%s)", g.Reason)
		ex.LastFailedPlan = nil
		return ex
	case gang.PhaseBound:
		add(FindingBound, "bound: %d members on %d nodes%s", g.Bound, len(g.Nodes), inDomain(g.Domain))
		ex.LastFailedPlan = nil
		return ex
	case gang.PhaseSuspended:
		add(FindingSuspended, "%s", g.Message)
	case gang.PhaseInvalid:
		add(FindingInvalid, "%s", g.Message)
	}
	if cErr != nil {
		add(FindingInvalid, "%v", cErr)
	}
	ix.memberFindings(st, &g, add)
	if g.Message != "" && g.Reason != "" && g.Phase != gang.PhaseSuspended && g.Phase != gang.PhaseWaitingForMembers && g.Phase != gang.PhaseInvalid {
		add(FindingSchedulerMessage, "muster (%s): %s", g.Reason, g.Message)
	}
	if cErr != nil || g.Quorum == 0 {
		return ex
	}
	ix.fitFindings(st, &g, c, ex, add)
	return ex
}

// representative is the member whose annotations stand for the gang's (all
// members must agree): its first pod, else its owner's pod template.
func (ix *index) representative(st *gangState) *corev1.Pod {
	if len(st.pods) > 0 {
		return st.pods[0]
	}
	if t := ix.template(st); t != nil {
		return t
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: st.key.Namespace}}
}

// template is a pod made from the owner's template (Job, StatefulSet), nil
// for PodGroups.
func (ix *index) template(st *gangState) *corev1.Pod {
	var spec *corev1.PodTemplateSpec
	switch {
	case st.job != nil:
		spec = &st.job.Spec.Template
	case st.set != nil:
		spec = &st.set.Spec.Template
	default:
		return nil
	}
	pod := &corev1.Pod{ObjectMeta: *spec.ObjectMeta.DeepCopy(), Spec: *spec.Spec.DeepCopy()}
	pod.Namespace = st.key.Namespace
	return pod
}

// memberFindings explains members that are missing, gated or wait for a
// volume.
func (ix *index) memberFindings(st *gangState, g *Gang, add func(string, string, ...any)) {
	if g.Quorum > 0 && g.Members < g.Quorum && g.Phase != gang.PhaseSuspended {
		gated := ""
		if g.Gated > 0 {
			gated = fmt.Sprintf("; %d gated", g.Gated)
		}
		add(FindingWaitingMembers, "waiting for %d more member%s (%d of %d exist%s)",
			g.Quorum-g.Members, plural(g.Quorum-g.Members), g.Members, g.Quorum, gated)
	} else if short := g.Quorum - (g.Members - g.Gated); g.Quorum > 0 && short > 0 && g.Phase != gang.PhaseSuspended {
		add(FindingWaitingMembers, "waiting for %d more schedulable member%s (%d of %d exist; %d gated)",
			short, plural(short), g.Members, g.Quorum, g.Gated)
	}
	if g.Gated > 0 {
		gates := map[string]bool{}
		var names []string
		for _, pod := range st.pods {
			if len(pod.Spec.SchedulingGates) == 0 {
				continue
			}
			names = append(names, pod.Name)
			for _, gate := range pod.Spec.SchedulingGates {
				gates[gate.Name] = true
			}
		}
		schedulable := g.Members - g.Gated
		if schedulable < g.Quorum {
			add(FindingGated, "%d of %d members are held by scheduling gates (%s on %s): muster places the gang once at least %d can be scheduled",
				g.Gated, g.Members, strings.Join(slices.Sorted(maps.Keys(gates)), ", "), strings.Join(names, ", "), g.Quorum)
		} else {
			add(FindingGated, "%d members are held by scheduling gates (%s); the other %d make the quorum", g.Gated, strings.Join(names, ", "), schedulable)
		}
	}
	if !ix.snap.PVCsRead {
		return
	}
	pvcs := map[string]*corev1.PersistentVolumeClaim{}
	for i := range ix.snap.PVCs {
		p := &ix.snap.PVCs[i]
		pvcs[nsName(p.Namespace, p.Name)] = p
	}
	for _, pod := range st.pods {
		if pod.Spec.NodeName != "" {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			claim := v.PersistentVolumeClaim.ClaimName
			p := pvcs[nsName(pod.Namespace, claim)]
			switch {
			case p == nil:
				add(FindingPVC, "member %s waits for PVC %s: it does not exist", pod.Name, claim)
			case p.DeletionTimestamp != nil:
				add(FindingPVC, "member %s waits for PVC %s: it is being deleted", pod.Name, claim)
			case p.Status.Phase != corev1.ClaimBound:
				add(FindingPVC, "member %s waits for PVC %s: it is %s, not Bound (a WaitForFirstConsumer class binds it when the pod is placed)",
					pod.Name, claim, orDefault(string(p.Status.Phase), "Pending"))
			}
		}
	}
}

// fitFindings plans the gang with muster's planner on the live state and
// says what would make it fit: capacity, topology, policy, preemption.
func (ix *index) fitFindings(st *gangState, g *Gang, c gang.Constraints, ex *Explanation, add func(string, string, ...any)) {
	states := ix.nodeStates()
	req, toCome := ix.request(st, g, c)
	if len(req.Members) == 0 {
		return
	}
	views := ix.views(states)
	plan, err := gang.Compute(req, views)
	closest := ix.closest(req, states)
	ex.Nodes = ix.nodeCounts(req, states, closest)
	if err == nil {
		switch {
		case g.Phase == gang.PhaseSuspended:
			add(FindingFitsNow, "once resumed, muster's planner would place the gang on the live state now (%s %s, %d nodes)", plan.Level, plan.Domain, plan.Nodes)
		case toCome > 0:
			add(FindingFitsNow, "once its %d missing or gated members can be scheduled, muster's planner would place the gang on the live state now (%s %s, %d nodes)",
				toCome, plan.Level, plan.Domain, plan.Nodes)
		default:
			add(FindingFitsNow, "muster's planner places the %d pending members on the live state now (%s %s, %d nodes): muster plans it at its next attempt unless the scheduler's filters refuse (see the members' messages)",
				len(plan.Slots), plan.Level, plan.Domain, plan.Nodes)
		}
		return
	}
	var unplaceable *gang.Unplaceable
	if errors.As(err, &unplaceable) {
		add(FindingPlanner, "%s", unplaceable.Message)
	} else {
		add(FindingInvalid, "%v", err)
		return
	}
	if msg := ix.capacityMessage(req, states, closest); msg != "" {
		add(FindingCapacity, "%s", msg)
	}
	ix.preemptionFindings(st, g, req, states, add)
}

// request is the planner's request for the gang's pending members (filled
// up to the quorum with pods of the owner's template when members are yet
// to be created), around its bound members.
func (ix *index) request(st *gangState, g *Gang, c gang.Constraints) (req gang.Request, toCome int) {
	req = gang.Request{Gang: st.key.String(), GPU: ix.opts.GPU, Levels: ix.opts.Levels,
		Required: c.Required, Preferred: c.Preferred, Policy: c.Policy}
	var pending []*corev1.Pod
	for _, pod := range st.pods {
		switch {
		case pod.Spec.NodeName != "":
			req.BoundNodes = append(req.BoundNodes, pod.Spec.NodeName)
		case len(pod.Spec.SchedulingGates) == 0:
			pending = append(pending, pod)
		}
	}
	needed := g.Quorum - len(req.BoundNodes)
	if needed <= 0 {
		return req, 0
	}
	// Members not created yet (or gated) are planned as copies of the
	// template, or of a member.
	model := ix.template(st)
	if model == nil && len(st.pods) > 0 {
		model = st.pods[0]
	}
	for i := 0; len(pending) < needed && model != nil; i++ {
		p := model.DeepCopy()
		p.Name = fmt.Sprintf("(member %d to come)", len(pending)+1)
		p.UID = types.UID(fmt.Sprintf("to-come-%d", i))
		p.Spec.SchedulingGates = nil
		pending = append(pending, p)
		toCome++
	}
	req.Needed = needed
	byTemplate := map[string]*gang.NodeConstraints{}
	logger := klog.Background()
	for _, pod := range pending {
		tmpl := fmt.Sprint(pod.Spec.NodeSelector, pod.Spec.Affinity, pod.Spec.Tolerations)
		nc := byTemplate[tmpl]
		if nc == nil {
			nc = gang.ConstraintsOf(logger, pod)
			byTemplate[tmpl] = nc
		}
		uid := pod.UID
		if uid == "" {
			uid = types.UID(pod.Name)
		}
		req.Members = append(req.Members, gang.Member{UID: uid, Name: pod.Name, Request: ix.requestOf(pod), Constraints: nc})
	}
	return req, toCome
}

// domainRoom is how many of a gang's members one domain has room for.
type domainRoom struct {
	level, name string
	room        int
	freeGPUs    int64
	nodes       []int // node state indexes
}

// limitLevel is the widest level the gang may use: its required level, or
// the whole cluster ("").
func limitLevel(req gang.Request) (gang.Level, bool) {
	for _, l := range req.Levels {
		if l.Name == req.Required {
			return l, true
		}
	}
	return gang.Level{}, false
}

// eligible reports whether a node may take a member at all: available, the
// policy allows it, and the members' node constraints match.
func eligible(s *nodeState, req gang.Request) bool {
	view := s.view(req.GPU)
	return view.Eligible(req.Policy) && (len(req.Members) == 0 || req.Members[0].Constraints.Match(s.node))
}

// closest is the domain of the gang's widest allowed level with room for
// most members (the bound members' domain when some run), by the planner's
// own per-node screening: members largest first, each on the node with the
// least room that still fits it.
func (ix *index) closest(req gang.Request, states []nodeState) *domainRoom {
	level, limited := limitLevel(req)
	domains := map[string]*domainRoom{}
	var order []string
	boundDomain := ""
	if limited {
		for _, name := range req.BoundNodes {
			if n := ix.nodes[name]; n != nil {
				boundDomain = n.Labels[level.Label]
			}
		}
	}
	for i := range states {
		s := &states[i]
		if !eligible(s, req) {
			continue
		}
		name := "cluster"
		if limited {
			name = s.node.Labels[level.Label]
			if name == "" || (boundDomain != "" && name != boundDomain) {
				continue
			}
		}
		d := domains[name]
		if d == nil {
			d = &domainRoom{level: level.Name, name: name}
			domains[name] = d
			order = append(order, name)
		}
		d.nodes = append(d.nodes, i)
		d.freeGPUs += max(s.freeGPUs, 0)
	}
	var best *domainRoom
	sort.Strings(order)
	for _, name := range order {
		d := domains[name]
		d.room = roomFor(req, states, d.nodes)
		if best == nil || d.room > best.room || (d.room == best.room && d.freeGPUs > best.freeGPUs) {
			best = d
		}
	}
	return best
}

// roomFor packs the request's members best-fit onto the nodes and counts
// how many fit.
func roomFor(req gang.Request, states []nodeState, nodes []int) int {
	members := append([]gang.Member(nil), req.Members...)
	sort.SliceStable(members, func(i, j int) bool {
		return members[i].Request.Scalars[req.GPU] > members[j].Request.Scalars[req.GPU]
	})
	free := make([]gang.Resources, len(nodes))
	for i, n := range nodes {
		free[i] = states[n].free.Clone()
	}
	placed := 0
	for _, m := range members {
		best := -1
		for i := range nodes {
			if !free[i].Fits(m.Request) {
				continue
			}
			if best < 0 || free[i].Scalars[req.GPU] < free[best].Scalars[req.GPU] {
				best = i
			}
		}
		if best >= 0 {
			free[best].Sub(m.Request)
			placed++
		}
	}
	return placed
}

// capacityMessage says how far the gang is from fitting: how many more
// nodes of what size it needs, and where it comes closest.
func (ix *index) capacityMessage(req gang.Request, states []nodeState, closest *domainRoom) string {
	needed := req.Needed
	level, limited := limitLevel(req)
	in := ""
	if limited {
		in = " in one " + level.Name
	}
	if closest == nil {
		return fmt.Sprintf("no node may take a member%s (see the node summary)", in)
	}
	short := needed - closest.room
	if short <= 0 {
		return ""
	}
	var gpus int64
	for _, m := range req.Members {
		gpus = max(gpus, m.Request.Scalars[req.GPU])
	}
	where := "the cluster"
	if limited {
		where = closest.level + " " + closest.name
	}
	has := fmt.Sprintf("%s has room for %d of %d", where, closest.room, needed)
	if gpus == 0 {
		return fmt.Sprintf("needs room for %d more member%s%s; %s", short, plural(short), in, has)
	}
	// Nodes of the largest GPU size in the cluster.
	var largest int64
	for i := range states {
		largest = max(largest, states[i].allocGPUs)
	}
	perNode := max(largest/gpus, 1)
	nodes := (int64(short) + perNode - 1) / perNode
	each := min(int64(short), perNode) * gpus
	return fmt.Sprintf("needs %d more node%s with %d free %s%s; %s members", nodes, plural(int(nodes)), each, req.GPU, in, has)
}

// nodeCounts groups the nodes by the first reason they cannot take one of
// the gang's members (its largest), on the live state.
func (ix *index) nodeCounts(req gang.Request, states []nodeState, closest *domainRoom) []NodeCount {
	if len(req.Members) == 0 {
		return nil
	}
	m := req.LargestMember()
	gpus := m.Request.Scalars[req.GPU]
	level, _ := limitLevel(req)
	closestName := ""
	if closest != nil {
		closestName = closest.name
	}
	counts := map[string]*NodeCount{}
	var order []string
	count := func(reason, message, node string) {
		c := counts[reason]
		if c == nil {
			c = &NodeCount{Reason: reason, Message: message}
			counts[reason] = c
			order = append(order, reason)
		}
		c.Nodes++
		if len(c.Examples) < 3 {
			c.Examples = append(c.Examples, node)
		}
	}
	for i := range states {
		s := &states[i]
		view := s.view(req.GPU)
		reason := gang.NodeReason(req, m, &view, closestName)
		var message string
		switch reason {
		case NodeCordoned:
			message = "cordoned"
		case NodeReclaiming:
			message = "being reclaimed (a reclaim taint)"
		case NodePolicy:
			kind := "spot"
			if !s.spot {
				kind = "on-demand"
			}
			message = fmt.Sprintf("%s, which muster.dev/preemptible: %s excludes", kind, req.Policy)
		case NodeConstraints:
			message = "taints, node selector or required node affinity exclude the members"
		case NodeNoDomain:
			message = fmt.Sprintf("no %s label (%s), which topology-required needs", level.Name, level.Label)
		case NodeInsufficientGPUs:
			message = fmt.Sprintf("fewer than %d free %s", gpus, req.GPU)
		case NodeInsufficientOther:
			message = fmt.Sprintf("enough %s but not enough cpu, memory or pod slots free", req.GPU)
		case NodeOutsideDomain:
			message = fmt.Sprintf("room for a member, but outside %s %s (the closest %s)", level.Name, closestName, level.Name)
		default:
			message = "room for a member"
		}
		count(reason, message, s.node.Name)
	}
	out := make([]NodeCount, 0, len(order))
	for _, r := range order {
		out = append(out, *counts[r])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Nodes > out[j].Nodes })
	return out
}

// victim is a bound gang whose GPUs might make room.
type victim struct {
	key      gang.Key
	priority int32
	gpus     int64
	pods     []*corev1.Pod
}

// maxVictimTries bounds the what-if plans preemptionFindings runs.
const maxVictimTries = 64

// preemptionFindings says which single bound gang, if it were gone, would
// let the gang fit, and whether muster may preempt it.
func (ix *index) preemptionFindings(st *gangState, g *Gang, req gang.Request, states []nodeState, add func(string, string, ...any)) {
	victims := map[gang.Key]*victim{}
	for i := range ix.snap.Pods {
		pod := &ix.snap.Pods[i]
		if pod.Spec.NodeName == "" || !live(pod) {
			continue
		}
		key, ok := ix.keyOf(pod)
		if !ok {
			key = gang.LoneKey(pod)
		}
		if key == st.key {
			continue
		}
		v := victims[key]
		if v == nil {
			v = &victim{key: key}
			victims[key] = v
		}
		v.pods = append(v.pods, pod)
		v.gpus += ix.requestOf(pod).Scalars[ix.opts.GPU]
		if pod.Spec.Priority != nil && *pod.Spec.Priority > v.priority {
			v.priority = *pod.Spec.Priority
		}
	}
	list := make([]*victim, 0, len(victims))
	for _, v := range victims {
		if v.gpus > 0 {
			if w := ix.workloads[nsName(v.key.Namespace, v.key.Name)]; v.key.Kind == gang.KindWorkloadPodGroup && w != nil && w.Spec.Priority != nil {
				v.priority = *w.Spec.Priority
			}
			list = append(list, v)
		}
	}
	// Fewest GPUs first, as muster chooses victims; then lowest priority.
	sort.Slice(list, func(i, j int) bool {
		if list[i].gpus != list[j].gpus {
			return list[i].gpus < list[j].gpus
		}
		if list[i].priority != list[j].priority {
			return list[i].priority < list[j].priority
		}
		return list[i].key.String() < list[j].key.String()
	})
	byName := make(map[string]int, len(states))
	for i := range states {
		byName[states[i].node.Name] = i
	}
	never := false
	for _, pod := range st.pods {
		if p := pod.Spec.PreemptionPolicy; p != nil && *p == corev1.PreemptNever {
			never = true
		}
	}
	found := 0
	for i, v := range list {
		if i >= maxVictimTries || found == 2 {
			break
		}
		trial := make([]nodeState, len(states))
		copy(trial, states)
		for _, pod := range v.pods {
			j, ok := byName[pod.Spec.NodeName]
			if !ok {
				continue
			}
			free := trial[j].free.Clone()
			free.Add(ix.requestOf(pod))
			trial[j].free = free
		}
		if _, err := gang.Compute(req, ix.views(trial)); err != nil {
			continue
		}
		found++
		what := fmt.Sprintf("would fit if %s (priority %d, %d %s) were preempted", describeKey(v.key), v.priority, v.gpus, ix.opts.GPU)
		switch {
		case v.priority >= g.Priority:
			add(FindingPreemptBlocked, "%s: this gang's priority %d does not allow it (muster preempts only lower priorities)", what, g.Priority)
		case never:
			add(FindingPreemptBlocked, "%s: this gang's priority %d is higher, but its preemptionPolicy is Never", what, g.Priority)
		default:
			add(FindingPreemptPossible, "%s, and this gang's priority %d allows it: muster preempts it when it plans the gang again (unless PodDisruptionBudgets or gangPreemption: false stop it)", what, g.Priority)
		}
	}
}

func describeKey(k gang.Key) string {
	if k.Kind == gang.KindPod {
		return "pod " + k.Namespace + "/" + k.Name
	}
	return "gang " + k.Namespace + "/" + kindArg(k.Kind) + "/" + k.Name
}

// nodeDomains names a node's domains at every level but the node's own
// ("rack r1, zone z1").
func (ix *index) nodeDomains(name string) string {
	n := ix.nodes[name]
	if n == nil {
		return ""
	}
	var parts []string
	for _, l := range ix.opts.Levels {
		if l.Label == "" || l.Label == corev1.LabelHostname {
			continue
		}
		if v := n.Labels[l.Label]; v != "" {
			parts = append(parts, l.Name+" "+v)
		}
	}
	return strings.Join(parts, ", ")
}

// eventNotes are the newest of muster's Events.
func eventNotes(events []*eventsv1.Event) []EventNote {
	sorted := append([]*eventsv1.Event(nil), events...)
	sort.SliceStable(sorted, func(i, j int) bool { return eventTime(sorted[i]).After(eventTime(sorted[j])) })
	var out []EventNote
	for _, e := range sorted {
		if len(out) == 5 {
			break
		}
		count := int32(1)
		if e.Series != nil {
			count = e.Series.Count
		} else if e.DeprecatedCount > 0 {
			count = e.DeprecatedCount
		}
		t := metav1.NewTime(eventTime(e))
		out = append(out, EventNote{Reason: e.Reason, Message: e.Note, Count: count, Last: &t})
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// didYouMean suggests the closest of names to s (edit distance at most a
// third of its length, at least 2).
func didYouMean(s string, names []string) string {
	best, bestDist := "", -1
	for _, n := range names {
		if d := editDistance(s, n); bestDist < 0 || d < bestDist || (d == bestDist && n < best) {
			best, bestDist = n, d
		}
	}
	if bestDist < 0 || bestDist > max(2, len(s)/3) {
		return ""
	}
	return fmt.Sprintf("; did you mean %s?", best)
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// age is how long ago t was, kubectl style.
func age(now time.Time, t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	d := now.Sub(t.Time)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
