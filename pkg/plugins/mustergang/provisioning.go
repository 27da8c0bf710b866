package mustergang

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/apis/config"
	"github.com/muster-sched/muster/pkg/gang"
)

// Asking cluster-autoscaler for a gang's nodes (docs/autoscaling.md): a gang
// that cannot be placed on the cluster's nodes, and cannot preempt its way
// in, gets one ProvisioningRequest for all its pending members, and its
// members consume it. The request is deleted when the gang gets a plan,
// waits for members again, or leaves.

// cluster-autoscaler's names, as k8s.io/autoscaler/cluster-autoscaler/apis
// (provisioningrequest/autoscaling.x-k8s.io/v1) spells them; a test holds
// them to that module.
const (
	ConsumeProvisioningRequestAnnotation = "autoscaling.x-k8s.io/consume-provisioning-request"
	ProvisioningClassAnnotation          = "autoscaling.x-k8s.io/provisioning-class-name"

	provisioningAccepted        = "Accepted"
	provisioningProvisioned     = "Provisioned"
	provisioningFailed          = "Failed"
	provisioningBookingExpired  = "BookingExpired"
	provisioningCapacityRevoked = "CapacityRevoked"
)

// ProvisioningRequests is the resource muster creates for a gang that needs
// new nodes.
var ProvisioningRequests = schema.GroupVersionResource{Group: "autoscaling.x-k8s.io", Version: "v1", Resource: "provisioningrequests"}

const (
	// ManagedByLabel marks the ProvisioningRequests and PodTemplates muster
	// creates (value "muster"); the admission policy lets the scheduler
	// delete only those.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "muster"
	// The gang a request is for, so that a restarted scheduler finds it.
	gangKindAnnotation = "muster.dev/gang-kind"
	gangNameAnnotation = "muster.dev/gang-name"

	// provisioningNotAcceptedAfter: a request no autoscaler accepted by
	// then is announced (is cluster-autoscaler run with
	// --enable-provisioning-requests?).
	provisioningNotAcceptedAfter = 5 * time.Minute
	// After a failed request the gang waits this long before it asks
	// again, doubling with each failure up to provisioningRetryMax.
	provisioningRetryBase = time.Minute
	provisioningRetryMax  = 30 * time.Minute
	// maxPodSets is the API's limit on a request's pod sets.
	maxPodSets = 32
)

// need says whether a gang needs new nodes, as muster's last word on it
// said.
type need int

const (
	// needUnknown: nothing said since this scheduler started (a request
	// found then is kept while the gang has pending members and no plan).
	needUnknown need = iota
	needNodes
	needNone
)

// provisioner keeps one ProvisioningRequest per gang that needs nodes.
type provisioner struct {
	class    string
	requests dynamic.NamespaceableResourceInterface
	core     kubernetes.Interface
	store    cache.Store // the requests muster made, from an informer
	members  func(gang.Key) memberSet
	matchers []config.NodeMatcher
	// domain is the topology domain a member's gang must be placed in,
	// where node groups can express it (a zone): its node label and the
	// domain with the most free GPUs. Empty when there is none.
	domain       func(pod *v1.Pod) (label, value string)
	hasPlan      func(gang.Key) bool
	event        func(key gang.Key, eventType, reason, message string)
	nodesArrived func(gang.Key) // wakes the gang: its nodes are there
	now          func() time.Time
	queue        workqueue.TypedRateLimitingInterface[gang.Key]

	mu    sync.Mutex
	gangs map[gang.Key]*gangProvisioning
}

// gangProvisioning is what the provisioner keeps of one gang.
type gangProvisioning struct {
	need need
	// announced is the last state of request uid told in an Event.
	uid       types.UID
	announced string
	// failures and retryAt pace new requests after failed ones.
	failures int
	retryAt  time.Time
}

