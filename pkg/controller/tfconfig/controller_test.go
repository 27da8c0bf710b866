package tfconfig

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// fixture drives Controller.sync directly against a fake clientset, with the informer caches filled
// from it the way the label-filtered informers would fill them. No informer runs, so nothing races.
// The fake does server-side apply with real field management (conflicts, managedFields); the fixture
// adds what the API server does that the controller relies on: a UID for every created Secret, the UID
// precondition of a delete, and an apply naming a UID that never creates and never changes a UID.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	c      *Controller
	events *record.FakeRecorder
	logger klog.Logger
}

var secretsResource = corev1.SchemeGroupVersion.WithResource("secrets")

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	events := record.NewFakeRecorder(1000)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	f := &fixture{t: t, ctx: klog.NewContext(t.Context(), logger), client: client, events: events, logger: logger,
		c: NewController(client, WithEventRecorder(events))}
	tracker := client.Tracker()
	created := 0
	client.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ns, name := a.GetNamespace(), a.(k8stesting.PatchAction).GetName()
		old, err := tracker.Get(secretsResource, ns, name)
		existed := err == nil
		if uid := appliedUID(t, a); uid != "" {
			switch {
			case !existed:
				return true, nil, apierrors.NewConflict(secretsResource.GroupResource(), name,
					fmt.Errorf("uid mismatch: the provided object specified uid %s, and no existing object was found", uid))
			case old.(*corev1.Secret).UID != uid:
				return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Secret").GroupKind(), name,
					field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), uid, "field is immutable")})
			}
		}
		handled, obj, err := k8stesting.ObjectReaction(tracker)(a)
		if isDryRun(a) {
			// The fake tracker writes dry runs; the API server does not: put back what was there.
			if err == nil {
				must(t, tracker.Delete(secretsResource, ns, name))
			}
			if existed && err == nil {
				must(t, tracker.Add(old))
			}
			return handled, obj, err
		}
		if err != nil || existed {
			return handled, obj, err
		}
		s := obj.(*corev1.Secret)
		created++
		s.UID = types.UID(fmt.Sprintf("uid-applied-%s-%d", name, created))
		if s.Type == "" {
			s.Type = corev1.SecretTypeOpaque
		}
		must(t, tracker.Delete(secretsResource, ns, name))
		must(t, tracker.Add(s))
		return true, s, nil
	})
	client.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		pre := d.GetDeleteOptions().Preconditions
		if pre == nil || pre.UID == nil {
			return false, nil, nil
		}
		obj, err := tracker.Get(a.GetResource(), a.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		if m, _ := meta.Accessor(obj); m.GetUID() != *pre.UID {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), d.GetName(),
				fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *pre.UID, m.GetUID()))
		}
		return false, nil, nil
	})
	f.refreshCaches()
	return f
}

// refreshCaches replaces the cache contents with what the API server holds, filtered like the
// informers: opted-in Jobs and StatefulSets, and Services carrying JobLabel.
func (f *fixture) refreshCaches() {
	f.t.Helper()
	var jobs, sets, services []any
	jl, err := f.client.BatchV1().Jobs("").List(f.ctx, metav1.ListOptions{})
	must(f.t, err)
	for i := range jl.Items {
		if jl.Items[i].Labels[OptInLabel] == "true" {
			jobs = append(jobs, &jl.Items[i])
		}
	}
	sl, err := f.client.AppsV1().StatefulSets("").List(f.ctx, metav1.ListOptions{})
	must(f.t, err)
	for i := range sl.Items {
		if sl.Items[i].Labels[OptInLabel] == "true" {
			sets = append(sets, &sl.Items[i])
		}
	}
	svl, err := f.client.CoreV1().Services("").List(f.ctx, metav1.ListOptions{})
	must(f.t, err)
	for i := range svl.Items {
		if _, ok := svl.Items[i].Labels[JobLabel]; ok {
			services = append(services, &svl.Items[i])
		}
	}
	must(f.t, f.c.jobIndexer.Replace(jobs, ""))
	must(f.t, f.c.setIndexer.Replace(sets, ""))
	must(f.t, f.c.serviceFactory.Core().V1().Services().Informer().GetIndexer().Replace(services, ""))
	f.client.ClearActions()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sync reconciles the Job ns/name; see syncKey.
func (f *fixture) sync(ns, name string) (string, []string) {
	f.t.Helper()
	return f.syncKey(gang.Key{Kind: gang.KindJob, Namespace: ns, Name: name})
}

// syncSet reconciles the StatefulSet ns/name; see syncKey.
func (f *fixture) syncSet(ns, name string) (string, []string) {
	f.t.Helper()
	return f.syncKey(gang.Key{Kind: gang.KindStatefulSet, Namespace: ns, Name: name})
}

// syncKey reconciles one workload, fails the test on an error, and refreshes the caches. It returns the
// result and the API writes made, as "verb resource name" ("apply" for a server-side apply).
func (f *fixture) syncKey(key gang.Key) (string, []string) {
	f.t.Helper()
	result, err := f.c.sync(f.ctx, key)
	if err != nil {
		f.t.Fatalf("sync %s: %v", itemName(key), err)
	}
	writes := writesOf(f.client.Actions())
	f.refreshCaches()
	return result, writes
}

// appliedUID is the metadata.uid an apply names, or "".
func appliedUID(t *testing.T, a k8stesting.Action) types.UID {
	var applied metav1.PartialObjectMetadata
	if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &applied); err != nil {
		t.Fatalf("apply of %s: %v", a.(k8stesting.PatchAction).GetName(), err)
	}
	return applied.UID
}

// beforeFirstSecretWrite runs do just before the first apply of a Secret that is not a dry run, as
// someone else would between the controller's dry run and its write. It gets the tracker: the fake
// client is locked while its reactors run.
func (f *fixture) beforeFirstSecretWrite(do func(tracker k8stesting.ObjectTracker)) {
	done := false
	f.client.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !done && !isDryRun(a) {
			done = true
			do(f.client.Tracker())
		}
		return false, nil, nil
	})
}

// isDryRun says whether a patch (an apply) only asked what it would do.
func isDryRun(a k8stesting.Action) bool {
	p, ok := a.(interface{ GetPatchOptions() metav1.PatchOptions })
	return ok && len(p.GetPatchOptions().DryRun) > 0
}

func writesOf(actions []k8stesting.Action) []string {
	var writes []string
	for _, a := range actions {
		// Switch on the verb: an UpdateAction also satisfies CreateAction.
		switch a.GetVerb() {
		case "create", "update":
			m, _ := meta.Accessor(a.(interface{ GetObject() runtime.Object }).GetObject())
			writes = append(writes, fmt.Sprintf("%s %s %s", a.GetVerb(), a.GetResource().Resource, m.GetName()))
		case "delete":
			writes = append(writes, fmt.Sprintf("delete %s %s", a.GetResource().Resource, a.(k8stesting.DeleteAction).GetName()))
		case "patch":
			if isDryRun(a) {
				continue // writes nothing
			}
			p := a.(k8stesting.PatchAction)
			verb := "patch"
			if p.GetPatchType() == types.ApplyPatchType {
				verb = "apply"
			}
			writes = append(writes, fmt.Sprintf("%s %s %s", verb, a.GetResource().Resource, p.GetName()))
		}
	}
	return writes
}

// drainEvents returns the events recorded since the last call, as "Type Reason message".
func (f *fixture) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (f *fixture) logs() string {
	return f.logger.GetSink().(ktesting.Underlier).GetBuffer().String()
}

func (f *fixture) secret(ns, name string) *corev1.Secret {
	f.t.Helper()
	return mustGet(f, "Secret", ns, name, f.client.CoreV1().Secrets(ns).Get)
}

func (f *fixture) service(ns, name string) *corev1.Service {
	f.t.Helper()
	return mustGet(f, "Service", ns, name, f.client.CoreV1().Services(ns).Get)
}

func (f *fixture) secretAbsent(ns, name string) {
	f.t.Helper()
	wantAbsent(f, "Secret", ns, name, f.client.CoreV1().Secrets(ns).Get)
}

func (f *fixture) serviceAbsent(ns, name string) {
	f.t.Helper()
	wantAbsent(f, "Service", ns, name, f.client.CoreV1().Services(ns).Get)
}

// mustGet reads kind ns/name with get, or fails the test.
func mustGet[T any](f *fixture, kind, ns, name string, get func(context.Context, string, metav1.GetOptions) (T, error)) T {
	f.t.Helper()
	obj, err := get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("%s %s/%s: %v", kind, ns, name, err)
	}
	return obj
}

