package kubectlmuster

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// KueueQueueLabel names the Kueue LocalQueue a Job is submitted to.
const KueueQueueLabel = "kueue.x-k8s.io/queue-name"

// kueueVersions are the Kueue API versions read, newest first.
var kueueVersions = []string{"v1beta2", "v1beta1"}

// Kueue is what Kueue says of a suspended Job, from its Workload (`-o json`
// field gang.kueue; docs/explain.md).
type Kueue struct {
	// LocalQueue is the Job's queue label; ClusterQueue the LocalQueue's
	// spec.clusterQueue, or the Workload's admission.
	LocalQueue   string `json:"localQueue,omitempty"`
	ClusterQueue string `json:"clusterQueue,omitempty"`
	// Workload is the Workload Kueue made for the Job, empty when none
	// exists (Kueue not running, or not managing Jobs).
	Workload      string `json:"workload,omitempty"`
	QuotaReserved bool   `json:"quotaReserved"`
	Admitted      bool   `json:"admitted"`
	// Message is the newest word of Kueue's conditions (QuotaReserved,
	// Admitted, Evicted) on the Workload.
	Message string `json:"message,omitempty"`
}

// kueueWorkload is the part of a Workload the plugin reads.
type kueueWorkload struct {
	name, namespace, queue, clusterQueue string
	ownerKind, ownerName                 string
	ownerUID                             string
	conditions                           map[string]metav1.Condition
}

// readKueue lists Kueue's Workloads and LocalQueues in ns when Kueue's API
// is served. Kueue is optional: a cluster without it, or a user who may
// not list its objects, gets a note and the Job's label alone.
func readKueue(ctx context.Context, c Clients, ns string, s *Snapshot) error {
	if c.Dynamic == nil {
		return nil
	}
	version := ""
	for _, v := range kueueVersions {
		served, err := servedResource(c.Kube, "kueue.x-k8s.io/"+v, "workloads")
		if err != nil {
			return err
		}
		if served {
			version = v
			break
		}
	}
	if version == "" {
		return nil // no Kueue: nothing to say unless a Job is queued (suspendedMessage says so)
	}
	s.KueueServed = true
	gv := schema.GroupVersion{Group: "kueue.x-k8s.io", Version: version}
	list, err := c.Dynamic.Resource(gv.WithResource("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		s.Skipped = append(s.Skipped, fmt.Sprintf("you may not list workloads.kueue.x-k8s.io%s: Kueue's view of suspended Jobs is skipped (ClusterRole muster-viewer grants it)", scopeOf(ns)))
		s.KueueServed = false
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing workloads.kueue.x-k8s.io%s: %w", scopeOf(ns), err)
	}
	for i := range list.Items {
		s.KueueWorkloads = append(s.KueueWorkloads, workloadOf(&list.Items[i]))
	}
	queues, err := c.Dynamic.Resource(gv.WithResource("localqueues")).Namespace(ns).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsForbidden(err), apierrors.IsNotFound(err):
		// The ClusterQueue is then only known once admitted.
	case err != nil:
		return fmt.Errorf("listing localqueues.kueue.x-k8s.io%s: %w", scopeOf(ns), err)
	default:
		s.KueueLocalQueues = map[string]string{}
		for _, q := range queues.Items {
			cq, _, _ := unstructured.NestedString(q.Object, "spec", "clusterQueue")
			s.KueueLocalQueues[nsName(q.GetNamespace(), q.GetName())] = cq
		}
	}
	return nil
}

func scopeOf(ns string) string {
	if ns == metav1.NamespaceAll {
		return " in any namespace"
	}
	return fmt.Sprintf(" in namespace %q", ns)
}