// backOff records a failed or ended request at now: the next is asked for
// after the backoff, or at once for the first request whose capacity went
// (firstAtOnce). Called under the provisioner's lock.
func (st *gangProvisioning) backOff(now time.Time, firstAtOnce bool) {
	st.failures++
	wait := min(provisioningRetryBase<<min(st.failures-1, 5), provisioningRetryMax)
	if firstAtOnce && st.failures == 1 {
		wait = 0
	}
	st.retryAt = now.Add(wait)
}

// newProvisioner starts nothing; run does, once the scheduler leads.
func newProvisioner(class string, dyn dynamic.Interface, core kubernetes.Interface, members func(gang.Key) memberSet, matchers []config.NodeMatcher) *provisioner {
	return &provisioner{class: class, requests: dyn.Resource(ProvisioningRequests), core: core, members: members, matchers: matchers,
		now: time.Now, gangs: map[gang.Key]*gangProvisioning{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[gang.Key](),
			workqueue.TypedRateLimitingQueueConfig[gang.Key]{Name: "muster-provisioning"})}
}

// handler enqueues the gang of a request muster made when it changes.
func (pv *provisioner) handler() cache.ResourceEventHandler {
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if key, ok := requestGang(u); ok {
				pv.queue.Add(key)
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue}
}

// noticed follows what muster said of a gang: a gang with no room asks for
// nodes, a gang with a plan (or waiting for members, or invalid, or one
// that can never form: GangNotPossible) needs none.
func (pv *provisioner) noticed(n gang.Notice) {
	if pv == nil {
		return
	}
	want := needNone
	switch n.Outcome {
	case gang.OutcomeUnschedulable:
		want = needNodes
	case gang.OutcomeRejected, gang.OutcomeTimedOut:
		return // a plan was dropped; the next one says
	}
	if n.Key.Kind == gang.KindPod {
		return // pods alone are the autoscaler's own business
	}
	pv.mu.Lock()
	st := pv.gangs[n.Key]
	if st == nil {
		if want == needNone {
			// Nothing kept, nothing to do: a request left by an earlier
			// scheduler is found by its informer event.
			pv.mu.Unlock()
			return
		}
		st = &gangProvisioning{}
		pv.gangs[n.Key] = st
	}
	changed := st.need != want
	st.need = want
	pv.mu.Unlock()
	if changed {
		pv.queue.Add(n.Key)
	}
}

// forget: the gang left; its request goes.
func (pv *provisioner) forget(key gang.Key) {
	if pv == nil || key.Kind == gang.KindPod {
		return
	}
	pv.mu.Lock()
	if st := pv.gangs[key]; st != nil {
		st.need = needNone
	}
	pv.mu.Unlock()
	pv.queue.Add(key)
}

// podAdded: a new member of a gang with a request consumes it too.
func (pv *provisioner) podAdded(key gang.Key) {
	if pv == nil {
		return
	}
	pv.mu.Lock()
	st := pv.gangs[key]
	pv.mu.Unlock()
	if st != nil && st.need == needNodes {
		pv.queue.Add(key)
	}
}

func (pv *provisioner) sizes(out map[string]int) {
	if pv == nil {
		return
	}
	pv.mu.Lock()
	out["provisioning gangs"] = len(pv.gangs)
	pv.mu.Unlock()
	out["provisioning queue"] = pv.queue.Len()
}