// wantAbsent checks that get finds no kind ns/name.
func wantAbsent[T any](f *fixture, kind, ns, name string, get func(context.Context, string, metav1.GetOptions) (T, error)) {
	f.t.Helper()
	if _, err := get(f.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		f.t.Errorf("%s %s/%s: got err %v, want NotFound", kind, ns, name, err)
	}
}

// createSecret creates s as the named field manager would (kubectl create uses "kubectl-create").
func (f *fixture) createSecret(s *corev1.Secret, manager string) *corev1.Secret {
	f.t.Helper()
	s = withUID(s)
	created, err := f.client.CoreV1().Secrets(s.Namespace).Create(f.ctx, s, metav1.CreateOptions{FieldManager: manager})
	must(f.t, err)
	f.refreshCaches()
	return created
}

// withUID is s with the UID the API server gives a Secret it creates (the fake gives none).
func withUID(s *corev1.Secret) *corev1.Secret {
	s = s.DeepCopy()
	if s.UID == "" {
		s.UID = types.UID("uid-created-" + s.Namespace + "-" + s.Name)
	}
	return s
}

func (f *fixture) updateJob(job *batchv1.Job) {
	f.t.Helper()
	_, err := f.client.BatchV1().Jobs(job.Namespace).Update(f.ctx, job, metav1.UpdateOptions{})
	must(f.t, err)
	f.refreshCaches()
}

func (f *fixture) updateSet(set *appsv1.StatefulSet) {
	f.t.Helper()
	_, err := f.client.AppsV1().StatefulSets(set.Namespace).Update(f.ctx, set, metav1.UpdateOptions{})
	must(f.t, err)
	f.refreshCaches()
}