func workloadOf(u *unstructured.Unstructured) kueueWorkload {
	w := kueueWorkload{name: u.GetName(), namespace: u.GetNamespace(), conditions: map[string]metav1.Condition{}}
	w.queue, _, _ = unstructured.NestedString(u.Object, "spec", "queueName")
	w.clusterQueue, _, _ = unstructured.NestedString(u.Object, "status", "admission", "clusterQueue")
	for _, o := range u.GetOwnerReferences() {
		if o.Controller != nil && *o.Controller || w.ownerKind == "" {
			w.ownerKind, w.ownerName, w.ownerUID = o.Kind, o.Name, string(o.UID)
		}
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		var cond metav1.Condition
		cond.Type, _, _ = unstructured.NestedString(m, "type")
		status, _, _ := unstructured.NestedString(m, "status")
		cond.Status = metav1.ConditionStatus(status)
		cond.Reason, _, _ = unstructured.NestedString(m, "reason")
		cond.Message, _, _ = unstructured.NestedString(m, "message")
		if t, _, _ := unstructured.NestedString(m, "lastTransitionTime"); t != "" {
			_ = cond.LastTransitionTime.UnmarshalQueryParameter(t)
		}
		w.conditions[cond.Type] = cond
	}
	return w
}

// kueueOf is what Kueue says of a Job, nil when the Job is not queued.
func (ix *index) kueueOf(job *batchv1.Job) *Kueue {
	queue := job.Labels[KueueQueueLabel]
	var wl *kueueWorkload
	for i := range ix.snap.KueueWorkloads {
		w := &ix.snap.KueueWorkloads[i]
		if w.namespace == job.Namespace && w.ownerKind == "Job" && w.ownerName == job.Name &&
			(w.ownerUID == "" || w.ownerUID == string(job.UID)) {
			wl = w
		}
	}
	if queue == "" && wl == nil {
		return nil
	}
	k := &Kueue{LocalQueue: queue}
	if wl == nil {
		return k
	}
	k.Workload = wl.name
	if wl.queue != "" {
		k.LocalQueue = wl.queue
	}
	k.ClusterQueue = wl.clusterQueue
	if k.ClusterQueue == "" {
		k.ClusterQueue = ix.snap.KueueLocalQueues[nsName(job.Namespace, k.LocalQueue)]
	}
	k.QuotaReserved = wl.conditions["QuotaReserved"].Status == metav1.ConditionTrue
	k.Admitted = wl.conditions["Admitted"].Status == metav1.ConditionTrue
	var newest *metav1.Condition
	for _, t := range []string{"QuotaReserved", "Admitted", "Evicted"} {
		c, ok := wl.conditions[t]
		if !ok || c.Message == "" || (t == "Evicted" && c.Status != metav1.ConditionTrue) {
			continue
		}
		if newest == nil || !c.LastTransitionTime.Before(&newest.LastTransitionTime) {
			newest = &c
		}
	}
	if newest != nil {
		k.Message = newest.Message
	}
	return k
}

// suspendedMessage says why a suspended Job waits: Kueue's word when its
// Workload is read, else the queue label or plain spec.suspend.
func (ix *index) suspendedMessage(job *batchv1.Job, k *Kueue) string {
	if k == nil {
		return "suspended (spec.suspend: true); muster places it once it is resumed"
	}
	queue := fmt.Sprintf("LocalQueue %s", k.LocalQueue)
	if k.ClusterQueue != "" {
		queue += fmt.Sprintf(" of ClusterQueue %s", k.ClusterQueue)
	}
	switch {
	case k.Workload == "" && !ix.snap.KueueServed:
		return fmt.Sprintf("suspended: Kueue has not admitted it yet (label %s=%s; Kueue's Workloads are not read here); muster places it once Kueue resumes it",
			KueueQueueLabel, k.LocalQueue)
	case k.Workload == "":
		return fmt.Sprintf("suspended: Kueue has not admitted it yet (label %s=%s) and has made no Workload for it: is Kueue running and managing batch/job?",
			KueueQueueLabel, k.LocalQueue)
	case k.Admitted:
		return fmt.Sprintf("admitted by Kueue (Workload %s, %s); the Job is being resumed, then muster places it", k.Workload, queue)
	case k.QuotaReserved:
		return fmt.Sprintf("suspended by Kueue: Workload %s has quota in %s and waits for its admission checks%s", k.Workload, queue, colon(k.Message))
	}
	return fmt.Sprintf("suspended by Kueue: Workload %s pending admission in %s%s; muster places the Job once Kueue admits and resumes it",
		k.Workload, queue, colon(k.Message))
}

func colon(msg string) string {
	if msg = strings.TrimSpace(msg); msg == "" {
		return ""
	}
	return ": " + msg
}