// sync brings the gang's request in line with its need.
func (pv *provisioner) sync(ctx context.Context, key gang.Key) error {
	name := requestName(key)
	var existing *unstructured.Unstructured
	if obj, ok, err := pv.store.GetByKey(key.Namespace + "/" + name); err == nil && ok {
		existing = obj.(*unstructured.Unstructured)
	}
	members := pv.members(key)
	// Asked before the lock: the gang manager has its own.
	adoptable := existing != nil && len(members.pending) > 0 && !pv.hasPlan(key)
	pv.mu.Lock()
	st := pv.gangs[key]
	want := needUnknown
	if st != nil {
		want = st.need
	}
	if want == needUnknown {
		want = needNone
		if adoptable {
			want = needNodes // kept across a restart
		}
	}
	if want == needNone || members.total == 0 {
		if st != nil && (members.total == 0 || existing == nil) {
			delete(pv.gangs, key) // nothing left to keep
		}
		pv.mu.Unlock()
		if existing == nil {
			return nil
		}
		return pv.deleteRequest(ctx, key, existing)
	}
	if st == nil {
		st = &gangProvisioning{need: needNodes}
		pv.gangs[key] = st
	}
	retryAt := st.retryAt
	pv.mu.Unlock()

	if existing == nil {
		if wait := retryAt.Sub(pv.now()); wait > 0 {
			pv.queue.AddAfter(key, wait)
			return nil
		}
		if len(members.pending) == 0 {
			return nil
		}
		return pv.createRequest(ctx, key, name, members.pending)
	}
	if err := pv.consume(ctx, name, members.pending); err != nil {
		return err
	}
	return pv.follow(ctx, key, st, existing)
}

// follow announces what the autoscaler said of the request, and ends a
// request that failed or whose capacity is gone.
func (pv *provisioner) follow(ctx context.Context, key gang.Key, st *gangProvisioning, req *unstructured.Unstructured) error {
	conds := requestConditions(req)
	state, eventType, reason, message := "", v1.EventTypeNormal, "", ""
	ended := false
	switch {
	case conds[provisioningFailed].Status == metav1.ConditionTrue:
		c := conds[provisioningFailed]
		state, eventType, reason, ended = provisioningFailed, v1.EventTypeWarning, gang.ReasonProvisioningFailed, true
		message = fmt.Sprintf("cluster-autoscaler could not provision the nodes of %s (ProvisioningRequest %s, %s): %s", key.Subject(), req.GetName(), c.Reason, c.Message)
	case conds[provisioningCapacityRevoked].Status == metav1.ConditionTrue, conds[provisioningBookingExpired].Status == metav1.ConditionTrue:
		c, what := conds[provisioningBookingExpired], "the capacity booked for it expired"
		if conds[provisioningCapacityRevoked].Status == metav1.ConditionTrue {
			c, what = conds[provisioningCapacityRevoked], "its capacity was revoked"
		}
		state, eventType, reason, ended = c.Type, v1.EventTypeWarning, gang.ReasonProvisioningEnded, true
		message = fmt.Sprintf("ProvisioningRequest %s of %s ended: %s (%s: %s); muster asks again if the gang still cannot be placed", req.GetName(), key.Subject(), what, c.Reason, c.Message)
	case conds[provisioningProvisioned].Status == metav1.ConditionTrue:
		state, reason = provisioningProvisioned, gang.ReasonProvisioned
		message = fmt.Sprintf("cluster-autoscaler provisioned the nodes of %s (ProvisioningRequest %s); muster plans the gang on them", key.Subject(), req.GetName())
	case conds[provisioningAccepted].Status != metav1.ConditionTrue:
		age := pv.now().Sub(req.GetCreationTimestamp().Time)
		if age < provisioningNotAcceptedAfter {
			pv.queue.AddAfter(key, provisioningNotAcceptedAfter-age)
			return nil
		}
		state, eventType, reason = "NotAccepted", v1.EventTypeWarning, gang.ReasonProvisioningNotAccepted
		message = fmt.Sprintf("no autoscaler has accepted ProvisioningRequest %s of %s in %s (is cluster-autoscaler run with --enable-provisioning-requests, and does it serve class %s?)",
			req.GetName(), key.Subject(), provisioningNotAcceptedAfter, pv.class)
	default:
		return nil
	}
	pv.mu.Lock()
	fresh := st.uid != req.GetUID() || st.announced != state
	st.uid, st.announced = req.GetUID(), state
	if ended && fresh {
		// A request that ended with its capacity gone (booking expired,
		// revoked) is asked again at once the first time.
		st.backOff(pv.now(), state != provisioningFailed)
	}
	if state == provisioningProvisioned {
		st.failures = 0
	}
	pv.mu.Unlock()
	if fresh {
		klog.FromContext(ctx).V(2).Info("Gang provisioning", "gang", key, "request", req.GetName(), "state", state)
		pv.event(key, eventType, reason, message)
		if state == provisioningProvisioned {
			pv.nodesArrived(key)
		}
	}
	if ended {
		return pv.deleteRequest(ctx, key, req)
	}
	return nil
}