func hasEvent(events []string, prefix string) bool {
	return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

// onlyAppliedByController checks that the controller's apply is the only writer of s.
func onlyAppliedByController(t *testing.T, s *corev1.Secret) {
	t.Helper()
	if len(s.ManagedFields) != 1 || s.ManagedFields[0].Manager != FieldManager || s.ManagedFields[0].Operation != metav1.ManagedFieldsOperationApply {
		t.Errorf("Secret managedFields = %+v, want one Apply entry of %s", s.ManagedFields, FieldManager)
	}
}

func TestSyncCreatesSecretAndService(t *testing.T) {
	job := makeJob("team-a", "mnist", 3).Obj()
	f := newFixture(t, job)

	result, writes := f.sync("team-a", "mnist")
	if result != resultSynced {
		t.Errorf("result = %s, want %s", result, resultSynced)
	}
	if want := []string{"apply secrets mnist-tf-config", "create services mnist"}; !slices.Equal(writes, want) {
		t.Errorf("writes = %v, want %v", writes, want)
	}

	s := f.secret("team-a", "mnist-tf-config")
	if got, want := string(s.Data[ClusterKey]), `{"worker":`+workers("team-a", "mnist", 3, 2222)+`}`; got != want {
		t.Errorf("cluster = %s, want %s", got, want)
	}
	if len(s.Data) != 1 {
		t.Errorf("Secret has keys %v, want only %q", keys(s.Data), ClusterKey)
	}
	if s.Labels[JobLabel] != "mnist" {
		t.Errorf("Secret labels = %v, want %s=mnist", s.Labels, JobLabel)
	}
	ref := metav1.GetControllerOf(s)
	if ref == nil || ref.UID != job.UID || ref.Kind != "Job" || ref.APIVersion != "batch/v1" || ref.BlockOwnerDeletion == nil || *ref.BlockOwnerDeletion {
		t.Errorf("Secret controller reference = %+v, want Job mnist %s without blockOwnerDeletion", ref, job.UID)
	}
	onlyAppliedByController(t, s)

	svc := f.service("team-a", "mnist")
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
		!maps.Equal(svc.Spec.Selector, map[string]string{batchv1.JobNameLabel: "mnist", batchv1.ControllerUidLabel: string(job.UID)}) {
		t.Errorf("Service spec = %+v, want headless, publishing not-ready addresses, selecting the pods of this Job mnist (name and UID)", svc.Spec)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != PortName || svc.Spec.Ports[0].Port != 2222 {
		t.Errorf("Service ports = %+v, want %s 2222", svc.Spec.Ports, PortName)
	}
	if !metav1.IsControlledBy(svc, job) {
		t.Errorf("Service is not controlled by the Job: %+v", svc.OwnerReferences)
	}
	events := f.drainEvents()
	if !hasEvent(events, "Normal "+ReasonSecretApplied) || !hasEvent(events, "Normal "+ReasonServiceCreated) {
		t.Errorf("events = %v, want %s and %s", events, ReasonSecretApplied, ReasonServiceCreated)
	}

	// Level-based: nothing changed. The Secret is applied again (the controller cannot read it to
	// compare), which changes nothing; the Service is left alone and no event is recorded.
	for range 2 {
		if result, writes := f.sync("team-a", "mnist"); result != resultSynced || !slices.Equal(writes, []string{"apply secrets mnist-tf-config"}) {
			t.Errorf("second sync: result %s, writes %v; want synced and only the Secret applied", result, writes)
		}
	}
	if again := f.secret("team-a", "mnist-tf-config"); again.UID != s.UID || string(again.Data[ClusterKey]) != string(s.Data[ClusterKey]) {
		t.Errorf("Secret changed on a sync without change: %+v", again)
	}
	if events := f.drainEvents(); len(events) != 0 {
		t.Errorf("second sync recorded %v, want nothing", events)
	}
}

func TestSyncPortAndSize(t *testing.T) {
	tests := []struct {
		name string
		job  *batchv1.Job
		want string
	}{
		{"one task", makeJob("ns", "a", 1).Obj(), `{"worker":["a-0.a.ns.svc:2222"]}`},
		{"custom port", makeJob("ns", "a", 2).ContainerPorts(tfjobPort(3333, "")).Obj(), `{"worker":["a-0.a.ns.svc:3333","a-1.a.ns.svc:3333"]}`},
		{"no tfjob-port: default port", makeJob("ns", "a", 1).ContainerPorts().Obj(), `{"worker":["a-0.a.ns.svc:2222"]}`},
		{"subdomain differs from name", makeJob("ns", "a", 1).Subdomain("net").Obj(), `{"worker":["a-0.net.ns.svc:2222"]}`},
		{"64 tasks", makeJob("ns", "a", 64).Obj(), `{"worker":` + workers("ns", "a", 64, 2222) + `}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.job)
			f.sync("ns", "a")
			if got := string(f.secret("ns", "a-tf-config").Data[ClusterKey]); got != tc.want {
				t.Errorf("cluster = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestSyncResize(t *testing.T) {
	w := makeJob("ns", "mnist", 3)
	f := newFixture(t, w.Obj())
	f.sync("ns", "mnist")
	before := f.secret("ns", "mnist-tf-config")
	f.drainEvents()

	f.updateJob(w.Resize(5).Obj())
	result, writes := f.sync("ns", "mnist")
	if result != resultSynced || !slices.Equal(writes, []string{"apply secrets mnist-tf-config"}) {
		t.Errorf("resize: result %s, writes %v; want synced and one Secret apply", result, writes)
	}
	after := f.secret("ns", "mnist-tf-config")
	if got, want := string(after.Data[ClusterKey]), `{"worker":`+workers("ns", "mnist", 5, 2222)+`}`; got != want {
		t.Errorf("cluster after resize = %s, want %s", got, want)
	}
	if after.UID != before.UID {
		t.Errorf("Secret was replaced (uid %s → %s), want it updated in place", before.UID, after.UID)
	}
	if events := f.drainEvents(); len(events) != 1 || !hasEvent(events, "Normal "+ReasonSecretUpdated) {
		t.Errorf("events = %v, want one %s", events, ReasonSecretUpdated)
	}

	// Parallelism alone changes (allowed by the API): the Job is reported, the Secret stays as it was.
	f.updateJob(w.Parallelism(2).Obj())
	if result, writes := f.sync("ns", "mnist"); result != resultInvalid || len(writes) != 0 {
		t.Errorf("parallelism != completions: result %s, writes %v; want invalid and none", result, writes)
	}
	if got := string(f.secret("ns", "mnist-tf-config").Data[ClusterKey]); !strings.Contains(got, "mnist-4.") {
		t.Errorf("Secret changed to %s, want the 5-task cluster kept", got)
	}
}

// TestSyncBadWorkloads: a Job or StatefulSet that cannot be one role of a TensorFlow cluster gets no
// writes and one Warning that says how to fix it; the operator reads it in the logs too.
func TestSyncBadWorkloads(t *testing.T) {
	job := func(w *testobj.JobWrapper) workload { return jobWorkload{w.Obj()} }
	set := func(w *testobj.StatefulSetWrapper) workload { return statefulSetWorkload{w.Obj()} }
	fromOrdinal1 := makeSet("ns", "bad", 2)
	fromOrdinal1.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: 1}
	tests := []struct {
		name   string
		w      workload
		reason string
		hint   string // part of the message that says how to fix it
	}{
		{"not indexed", job(makeJob("ns", "bad", 2).CompletionMode(batchv1.NonIndexedCompletion)), ReasonNotIndexed, "completionMode: Indexed"},
		{"parallelism != completions", job(makeJob("ns", "bad", 4).Parallelism(2)), ReasonParallelismMismatch, "set both"},
		{"no subdomain", job(makeJob("ns", "bad", 2).Subdomain("")), ReasonMissingSubdomain, "set it"},
		{"subdomain not a Service name", job(makeJob("ns", "bad", 2).Subdomain("9net")), ReasonInvalidName, "starting with a letter"},
		{"UDP port", job(makeJob("ns", "bad", 2).ContainerPorts(tfjobPort(2222, corev1.ProtocolUDP))), ReasonInvalidPort, "TCP"},
		{"port out of range", job(makeJob("ns", "bad", 2).ContainerPorts(tfjobPort(70000, ""))), ReasonInvalidPort, "1 to 65535"},
		{"unknown role", job(makeJob("ns", "bad", 2).Annotation(RoleAnnotation, "master")), ReasonInvalidRole, "chief, worker, ps, evaluator"},
		{"two chiefs", job(makeJob("ns", "bad", 2).Annotation(RoleAnnotation, string(RoleChief))), ReasonInvalidReplicas, "set spec.parallelism and spec.completions to 1"},
		{"zero tasks", job(makeJob("ns", "bad", 0)), ReasonInvalidReplicas, "at least 1"},
		{"hostname too long", job(makeJob("ns", strings.Repeat("x", 62), 11)), ReasonInvalidName, "shorter Job name"},

		{"no serviceName", set(makeSet("ns", "bad", 2).ServiceName("")), ReasonMissingServiceName, "re-create it with one"},
		{"serviceName not a Service name", set(makeSet("ns", "bad", 2).ServiceName("9net")), ReasonInvalidName, "serviceName \"9net\""},
		{"ordinals not from 0", set(fromOrdinal1), ReasonInvalidOrdinals, "remove spec.ordinals"},
		{"UDP port", set(makeSet("ns", "bad", 2).ContainerPorts(tfjobPort(2222, corev1.ProtocolUDP))), ReasonInvalidPort, "TCP"},
		{"two chiefs", set(makeSet("ns", "bad", 2).Annotation(RoleAnnotation, string(RoleChief))), ReasonInvalidReplicas, "set spec.replicas to 1"},
		{"hostname too long", set(makeSet("ns", strings.Repeat("x", 62), 11)), ReasonInvalidName, "shorter StatefulSet name"},
	}
	for _, tc := range tests {
		t.Run(string(tc.w.kind())+"/"+tc.name, func(t *testing.T) {
			f := newFixture(t, tc.w.object())
			result, writes := f.syncKey(keyOf(tc.w))
			if result != resultInvalid || len(writes) != 0 {
				t.Errorf("result %s, writes %v; want invalid and no writes", result, writes)
			}
			events := f.drainEvents()
			if len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+tc.reason+" ") || !strings.Contains(events[0], tc.hint) {
				t.Errorf("events = %q, want one Warning %s saying %q", events, tc.reason, tc.hint)
			}
			if logs := f.logs(); !strings.Contains(logs, "Cannot be served") || !strings.Contains(logs, tc.reason) {
				t.Errorf("logs = %s, want a line saying the %s cannot be served, with reason %s", logs, tc.w.kind(), tc.reason)
			}
		})
	}
}

func TestSyncStatefulSet(t *testing.T) {
	set := makeSet("ns", "tf", 3).ServiceName("peers").ContainerPorts(tfjobPort(3333, ""))
	f := newFixture(t, set.Obj())

	result, writes := f.syncSet("ns", "tf")
	if want := []string{"apply secrets tf-tf-config", "create services peers"}; result != resultSynced || !slices.Equal(writes, want) {
		t.Errorf("result %s, writes %v; want synced, %v", result, writes, want)
	}
	s := f.secret("ns", "tf-tf-config")
	if got, want := string(s.Data[ClusterKey]), `{"worker":`+addrs("ns", "tf", "peers", 3, 3333)+`}`; got != want {
		t.Errorf("cluster = %s, want %s", got, want)
	}
	ref := metav1.GetControllerOf(s)
	if ref == nil || ref.Kind != "StatefulSet" || ref.APIVersion != "apps/v1" || ref.Name != "tf" || ref.UID != set.Obj().UID || *ref.BlockOwnerDeletion {
		t.Errorf("Secret controller reference = %+v, want StatefulSet tf %s without blockOwnerDeletion", ref, set.Obj().UID)
	}
	if s.Labels[JobLabel] != "tf" {
		t.Errorf("Secret labels = %v, want %s=tf", s.Labels, JobLabel)
	}
	svc := f.service("ns", "peers")
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
		!slices.Equal(keys(svc.Spec.Selector), []string{"app"}) || svc.Spec.Selector["app"] != "tf" ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 3333 || !metav1.IsControlledBy(svc, set) {
		t.Errorf("Service = %+v (owners %+v), want headless, publishing not-ready addresses, selecting app=tf on port 3333, controlled by the StatefulSet",
			svc.Spec, svc.OwnerReferences)
	}
	if events := f.drainEvents(); !hasEvent(events, "Normal "+ReasonSecretApplied) || !hasEvent(events, "Normal "+ReasonServiceCreated) {
		t.Errorf("events = %v, want %s and %s", events, ReasonSecretApplied, ReasonServiceCreated)
	}

	for _, n := range []int32{5, 2} {
		f.updateSet(set.Scale(n).Obj())
		if result, writes := f.syncSet("ns", "tf"); result != resultSynced || !slices.Equal(writes, []string{"apply secrets tf-tf-config"}) {
			t.Errorf("scale to %d: result %s, writes %v; want synced, the Secret applied", n, result, writes)
		}
		if got, want := string(f.secret("ns", "tf-tf-config").Data[ClusterKey]), `{"worker":`+addrs("ns", "tf", "peers", int(n), 3333)+`}`; got != want {
			t.Errorf("scale to %d: cluster = %s, want %s", n, got, want)
		}
		if events := f.drainEvents(); !hasEvent(events, "Normal "+ReasonSecretUpdated) {
			t.Errorf("scale to %d: events = %v, want %s", n, events, ReasonSecretUpdated)
		}
	}

	// Scaled to zero: no pod needs the Secret, which is kept for the scale-up.
	f.updateSet(set.Scale(0).Obj())
	if result, writes := f.syncSet("ns", "tf"); result != resultWaiting || len(writes) != 0 {
		t.Errorf("scale to 0: result %s, writes %v; want waiting and no writes", result, writes)
	}
	if events := f.drainEvents(); len(events) != 1 || !strings.HasPrefix(events[0], "Normal "+ReasonScaledToZero) {
		t.Errorf("scale to 0: events = %v, want one Normal %s", events, ReasonScaledToZero)
	}
	if got := string(f.secret("ns", "tf-tf-config").Data[ClusterKey]); got != `{"worker":`+addrs("ns", "tf", "peers", 2, 3333)+`}` {
		t.Errorf("scale to 0: cluster = %s, want the 2-task cluster kept", got)
	}
}

func TestStatefulSetServiceSelector(t *testing.T) {
	set := makeSet("ns", "tf", 2)
	set.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"tf"}}}}
	set.Spec.Template.Labels = map[string]string{"app": "tf", "tier": "train"}
	f := newFixture(t, set.Obj())
	f.syncSet("ns", "tf")
	if got := f.service("ns", "tf").Spec.Selector; len(got) != 2 || got["app"] != "tf" || got["tier"] != "train" {
		t.Errorf("Service selector = %v, want the template's labels when the StatefulSet selects by expressions", got)
	}
}

// A Job's Service selects its pods by the Job's name and UID, so the pods of an earlier Job of the same
// name (orphaned, or still terminating) do not answer for the new one's hostnames; a Job with a manual
// selector has no UID label on its pods, and its Service selects by name.
func TestJobServiceSelector(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		want map[string]string
	}{
		{"the API server's labels", makeJob("ns", "tf", 2).Obj(),
			map[string]string{batchv1.JobNameLabel: "tf", batchv1.ControllerUidLabel: "uid-ns-tf"}},
		{"a manual selector", func() *batchv1.Job {
			j := makeJob("ns", "tf", 2).Obj()
			delete(j.Spec.Template.Labels, batchv1.ControllerUidLabel)
			return j
		}(), map[string]string{batchv1.JobNameLabel: "tf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.job)
			f.sync("ns", "tf")
			if got := f.service("ns", "tf").Spec.Selector; !maps.Equal(got, tc.want) {
				t.Errorf("Service selector = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSyncForeignSecret: whatever is under the Secret's name and was not made by the controller is
// left as it was, with a SecretConflict event, and the controller never reads it.
func TestSyncForeignSecret(t *testing.T) {
	const want = `{"worker":["mnist-0.mnist.ns.svc:2222","mnist-1.mnist.ns.svc:2222"]}`
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mnist-tf-config"}, Type: corev1.SecretTypeOpaque}
		for k, v := range data {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			s.Data[k] = []byte(v)
		}
		return s
	}
	controlledByConfigMap := secret(map[string]string{ClusterKey: want})
	controlledByConfigMap.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u", Controller: ptrTrue()}}
	giveBack := []string{"apply secrets mnist-tf-config"}

	tests := []struct {
		name       string
		foreign    *corev1.Secret
		wantWrites []string
		why        string // in the event
	}{
		// The dry run would change a field another manager set: a conflict, nothing written.
		{"its own cluster key", secret(map[string]string{ClusterKey: "written by hand"}), nil, `conflict with "kubectl-create"`},
		// The dry run would merge into these; its response says whose they are, and the controller
		// gives back whatever of its own is in them (here nothing: the apply changes nothing).
		{"no cluster key", secret(map[string]string{"password": "hunter2"}), giveBack, `holds the key "password"`},
		{"the same cluster", secret(map[string]string{ClusterKey: want}), giveBack, `"kubectl-create" wrote its data`},
		{"empty", secret(nil), giveBack, `"kubectl-create" wrote its type`},
		{"controlled by another object", controlledByConfigMap, giveBack, "not controlled by Job mnist"},
		// Made between the dry run and the apply: the apply merges into it, and the controller
		// gives back what it added.
		{"made after the dry run", nil, []string{"apply secrets mnist-tf-config", "apply secrets mnist-tf-config"}, `"kubectl-create" wrote its data`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, makeJob("ns", "mnist", 2).Obj())
			var before *corev1.Secret
			if tc.foreign != nil {
				before = f.createSecret(tc.foreign, "kubectl-create")
			} else {
				// The user's Secret arrives right after the controller's dry run.
				f.beforeFirstSecretWrite(func(tracker k8stesting.ObjectTracker) {
					before = createByTracker(t, tracker, secret(map[string]string{ClusterKey: want}))
				})
			}

			result, writes := f.sync("ns", "mnist")
			if result != resultConflict {
				t.Errorf("result = %s, want %s", result, resultConflict)
			}
			// The Service does not depend on the Secret and is still made.
			if wantWrites := append(tc.wantWrites, "create services mnist"); !slices.Equal(writes, wantWrites) {
				t.Errorf("writes = %v, want %v", writes, wantWrites)
			}
			after := f.secret("ns", "mnist-tf-config")
			if !maps.EqualFunc(after.Data, before.Data, bytes.Equal) || !maps.Equal(after.Labels, before.Labels) || len(after.OwnerReferences) != len(before.OwnerReferences) {
				t.Errorf("foreign Secret changed: data %q labels %v owners %+v; was data %q labels %v owners %+v",
					after.Data, after.Labels, after.OwnerReferences, before.Data, before.Labels, before.OwnerReferences)
			}
			for _, e := range after.ManagedFields {
				if e.Manager == FieldManager {
					t.Errorf("the controller still owns fields of the foreign Secret: %s", e.FieldsV1.Raw)
				}
			}
			events := f.drainEvents()
			if !hasEvent(events, "Warning "+ReasonSecretConflict) || !strings.Contains(strings.Join(events, "\n"), tc.why) {
				t.Errorf("events = %v, want %s saying %q", events, ReasonSecretConflict, tc.why)
			}
			if f.c.queue.Len() != 0 {
				t.Errorf("conflict recheck should be delayed, queue has %d items now", f.c.queue.Len())
			}
			// Not the controller's, so never deleted with the Job.
			if _, ok := f.c.appliedSecretOf(gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "mnist"}); ok {
				t.Errorf("the controller remembers the foreign Secret as its own")
			}

			// Once the user deletes it, the controller writes its own.
			must(t, f.client.CoreV1().Secrets("ns").Delete(f.ctx, "mnist-tf-config", metav1.DeleteOptions{}))
			if result, _ := f.sync("ns", "mnist"); result != resultSynced {
				t.Errorf("after the foreign Secret was deleted: result %s, want synced", result)
			}
			if got := f.secret("ns", "mnist-tf-config"); string(got.Data[ClusterKey]) != want {
				t.Errorf("cluster = %s, want %s", got.Data[ClusterKey], want)
			}
		})
	}
}

// createByTracker makes s as kubectl would, from inside a reactor, and returns it as stored.
func createByTracker(t *testing.T, tracker k8stesting.ObjectTracker, s *corev1.Secret) *corev1.Secret {
	t.Helper()
	must(t, tracker.Create(secretsResource, withUID(s), s.Namespace, metav1.CreateOptions{FieldManager: "kubectl-create"}))
	obj, err := tracker.Get(secretsResource, s.Namespace, s.Name)
	must(t, err)
	return obj.(*corev1.Secret).DeepCopy()
}

// The user makes their Secret between the controller's dry run and its apply, which merges into it,
// and giving the fields back fails once: the next sync gives them back. The user's Secret ends as they
// made it, with nothing of the controller's, not even an owner reference through which the garbage
// collector would delete it with the Job.
func TestSyncGivesBackAForeignSecretAfterAFailedGiveBack(t *testing.T) {
	f := newFixture(t, makeJob("ns", "mnist", 2).Obj())
	var users *corev1.Secret
	f.beforeFirstSecretWrite(func(tracker k8stesting.ObjectTracker) {
		users = createByTracker(t, tracker, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mnist-tf-config"},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter2")}})
	})
	failed := false
	f.client.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p, ok := a.(k8stesting.PatchAction); ok && !isDryRun(a) && !failed && !bytes.Contains(p.GetPatch(), []byte(ClusterKey)) {
			failed = true
			return true, nil, apierrors.NewInternalError(errors.New("etcd is slow"))
		}
		return false, nil, nil
	})
	if _, err := f.c.sync(f.ctx, gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "mnist"}); err == nil || !failed {
		t.Fatalf("sync with the give-back failing: %v (failed: %v), want the error", err, failed)
	}
	if merged := f.secret("ns", "mnist-tf-config"); len(merged.OwnerReferences) == 0 {
		t.Fatalf("the apply did not merge into the user's Secret (owners %+v): nothing to give back", merged.OwnerReferences)
	}
	f.refreshCaches()
	if result, _ := f.sync("ns", "mnist"); result != resultConflict {
		t.Errorf("result = %s, want %s", result, resultConflict)
	}
	after := f.secret("ns", "mnist-tf-config")
	if !maps.EqualFunc(after.Data, users.Data, bytes.Equal) || len(after.Labels) != 0 || len(after.OwnerReferences) != 0 {
		t.Errorf("the user's Secret: data %q labels %v owners %+v; want data %q and nothing of the controller's", after.Data, after.Labels, after.OwnerReferences, users.Data)
	}
	for _, e := range after.ManagedFields {
		if e.Manager == FieldManager {
			t.Errorf("the controller still owns fields of the user's Secret: %s", e.FieldsV1.Raw)
		}
	}
}

// The user deletes their Secret between the controller's dry run, which finds it foreign, and the
// give-back. An apply makes what is missing, so a give-back without the Secret's UID would make an
// empty Secret under the Job's Secret name, foreign to the controller for good; with it, the give-back
// makes nothing, and the next sync writes the controller's Secret.
func TestSyncForeignSecretDeletedBeforeItsGiveBack(t *testing.T) {
	f := newFixture(t, makeJob("ns", "mnist", 2).Obj())
	f.createSecret(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mnist-tf-config"},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("hunter2")}}, "kubectl-create")
	f.beforeFirstSecretWrite(func(tracker k8stesting.ObjectTracker) {
		must(t, tracker.Delete(secretsResource, "ns", "mnist-tf-config"))
	})
	if result, writes := f.sync("ns", "mnist"); result != resultConflict || !slices.Contains(writes, "apply secrets mnist-tf-config") {
		t.Errorf("result %s, writes %v; want %s after a give-back", result, writes, resultConflict)
	}
	f.secretAbsent("ns", "mnist-tf-config")
	if result, _ := f.sync("ns", "mnist"); result != resultSynced {
		t.Errorf("after the foreign Secret was deleted: result %s, want synced", result)
	}
	const want = `{"worker":["mnist-0.mnist.ns.svc:2222","mnist-1.mnist.ns.svc:2222"]}`
	if got := f.secret("ns", "mnist-tf-config"); string(got.Data[ClusterKey]) != want {
		t.Errorf("cluster = %s, want %s", got.Data[ClusterKey], want)
	}
}

// A Secret the controller wrote by update (before it used server-side apply) is still its own: the
// apply takes its fields over, even when the cluster changed.
func TestSyncTakesOverSecretWrittenByUpdate(t *testing.T) {
	job := makeJob("ns", "mnist", 3).Obj()
	f := newFixture(t, job)
	old := desiredSecretByUpdate(jobWorkload{job}, []byte(`{"worker":["old"]}`))
	f.createSecret(old, FieldManager)

	if result, writes := f.sync("ns", "mnist"); result != resultSynced || !slices.Equal(writes, []string{"apply secrets mnist-tf-config", "apply secrets mnist-tf-config", "create services mnist"}) {
		t.Errorf("result %s, writes %v; want synced after a forced second apply", result, writes)
	}
	s := f.secret("ns", "mnist-tf-config")
	if got, want := string(s.Data[ClusterKey]), `{"worker":`+workers("ns", "mnist", 3, 2222)+`}`; got != want {
		t.Errorf("cluster = %s, want %s", got, want)
	}
}

// desiredSecretByUpdate is the Secret as versions before server-side apply created it.
func desiredSecretByUpdate(w workload, cluster []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            SecretName(w.GetName()),
			Namespace:       w.GetNamespace(),
			Labels:          ownedLabels(w),
			OwnerReferences: []metav1.OwnerReference{controllerRef(w)},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{ClusterKey: cluster},
	}
}

func ptrTrue() *bool { b := true; return &b }

func TestSyncForeignService(t *testing.T) {
	tests := []struct {
		name      string
		svc       *corev1.Service
		wantEvent bool
	}{
		{"headless, selecting the Job's pods", makeService("ns", "mnist", true, map[string]string{batchv1.JobNameLabel: "mnist"}), false},
		{"headless, selecting by a template label", makeService("ns", "mnist", true, map[string]string{batchv1.ControllerUidLabel: "uid-ns-mnist"}), false},
		{"not headless", makeService("ns", "mnist", false, map[string]string{batchv1.JobNameLabel: "mnist"}), true},
		{"selecting another Job", makeService("ns", "mnist", true, map[string]string{batchv1.JobNameLabel: "other"}), true},
		{"no selector", makeService("ns", "mnist", true, nil), true},
		// A Service is the controller's only by its label, as for the admission policy: controlled by the
		// Job is not enough, so a stale one is reported rather than updated.
		{"controlled by the Job, unlabelled, serving", unlabelled(desiredService(jobWorkload{makeJob("ns", "mnist", 2).Obj()}, TaskSet{Subdomain: "mnist", Port: 2222})), false},
		{"controlled by the Job, unlabelled, selecting other pods", func() *corev1.Service {
			s := unlabelled(desiredService(jobWorkload{makeJob("ns", "mnist", 2).Obj()}, TaskSet{Subdomain: "mnist", Port: 2222}))
			s.Spec.Selector = map[string]string{batchv1.JobNameLabel: "other"}
			return s
		}(), true},
		// Labelled, but a Service cannot be made headless, and the policy refuses the controller any
		// Service that is not: reported, never updated.
		{"labelled, not headless", func() *corev1.Service {
			s := desiredService(jobWorkload{makeJob("ns", "mnist", 2).Obj()}, TaskSet{Subdomain: "mnist", Port: 2222})
			s.Spec.ClusterIP = "10.0.0.1"
			s.Spec.PublishNotReadyAddresses = false
			return s
		}(), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, makeJob("ns", "mnist", 2).Obj(), tc.svc)
			result, writes := f.sync("ns", "mnist")
			if !slices.Equal(writes, []string{"apply secrets mnist-tf-config"}) {
				t.Errorf("writes = %v, want the Secret applied and the Service left alone", writes)
			}
			events := f.drainEvents()
			if got := hasEvent(events, "Warning "+ReasonServiceConflict); got != tc.wantEvent {
				t.Errorf("events = %v, want a %s event: %v", events, ReasonServiceConflict, tc.wantEvent)
			}
			if wantResult := map[bool]string{true: resultConflict, false: resultSynced}[tc.wantEvent]; result != wantResult {
				t.Errorf("result = %s, want %s", result, wantResult)
			}
		})
	}

	setTests := []struct {
		name      string
		svc       *corev1.Service
		wantEvent bool
	}{
		{"headless, selecting the pods", makeService("ns", "tf", true, map[string]string{"app": "tf"}), false},
		{"not headless", makeService("ns", "tf", false, map[string]string{"app": "tf"}), true},
		{"selecting other pods", makeService("ns", "tf", true, map[string]string{"app": "web"}), true},
		{"controlled by a Job of that name", func() *corev1.Service {
			s := desiredService(jobWorkload{makeJob("ns", "tf", 2).Obj()}, TaskSet{Subdomain: "tf", Port: 2222})
			s.Spec.ClusterIP = corev1.ClusterIPNone
			return s
		}(), true},
	}
	for _, tc := range setTests {
		t.Run("StatefulSet: "+tc.name, func(t *testing.T) {
			f := newFixture(t, makeSet("ns", "tf", 2).Obj(), tc.svc)
			before := f.service("ns", "tf")
			result, writes := f.syncSet("ns", "tf")
			if !slices.Equal(writes, []string{"apply secrets tf-tf-config"}) {
				t.Errorf("writes = %v, want the Secret applied and the Service left alone", writes)
			}
			if after := f.service("ns", "tf"); !maps.Equal(after.Spec.Selector, before.Spec.Selector) || after.Spec.ClusterIP != before.Spec.ClusterIP {
				t.Errorf("foreign Service changed: %+v", after.Spec)
			}
			events := f.drainEvents()
			if got := hasEvent(events, "Warning "+ReasonServiceConflict); got != tc.wantEvent {
				t.Errorf("events = %v, want a %s event: %v", events, ReasonServiceConflict, tc.wantEvent)
			}
			if wantResult := map[bool]string{true: resultConflict, false: resultSynced}[tc.wantEvent]; result != wantResult {
				t.Errorf("result = %s, want %s", result, wantResult)
			}
		})
	}
}

// unlabelled removes the controller's labels from s.
func unlabelled(s *corev1.Service) *corev1.Service {
	s.Labels = nil
	return s
}

// TestSyncOwnServiceDrift: the controller puts its own (labelled) Service back as it wants it, external
// IPs someone added included, which the admission policy would not let it keep.
func TestSyncOwnServiceDrift(t *testing.T) {
	w := jobWorkload{makeJob("ns", "mnist", 2).Obj()}
	drifted := desiredService(w, TaskSet{Subdomain: "mnist", Port: 2222})
	drifted.Spec.ExternalIPs = []string{"192.0.2.10"}
	drifted.Spec.Ports[0].Port = 80
	f := newFixture(t, w.Job, drifted)
	result, writes := f.sync("ns", "mnist")
	if result != resultSynced || !slices.Equal(writes, []string{"apply secrets mnist-tf-config", "update services mnist"}) {
		t.Errorf("result %s, writes %v; want the Secret applied and the Service updated", result, writes)
	}
	got := f.service("ns", "mnist")
	if len(got.Spec.ExternalIPs) != 0 || got.Spec.Ports[0].Port != 2222 || got.Labels[JobLabel] != "mnist" || got.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service = %+v, labels %v; want headless, labelled, port 2222, no external IPs", got.Spec, got.Labels)
	}
	if result, writes := f.sync("ns", "mnist"); result != resultSynced || len(writes) != 1 {
		t.Errorf("second sync: result %s, writes %v; want only the (no-op) apply", result, writes)
	}
}

func TestSyncAdoptsObjectsOfEarlierJobOfSameName(t *testing.T) {
	// A Job deleted with orphan propagation while the controller was down, then re-created.
	old := jobWorkload{makeJob("ns", "mnist", 2).UID("old-uid").Obj()}
	staleSvc := desiredService(old, TaskSet{Subdomain: "mnist", Port: 2222})
	f := newFixture(t, makeJob("ns", "mnist", 3).Obj(), staleSvc, makeJob("ns", "b", 1).UID("new-b").Obj())
	// The old Job's Secret, applied by the controller.
	_, err := f.client.CoreV1().Secrets("ns").Apply(f.ctx, secretApply(old, []byte(`{"worker":["stale"]}`)), metav1.ApplyOptions{FieldManager: FieldManager})
	must(t, err)
	// b's Secret, orphaned: the garbage collector removed the owner reference by update.
	oldB := jobWorkload{makeJob("ns", "b", 1).UID("old-b").Obj()}
	stripped, err := f.client.CoreV1().Secrets("ns").Apply(f.ctx, secretApply(oldB, []byte("x")), metav1.ApplyOptions{FieldManager: FieldManager})
	must(t, err)
	stripped.OwnerReferences = nil
	_, err = f.client.CoreV1().Secrets("ns").Update(f.ctx, stripped, metav1.UpdateOptions{FieldManager: "generic-garbage-collector"})
	must(t, err)
	f.refreshCaches()

	if result, writes := f.sync("ns", "mnist"); result != resultSynced ||
		!slices.Equal(writes, []string{"apply secrets mnist-tf-config", "update services mnist"}) {
		t.Errorf("result %s, writes %v; want the Secret applied and the Service updated", result, writes)
	}
	s := f.secret("ns", "mnist-tf-config")
	if ref := metav1.GetControllerOf(s); ref == nil || ref.UID != "uid-ns-mnist" || len(s.OwnerReferences) != 1 {
		t.Errorf("owner references = %+v, want only the new Job", s.OwnerReferences)
	}
	if got, want := string(s.Data[ClusterKey]), `{"worker":`+workers("ns", "mnist", 3, 2222)+`}`; got != want {
		t.Errorf("cluster = %s, want %s", got, want)
	}
	if ref := metav1.GetControllerOf(f.service("ns", "mnist")); ref == nil || ref.UID != "uid-ns-mnist" {
		t.Errorf("Service controller = %+v, want the new Job", ref)
	}

	if result, writes := f.sync("ns", "b"); result != resultSynced || !slices.Equal(writes, []string{"apply secrets b-tf-config", "create services b"}) {
		t.Errorf("orphaned Secret: result %s, writes %v; want it adopted", result, writes)
	}
	if ref := metav1.GetControllerOf(f.secret("ns", "b-tf-config")); ref == nil || ref.UID != "new-b" {
		t.Errorf("orphaned Secret controller = %+v, want Job b", ref)
	}
}

func TestSyncCleanup(t *testing.T) {
	const ns = "ns"
	w := makeJob(ns, "mnist", 2)
	foreignLabelled := makeService(ns, "keep", true, nil)
	foreignLabelled.Labels = map[string]string{JobLabel: "mnist"}
	foreignLabelled.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u", Controller: ptrTrue()}}
	// synced is a fixture where the controller has made the Job's Secret and Service.
	synced := func(t *testing.T) *fixture {
		f := newFixture(t, w.Obj(), foreignLabelled, makeSecret(ns, "unrelated", "x"))
		if result, _ := f.sync(ns, "mnist"); result != resultSynced {
			t.Fatalf("first sync: %s", result)
		}
		return f
	}
	wantDeleted := []string{"delete secrets mnist-tf-config", "delete services mnist"}

	t.Run("Job gone", func(t *testing.T) {
		f := synced(t)
		must(t, f.client.BatchV1().Jobs(ns).Delete(f.ctx, "mnist", metav1.DeleteOptions{}))
		f.refreshCaches()
		if result, writes := f.sync(ns, "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
		f.secretAbsent(ns, "mnist-tf-config")
		f.service(ns, "keep")
		f.secret(ns, "unrelated")
		if result, writes := f.sync(ns, "mnist"); result != resultCleaned || len(writes) != 0 {
			t.Errorf("second cleanup: result %s, writes %v; want nothing to do", result, writes)
		}
	})
	t.Run("Job being deleted (orphan propagation, no garbage collector)", func(t *testing.T) {
		f := synced(t)
		f.updateJob(makeJob(ns, "mnist", 2).Deleting().Obj())
		if result, writes := f.sync(ns, "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
	})
	t.Run("opt-in label removed", func(t *testing.T) {
		f := synced(t)
		optedOut := makeJob(ns, "mnist", 2).Obj()
		delete(optedOut.Labels, OptInLabel)
		f.updateJob(optedOut)
		if result, writes := f.sync(ns, "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
	})
	t.Run("another Secret under the name since", func(t *testing.T) {
		f := synced(t)
		// The user replaced the controller's Secret with their own.
		must(t, f.client.CoreV1().Secrets(ns).Delete(f.ctx, "mnist-tf-config", metav1.DeleteOptions{}))
		mine := makeSecret(ns, "mnist-tf-config", "mine")
		mine.UID = "uid-users"
		f.createSecret(mine, "kubectl-create")
		must(t, f.client.BatchV1().Jobs(ns).Delete(f.ctx, "mnist", metav1.DeleteOptions{}))
		f.refreshCaches()
		if result, _ := f.sync(ns, "mnist"); result != resultCleaned {
			t.Errorf("result %s, want cleaned", result)
		}
		if got := f.secret(ns, "mnist-tf-config"); string(got.Data[ClusterKey]) != "mine" {
			t.Errorf("the user's Secret was touched: %+v", got)
		}
	})
	t.Run("Secret made by an earlier controller instance", func(t *testing.T) {
		f := synced(t)
		must(t, f.client.BatchV1().Jobs(ns).Delete(f.ctx, "mnist", metav1.DeleteOptions{}))
		// A new instance knows nothing about the Secret: it leaves it to the garbage collector, which
		// deletes it through its owner reference.
		f.c = NewController(f.client, WithEventRecorder(f.events))
		f.refreshCaches()
		if result, writes := f.sync(ns, "mnist"); result != resultCleaned || !slices.Equal(writes, []string{"delete services mnist"}) {
			t.Errorf("result %s, writes %v; want cleaned, only the Service deleted", result, writes)
		}
		if ref := metav1.GetControllerOf(f.secret(ns, "mnist-tf-config")); ref == nil || ref.UID != w.Obj().UID {
			t.Errorf("Secret left without its owner reference for the garbage collector: %+v", ref)
		}
	})
	t.Run("cache behind the API server", func(t *testing.T) {
		f := synced(t)
		// The cache lost the Job but the API server has it: nothing may be deleted.
		must(t, f.c.jobIndexer.Replace(nil, ""))
		result, err := f.c.sync(f.ctx, gang.Key{Kind: gang.KindJob, Namespace: ns, Name: "mnist"})
		if err == nil || result != resultError {
			t.Errorf("sync = %s, %v; want an error so the key is retried", result, err)
		}
		if writes := writesOf(f.client.Actions()); len(writes) != 0 {
			t.Errorf("writes = %v, want none", writes)
		}
	})
	t.Run("StatefulSet deleted", func(t *testing.T) {
		f := newFixture(t, makeSet(ns, "tf", 2).Obj(), makeJob(ns, "tf2", 1).Subdomain("tf2").Obj())
		f.syncSet(ns, "tf")
		must(t, f.client.AppsV1().StatefulSets(ns).Delete(f.ctx, "tf", metav1.DeleteOptions{}))
		f.refreshCaches()
		if result, writes := f.syncSet(ns, "tf"); result != resultCleaned || !slices.Equal(writes, []string{"delete secrets tf-tf-config", "delete services tf"}) {
			t.Errorf("result %s, writes %v; want the StatefulSet's Secret and Service deleted", result, writes)
		}
	})
}

// TestSyncNamesakes: a Job and a StatefulSet of the same name would share the Secret name; the one
// created first keeps it, the other waits with a Warning.
func TestSyncNamesakes(t *testing.T) {
	const ns = "ns"
	early, late := metav1.NewTime(time.Unix(1000, 0)), metav1.NewTime(time.Unix(2000, 0))
	for _, tc := range []struct {
		name        string
		job, set    metav1.Time
		winner      gang.Key
		loser       gang.Key
		loserReason string
	}{
		{"Job first", early, late, gang.Key{Kind: gang.KindJob, Namespace: ns, Name: "tf"}, gang.Key{Kind: gang.KindStatefulSet, Namespace: ns, Name: "tf"}, "Job tf was created first"},
		{"StatefulSet first", late, early, gang.Key{Kind: gang.KindStatefulSet, Namespace: ns, Name: "tf"}, gang.Key{Kind: gang.KindJob, Namespace: ns, Name: "tf"}, "StatefulSet tf was created first"},
		{"same second: the Job", early, early, gang.Key{Kind: gang.KindJob, Namespace: ns, Name: "tf"}, gang.Key{Kind: gang.KindStatefulSet, Namespace: ns, Name: "tf"}, "Job tf was created first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := makeJob(ns, "tf", 2).Subdomain("tf-job").Created(tc.job.Time).Obj()
			set := makeSet(ns, "tf", 3).ServiceName("tf-set").Created(tc.set.Time).Obj()
			f := newFixture(t, job, set)
			if result, writes := f.syncKey(tc.loser); result != resultConflict || len(writes) != 0 {
				t.Errorf("loser: result %s, writes %v; want conflict and no writes", result, writes)
			}
			if events := f.drainEvents(); len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+ReasonSecretConflict) || !strings.Contains(events[0], tc.loserReason) {
				t.Errorf("loser: events %v, want a %s saying %q", events, ReasonSecretConflict, tc.loserReason)
			}
			if result, _ := f.syncKey(tc.winner); result != resultSynced {
				t.Errorf("winner: result %s, want synced", result)
			}
			if ref := metav1.GetControllerOf(f.secret(ns, "tf-tf-config")); ref == nil || ref.Kind != string(tc.winner.Kind) {
				t.Errorf("Secret controller = %+v, want the %s", ref, tc.winner.Kind)
			}

			// The winner goes: its Secret is deleted, and the loser's next reconcile takes the name.
			if tc.winner.Kind == gang.KindJob {
				must(t, f.client.BatchV1().Jobs(ns).Delete(f.ctx, "tf", metav1.DeleteOptions{}))
			} else {
				must(t, f.client.AppsV1().StatefulSets(ns).Delete(f.ctx, "tf", metav1.DeleteOptions{}))
			}
			f.refreshCaches()
			f.syncKey(tc.winner)
			if result, _ := f.syncKey(tc.loser); result != resultSynced {
				t.Errorf("loser after the winner left: result %s, want synced", result)
			}
			if ref := metav1.GetControllerOf(f.secret(ns, "tf-tf-config")); ref == nil || ref.Kind != string(tc.loser.Kind) {
				t.Errorf("Secret controller = %+v, want the %s", ref, tc.loser.Kind)
			}
		})
	}
}

func TestSyncGroup(t *testing.T) {
	const ns = "ns"
	chief := makeJob(ns, "c", 1).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RoleChief))
	ps := makeJob(ns, "p", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).ContainerPorts(tfjobPort(2223, ""))
	worker := makeJob(ns, "w", 3).Label(GroupLabel, "g") // role defaults to worker
	eval := makeJob(ns, "e", 1).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RoleEvaluator)).Subdomain("")
	const want = `{"chief":["c-0.c.ns.svc:2222"],"ps":["p-0.p.ns.svc:2223","p-1.p.ns.svc:2223"],"worker":["w-0.w.ns.svc:2222","w-1.w.ns.svc:2222","w-2.w.ns.svc:2222"]}`

	t.Run("every member gets the whole cluster", func(t *testing.T) {
		f := newFixture(t, chief.Obj(), ps.Obj(), worker.Obj(), eval.Obj(), makeJob(ns, "solo", 1).Obj())
		for _, name := range []string{"c", "p", "w", "e"} {
			if result, _ := f.sync(ns, name); result != resultSynced {
				t.Errorf("%s: result %s, want synced; events %v", name, result, f.drainEvents())
			}
			s := f.secret(ns, name+"-tf-config")
			if got := string(s.Data[ClusterKey]); got != want {
				t.Errorf("%s: cluster = %s, want %s", name, got, want)
			}
			if s.Labels[GroupLabel] != "g" {
				t.Errorf("%s: Secret labels %v, want %s=g", name, s.Labels, GroupLabel)
			}
		}
		// The evaluator is not in the cluster and gets no Service.
		f.serviceAbsent(ns, "e")
		for _, name := range []string{"c", "p", "w"} {
			f.service(ns, name)
		}
	})

	t.Run("a StatefulSet member", func(t *testing.T) {
		// Parameter servers as a StatefulSet, which outlives the Jobs that train against it.
		psSet := makeSet(ns, "p", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).ContainerPorts(tfjobPort(2223, "")).ServiceName("p")
		f := newFixture(t, chief.Obj(), psSet.Obj(), worker.Obj())
		for _, key := range []gang.Key{{Kind: gang.KindJob, Namespace: ns, Name: "c"}, {Kind: gang.KindStatefulSet, Namespace: ns, Name: "p"}, {Kind: gang.KindJob, Namespace: ns, Name: "w"}} {
			if result, _ := f.syncKey(key); result != resultSynced {
				t.Errorf("%s: result %s, want synced; events %v", itemName(key), result, f.drainEvents())
			}
			if got := string(f.secret(ns, key.Name+"-tf-config").Data[ClusterKey]); got != want {
				t.Errorf("%s: cluster = %s, want %s", itemName(key), got, want)
			}
		}
		if sel := f.service(ns, "p").Spec.Selector; sel["app"] != "p" {
			t.Errorf("StatefulSet Service selector = %v, want app=p", sel)
		}
		// Scaling the StatefulSet changes every member's Secret.
		f.updateSet(psSet.Scale(3).Obj())
		for _, key := range []gang.Key{{Kind: gang.KindJob, Namespace: ns, Name: "c"}, {Kind: gang.KindStatefulSet, Namespace: ns, Name: "p"}} {
			f.syncKey(key)
			if got := string(f.secret(ns, key.Name+"-tf-config").Data[ClusterKey]); !strings.Contains(got, "p-2.p.ns.svc:2223") {
				t.Errorf("%s after scaling ps to 3: cluster = %s", itemName(key), got)
			}
		}
	})

	t.Run("waits for the roles it declares", func(t *testing.T) {
		c := makeJob(ns, "c", 1).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RoleChief)).Annotation(GroupRolesAnnotation, "worker, chief,ps")
		w := makeJob(ns, "w", 3).Label(GroupLabel, "g").Annotation(GroupRolesAnnotation, "chief,ps,worker")
		f := newFixture(t, c.Obj(), w.Obj())
		for _, name := range []string{"c", "w"} {
			if result, writes := f.sync(ns, name); result != resultWaiting || len(writes) != 0 {
				t.Errorf("%s: result %s, writes %v; want waiting and no writes", name, result, writes)
			}
		}
		if events := f.drainEvents(); !hasEvent(events, "Normal "+ReasonWaitingForGroup) || !strings.Contains(events[0], "[ps]") {
			t.Errorf("events = %v, want Normal %s naming the missing ps", events, ReasonWaitingForGroup)
		}
		p := makeJob(ns, "p", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).ContainerPorts(tfjobPort(2223, ""))
		if _, err := f.client.BatchV1().Jobs(ns).Create(f.ctx, p.Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.refreshCaches()
		for _, name := range []string{"c", "w", "p"} {
			if result, _ := f.sync(ns, name); result != resultSynced {
				t.Errorf("%s: result %s, want synced", name, result)
			}
			if got := string(f.secret(ns, name+"-tf-config").Data[ClusterKey]); got != want {
				t.Errorf("%s: cluster = %s, want %s", name, got, want)
			}
		}
	})

	badGroups := []struct {
		name   string
		objs   []runtime.Object
		reason string
		hint   string
	}{
		{"two workers", []runtime.Object{worker.Obj(), makeJob(ns, "w2", 2).Label(GroupLabel, "g").Obj()}, ReasonInvalidGroup, "both have role worker"},
		{"a Job and a StatefulSet with one role", []runtime.Object{worker.Obj(), makeSet(ns, "w2", 2).Label(GroupLabel, "g").Obj()}, ReasonInvalidGroup, `Job "w" and StatefulSet "w2" both have role worker`},
		{"bad sibling", []runtime.Object{worker.Obj(), makeJob(ns, "p2", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).CompletionMode(batchv1.NonIndexedCompletion).Obj()}, ReasonInvalidGroup, `Job "p2" of group "g" cannot be served`},
		{"bad StatefulSet sibling", []runtime.Object{worker.Obj(), makeSet(ns, "p2", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).ServiceName("").Obj()}, ReasonInvalidGroup, `StatefulSet "p2" of group "g" cannot be served`},
		{"ps without workers", []runtime.Object{makeJob(ns, "w", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).Obj()}, ReasonInvalidGroup, "no chief or worker"},
		{"roles disagree", []runtime.Object{
			makeJob(ns, "w", 2).Label(GroupLabel, "g").Annotation(GroupRolesAnnotation, "worker").Obj(),
			makeJob(ns, "x", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).Annotation(GroupRolesAnnotation, "ps,worker").Obj(),
		}, ReasonInvalidGroup, "disagree"},
		{"role not declared", []runtime.Object{
			makeJob(ns, "w", 2).Label(GroupLabel, "g").Annotation(GroupRolesAnnotation, "worker").Obj(),
			makeJob(ns, "x", 2).Label(GroupLabel, "g").Annotation(RoleAnnotation, string(RolePS)).Obj(),
		}, ReasonInvalidGroup, "does not list"},
	}
	for _, tc := range badGroups {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objs...)
			if result, writes := f.sync(ns, "w"); result != resultInvalid || len(writes) != 0 {
				t.Errorf("result %s, writes %v; want invalid and no writes", result, writes)
			}
			if events := f.drainEvents(); len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+tc.reason) || !strings.Contains(events[0], tc.hint) {
				t.Errorf("events = %q, want Warning %s saying %q", events, tc.reason, tc.hint)
			}
		})
	}
}

func TestWorkloadEventFilter(t *testing.T) {
	f := newFixture(t)
	old := makeJob("ns", "a", 2).Label(GroupLabel, "g").Obj()
	sibling := makeSet("ns", "b", 2).Label(GroupLabel, "g").Obj()
	namesake := makeSet("ns", "a", 2).Obj()
	must(t, f.c.jobIndexer.Add(old))
	must(t, f.c.setIndexer.Add(sibling))
	must(t, f.c.setIndexer.Add(namesake))
	queued := func() []string {
		var keys []string
		for f.c.queue.Len() > 0 {
			k, _ := f.c.queue.Get()
			f.c.queue.Done(k)
			f.c.queue.Forget(k)
			keys = append(keys, itemName(k))
		}
		slices.Sort(keys)
		return keys
	}
	status := old.DeepCopy()
	status.ResourceVersion = "2"
	status.Status.Active = 2
	f.c.onWorkloadUpdate(old, status)
	setStatus := sibling.DeepCopy()
	setStatus.ResourceVersion = "2"
	setStatus.Status.ReadyReplicas = 2
	f.c.onWorkloadUpdate(sibling, setStatus)
	if got := queued(); len(got) != 0 {
		t.Errorf("status-only updates queued %v, want nothing", got)
	}
	f.c.onWorkloadUpdate(old, old)
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a"}) {
		t.Errorf("resync queued %v, want the Job alone", got)
	}
	resized := old.DeepCopy()
	resized.ResourceVersion, resized.Generation = "3", 2
	f.c.onWorkloadUpdate(old, resized)
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a", "StatefulSet/ns/b"}) {
		t.Errorf("spec update queued %v, want the Job and its group", got)
	}
	// Deleted and made again while the watch was down: the relist shows an update, generation 1 again.
	recreated := old.DeepCopy()
	recreated.UID, recreated.ResourceVersion = "uid-new", "9"
	recreated.Spec.Completions = ptr.To[int32](3)
	f.c.onWorkloadUpdate(old, recreated)
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a", "StatefulSet/ns/b"}) {
		t.Errorf("a Job made again under its name queued %v, want it and its group", got)
	}
	scaled := sibling.DeepCopy()
	scaled.ResourceVersion, scaled.Generation = "3", 2
	f.c.onWorkloadUpdate(sibling, scaled)
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a", "StatefulSet/ns/b"}) {
		t.Errorf("StatefulSet scale queued %v, want it and its group", got)
	}
	f.c.onWorkloadDeleted(old)
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a", "StatefulSet/ns/a", "StatefulSet/ns/b"}) {
		t.Errorf("Job deletion queued %v, want it, its group and its namesake", got)
	}
	f.c.onService(desiredService(jobWorkload{old}, TaskSet{Subdomain: "a", Port: 1}))
	if got := queued(); !slices.Equal(got, []string{"Job/ns/a", "StatefulSet/ns/a"}) {
		t.Errorf("Service event queued %v, want its Job and the StatefulSet using that service name", got)
	}
	f.c.onService(makeService("ns", "b", true, nil)) // a Service named like b's serviceName
	if got := queued(); !slices.Equal(got, []string{"StatefulSet/ns/b"}) {
		t.Errorf("Service event queued %v, want the StatefulSet using that service name", got)
	}
}

// TestRun runs the controller with its informers on a fake clientset: create, resize and delete a Job
// and a StatefulSet. It never reads a Secret.
func TestRun(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(t.Context())
	c := NewController(client, WithConflictRecheck(time.Hour))
	done := make(chan error)
	go func() { done <- c.Run(ctx, 2) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	synced := testutil.GetCounterMetricValue
	before, _ := synced(reconcilesTotal.WithLabelValues(resultSynced))
	must(t, wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return c.HasSynced(), nil
	}))

	w := makeJob("ns", "mnist", 2)
	set := makeSet("ns", "tf", 2)
	_, err := client.BatchV1().Jobs("ns").Create(ctx, w.Obj(), metav1.CreateOptions{})
	must(t, err)
	_, err = client.AppsV1().StatefulSets("ns").Create(ctx, set.Obj(), metav1.CreateOptions{})
	must(t, err)
	// The test reads Secrets from the tracker, so that every Secret request in the fake's log is the
	// controller's.
	getSecret := func(name string) (*corev1.Secret, error) {
		obj, err := client.Tracker().Get(secretsResource, "ns", SecretName(name))
		if err != nil {
			return nil, err
		}
		return obj.(*corev1.Secret), nil
	}
	waitForCluster := func(name, want string) {
		t.Helper()
		var got string
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			s, err := getSecret(name)
			if err != nil {
				got = err.Error()
				return false, nil
			}
			got = string(s.Data[ClusterKey])
			return got == want, nil
		})
		if err != nil {
			t.Fatalf("%s: cluster = %s, want %s", name, got, want)
		}
	}
	waitForCluster("mnist", `{"worker":`+workers("ns", "mnist", 2, 2222)+`}`)
	waitForCluster("tf", `{"worker":`+workers("ns", "tf", 2, 2222)+`}`)

	_, err = client.BatchV1().Jobs("ns").Update(ctx, w.Resize(4).Obj(), metav1.UpdateOptions{})
	must(t, err)
	_, err = client.AppsV1().StatefulSets("ns").Update(ctx, set.Scale(3).Obj(), metav1.UpdateOptions{})
	must(t, err)
	waitForCluster("mnist", `{"worker":`+workers("ns", "mnist", 4, 2222)+`}`)
	waitForCluster("tf", `{"worker":`+workers("ns", "tf", 3, 2222)+`}`)

	must(t, client.BatchV1().Jobs("ns").Delete(ctx, "mnist", metav1.DeleteOptions{}))
	must(t, client.AppsV1().StatefulSets("ns").Delete(ctx, "tf", metav1.DeleteOptions{}))
	must(t, wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, name := range []string{"mnist", "tf"} {
			_, errSecret := getSecret(name)
			_, errSvc := client.CoreV1().Services("ns").Get(ctx, name, metav1.GetOptions{})
			if !apierrors.IsNotFound(errSecret) || !apierrors.IsNotFound(errSvc) {
				return false, nil
			}
		}
		return true, nil
	}))

	// Events reach the API server through the broadcaster Run starts.
	must(t, wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		ev, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(ev.Items, func(e corev1.Event) bool {
			return e.Reason == ReasonSecretApplied && e.InvolvedObject.Kind == "StatefulSet"
		}), nil
	}))
	if after, _ := synced(reconcilesTotal.WithLabelValues(resultSynced)); after <= before {
		t.Errorf("muster_tfconfig_reconciles_total{result=synced} went from %v to %v, want it to grow", before, after)
	}
	if err := c.Run(ctx, 1); err == nil {
		t.Errorf("second Run succeeded, want an error")
	}
	// Least privilege: the controller wrote Secrets and never read one.
	verbs := map[string]bool{}
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "secrets" {
			verbs[a.GetVerb()] = true
		}
	}
	if got := slices.Sorted(maps.Keys(verbs)); !slices.Equal(got, []string{"delete", "patch"}) {
		t.Errorf("the controller's requests on Secrets = %v, want only patch (apply) and delete", got)
	}
}