// createRequest creates the gang's PodTemplates, then its request, and
// announces it; its members consume it once the informer has it.
func (pv *provisioner) createRequest(ctx context.Context, key gang.Key, name string, pending []*v1.Pod) error {
	sets := podSets(pending)
	if len(sets) > maxPodSets {
		pv.event(key, v1.EventTypeWarning, gang.ReasonProvisioningFailed,
			fmt.Sprintf("%s has %d kinds of members; a ProvisioningRequest holds at most %d pod sets, so muster cannot ask for its nodes", key.Subject(), len(sets), maxPodSets))
		pv.mu.Lock()
		if st := pv.gangs[key]; st != nil {
			st.retryAt = pv.now().Add(provisioningRetryMax)
		}
		pv.mu.Unlock()
		return nil
	}
	owners := gangOwners(pending)
	labels := map[string]string{ManagedByLabel: managedBy}
	var podSetsField []any
	for i, set := range sets {
		tmpl := &v1.PodTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Namespace: key.Namespace, Labels: labels, OwnerReferences: owners},
			Template:   pv.template(set.pod),
		}
		if _, err := pv.core.CoreV1().PodTemplates(key.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return pv.refused(ctx, key, fmt.Errorf("creating PodTemplate %s: %w", tmpl.Name, err))
		}
		podSetsField = append(podSetsField, map[string]any{"podTemplateRef": map[string]any{"name": tmpl.Name}, "count": int64(set.count)})
	}
	req := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ProvisioningRequests.GroupVersion().String(), "kind": "ProvisioningRequest",
		"spec": map[string]any{"provisioningClassName": pv.class, "podSets": podSetsField},
	}}
	req.SetName(name)
	req.SetNamespace(key.Namespace)
	req.SetLabels(labels)
	req.SetAnnotations(map[string]string{gangKindAnnotation: string(key.Kind), gangNameAnnotation: key.Name})
	req.SetOwnerReferences(owners)
	created, err := pv.requests.Namespace(key.Namespace).Create(ctx, req, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // the informer brings it
	}
	if err != nil {
		return pv.refused(ctx, key, fmt.Errorf("creating ProvisioningRequest %s: %w", name, err))
	}
	n := 0
	for _, s := range sets {
		n += s.count
	}
	klog.FromContext(ctx).V(2).Info("Gang provisioning", "gang", key, "request", name, "state", "Requested", "pods", n)
	pv.event(key, v1.EventTypeNormal, gang.ReasonProvisioningRequested,
		fmt.Sprintf("%s does not fit on the cluster's nodes; muster asked cluster-autoscaler for nodes for its %d pending members (ProvisioningRequest %s, class %s)",
			key.Subject(), n, created.GetName(), pv.class))
	return nil
}

// refused announces that the API server refused what the gang's request
// needs, and paces the next try as after a failed request: a webhook or a
// quota that refuses once usually refuses again.
func (pv *provisioner) refused(ctx context.Context, key gang.Key, err error) error {
	klog.FromContext(ctx).Error(err, "Asking cluster-autoscaler for a gang's nodes failed", "gang", key)
	pv.mu.Lock()
	if st := pv.gangs[key]; st != nil {
		st.backOff(pv.now(), false)
	}
	pv.mu.Unlock()
	pv.event(key, v1.EventTypeWarning, gang.ReasonProvisioningFailed, fmt.Sprintf("muster could not ask cluster-autoscaler for the nodes of %s: %v", key.Subject(), err))
	pv.queue.Add(key) // sync waits out the backoff
	return nil
}

// consume marks the pending members as consumers of the request, so that
// cluster-autoscaler scales up for the gang as a whole and never for them
// one by one.
func (pv *provisioner) consume(ctx context.Context, name string, pending []*v1.Pod) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		ConsumeProvisioningRequestAnnotation: name, ProvisioningClassAnnotation: pv.class}}})
	for _, pod := range pending {
		if pod.Annotations[ConsumeProvisioningRequestAnnotation] == name && pod.Annotations[ProvisioningClassAnnotation] == pv.class {
			continue
		}
		_, err := pv.core.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("marking pod %s/%s as consumer of %s: %w", pod.Namespace, pod.Name, name, err)
		}
	}
	return nil
}

// deleteRequest deletes the request and its PodTemplates.
func (pv *provisioner) deleteRequest(ctx context.Context, key gang.Key, req *unstructured.Unstructured) error {
	uid := req.GetUID()
	err := pv.requests.Namespace(req.GetNamespace()).Delete(ctx, req.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting ProvisioningRequest %s: %w", req.GetName(), err)
	}
	sets, _, _ := unstructured.NestedSlice(req.Object, "spec", "podSets")
	for _, s := range sets {
		tmpl, _, _ := unstructured.NestedString(s.(map[string]any), "podTemplateRef", "name")
		if tmpl == "" {
			continue
		}
		if err := pv.core.CoreV1().PodTemplates(req.GetNamespace()).Delete(ctx, tmpl, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting PodTemplate %s: %w", tmpl, err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Gang provisioning", "gang", key, "request", req.GetName(), "state", "Deleted")
	return nil
}

// nodeGroupLabels are the topology labels a node group's nodes share and
// cluster-autoscaler's template nodes carry, so a request can pin a gang's
// domain with them. Racks, NVLink cliques and hostnames are not: a node
// group does not choose them.
var nodeGroupLabels = sets.New(v1.LabelTopologyZone, v1.LabelTopologyRegion)

// podSet is members alike for the autoscaler: one pod stands for count.
type podSet struct {
	pod   *v1.Pod
	count int
}

// podSets groups pods by what the autoscaler's simulation reads of them:
// requests, node selection, tolerations, claims and spread.
func podSets(pods []*v1.Pod) []podSet {
	var sets []podSet
	index := map[string]int{}
	for _, pod := range pods {
		sig := podSignature(pod)
		if i, ok := index[sig]; ok {
			sets[i].count++
			continue
		}
		index[sig] = len(sets)
		sets = append(sets, podSet{pod: pod, count: 1})
	}
	return sets
}

func podSignature(pod *v1.Pod) string {
	s := pod.Spec
	resources := func(cs []v1.Container) []v1.ResourceRequirements {
		var out []v1.ResourceRequirements
		for _, c := range cs {
			out = append(out, c.Resources)
		}
		return out
	}
	data, _ := json.Marshal([]any{resources(s.InitContainers), resources(s.Containers), s.Overhead, s.Resources, s.NodeSelector,
		s.Affinity, s.Tolerations, s.TopologySpreadConstraints, s.ResourceClaims, s.PriorityClassName})
	return string(data)
}

// template is what the autoscaler simulates for a pod set: the member's
// spec and labels, unbound and ungated, with the gang's preemptible policy
// as node affinity where the policy's node matchers are labels.
func (pv *provisioner) template(pod *v1.Pod) v1.PodTemplateSpec {
	spec := *pod.Spec.DeepCopy()
	spec.NodeName, spec.SchedulingGates, spec.EphemeralContainers = "", nil, nil
	if policy, err := gang.ParsePolicy(pod.Annotations[gang.AnnotationPreemptible]); err == nil {
		policyAffinity(&spec, policy, pv.matchers)
	}
	if pv.domain != nil {
		if label, value := pv.domain(pod); label != "" && value != "" {
			requireEverywhere(&spec, v1.NodeSelectorRequirement{Key: label, Operator: v1.NodeSelectorOpIn, Values: []string{value}})
		}
	}
	return v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels}, Spec: spec}
}

// requireEverywhere adds reqs to every term of spec's required node
// affinity (a term of their own when it has none): a node must meet them
// whatever else it meets.
func requireEverywhere(spec *v1.PodSpec, reqs ...v1.NodeSelectorRequirement) {
	terms := requiredTerms(spec)
	for i := range *terms {
		(*terms)[i].MatchExpressions = append((*terms)[i].MatchExpressions, reqs...)
	}
}

// requiredTerms are spec's required node affinity terms, one empty term
// when it has none, ready to be changed in place.
func requiredTerms(spec *v1.PodSpec) *[]v1.NodeSelectorTerm {
	if spec.Affinity == nil {
		spec.Affinity = &v1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &v1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &v1.NodeSelector{}
	}
	terms := &na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(*terms) == 0 {
		*terms = []v1.NodeSelectorTerm{{}}
	}
	return terms
}

// policyAffinity adds to spec's required node affinity what keeps the
// autoscaler to the nodes the policy allows: none of the preemptible labels
// for forbid, one of them for require.
func policyAffinity(spec *v1.PodSpec, policy gang.Policy, matchers []config.NodeMatcher) {
	var labels []config.NodeMatcher
	for _, m := range matchers {
		if m.Source == config.NodeMatcherLabel {
			labels = append(labels, m)
		}
	}
	if len(labels) == 0 || (policy != gang.PolicyForbid && policy != gang.PolicyRequire) {
		return
	}
	requirement := func(m config.NodeMatcher, in bool) v1.NodeSelectorRequirement {
		switch {
		case m.Value != "" && in:
			return v1.NodeSelectorRequirement{Key: m.Key, Operator: v1.NodeSelectorOpIn, Values: []string{m.Value}}
		case m.Value != "":
			return v1.NodeSelectorRequirement{Key: m.Key, Operator: v1.NodeSelectorOpNotIn, Values: []string{m.Value}}
		case in:
			return v1.NodeSelectorRequirement{Key: m.Key, Operator: v1.NodeSelectorOpExists}
		}
		return v1.NodeSelectorRequirement{Key: m.Key, Operator: v1.NodeSelectorOpDoesNotExist}
	}
	if policy == gang.PolicyForbid { // none of the labels
		var none []v1.NodeSelectorRequirement
		for _, m := range labels {
			none = append(none, requirement(m, false))
		}
		requireEverywhere(spec, none...)
		return
	}
	terms := requiredTerms(spec) // each term, with any one of the labels
	var out []v1.NodeSelectorTerm
	for _, t := range *terms {
		for _, m := range labels {
			withLabel := *t.DeepCopy()
			withLabel.MatchExpressions = append(withLabel.MatchExpressions, requirement(m, true))
			out = append(out, withLabel)
		}
	}
	*terms = out
}

// gangOwners are the owner references of a gang's request: its members'
// controller (Job, StatefulSet, TFJob...), so that the garbage collector
// deletes the request with the workload even while muster is down.
func gangOwners(pods []*v1.Pod) []metav1.OwnerReference {
	for _, pod := range pods {
		if ref := metav1.GetControllerOf(pod); ref != nil {
			return []metav1.OwnerReference{{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}}
		}
	}
	return nil
}

// requestName is the name of the gang's request: the same for the same gang
// in every scheduler's life, so a restart finds it instead of making another.
func requestName(key gang.Key) string {
	sum := sha256.Sum256([]byte(key.String() + "/" + string(key.Kind)))
	name := "muster-" + key.Name
	if len(name) > 200 {
		name = name[:200]
	}
	return name + "-" + hex.EncodeToString(sum[:4])
}

// requestGang is the gang a request muster made is for.
func requestGang(u *unstructured.Unstructured) (gang.Key, bool) {
	a := u.GetAnnotations()
	if u.GetLabels()[ManagedByLabel] != managedBy || a[gangKindAnnotation] == "" || a[gangNameAnnotation] == "" {
		return gang.Key{}, false
	}
	return gang.Key{Kind: gang.Kind(a[gangKindAnnotation]), Namespace: u.GetNamespace(), Name: a[gangNameAnnotation]}, true
}

// requestConditions are a request's status conditions by type.
func requestConditions(u *unstructured.Unstructured) map[string]metav1.Condition {
	var status struct {
		Conditions []metav1.Condition `json:"conditions"`
	}
	if m, ok := u.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(m, &status) // what does not convert is no condition
	}
	out := make(map[string]metav1.Condition, len(status.Conditions))
	for _, c := range status.Conditions {
		out[c.Type] = c
	}
	return out
}

// watchProvisioning starts the provisioner when the plugin's args name a
// class and the API server serves ProvisioningRequests; it works once the
// scheduler leads (active: the pod informer has synced).
func (p *Plugin) watchProvisioning(ctx context.Context, active cache.InformerSynced) error {
	cfg := p.handle.KubeConfig()
	if p.args.ProvisioningClassName == "" || cfg == nil {
		return nil
	}
	logger := klog.FromContext(ctx)
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	resources, err := disco.ServerResourcesForGroupVersion(ProvisioningRequests.GroupVersion().String())
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("asking whether ProvisioningRequests are served: %w", err)
	}
	if !provisioningServed(resources) {
		logger.Info("ProvisioningRequest API not served; gangs that do not fit will not ask cluster-autoscaler for nodes until it is installed and the scheduler restarted",
			"resource", ProvisioningRequests.String(), "class", p.args.ProvisioningClassName)
		return nil
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pv := newProvisioner(p.args.ProvisioningClassName, dyn, p.handle.ClientSet(), p.source.members, p.args.PreemptibleNodeMatchers)
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = ManagedByLabel + "=" + managedBy
	})
	informer := factory.ForResource(ProvisioningRequests).Informer()
	if _, err := informer.AddEventHandler(pv.handler()); err != nil {
		return err
	}
	pv.store = informer.GetStore()
	pv.hasPlan = func(key gang.Key) bool { return p.gangs.Plan(key) != nil }
	pv.event = func(key gang.Key, eventType, reason, message string) {
		if owner := p.source.ownerRef(key); owner != nil {
			p.handle.EventRecorder().Eventf(owner, nil, eventType, reason, "Provisioning", "%s", message)
		}
	}
	pv.domain = func(pod *v1.Pod) (string, string) {
		r, ok, err := p.source.resolve(pod)
		if err != nil || !ok {
			return "", ""
		}
		level := gang.NarrowerLevel(p.nodes.levels, r.Constraints.Required, r.Ask.Required)
		for _, l := range p.nodes.levels {
			if l.Name == level && nodeGroupLabels.Has(l.Label) {
				return l.Label, p.nodes.freestDomain(l.Label)
			}
		}
		return "", ""
	}
	pv.nodesArrived = func(key gang.Key) {
		p.wake(p.logger(), key, gang.WakeNodesProvisioned, p.source.members(key).pending)
	}
	p.provisioning = pv
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), active) {
			return
		}
		factory.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			return
		}
		logger.Info("Gangs that do not fit ask cluster-autoscaler for their nodes", "resource", ProvisioningRequests.String(), "class", pv.class)
		runGangQueue(ctx, pv.queue, "Gang provisioning", 0, pv.sync)
	}()
	return nil
}

// provisioningServed reports whether the API server serves
// ProvisioningRequests.
func provisioningServed(resources *metav1.APIResourceList) bool {
	return resources != nil && slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool {
		return r.Name == ProvisioningRequests.Resource
	})
}
