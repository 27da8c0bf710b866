package tfconfig

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics/testutil"
)

// fixture drives Controller.sync directly against a fake clientset, with the informer caches filled
// from it the way the label-filtered informers would fill them. No informer runs, so nothing races.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	c      *Controller
	events *record.FakeRecorder
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	events := record.NewFakeRecorder(1000)
	f := &fixture{t: t, ctx: t.Context(), client: client, events: events,
		c: NewController(client, WithEventRecorder(events))}
	f.refreshCaches()
	return f
}

// refreshCaches replaces the cache contents with what the API server holds, filtered like the
// informers: opted-in Jobs, and Secrets and Services carrying JobLabel.
func (f *fixture) refreshCaches() {
	f.t.Helper()
	var jobs, secrets, services []any
	jl, err := f.client.BatchV1().Jobs("").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for i := range jl.Items {
		if jl.Items[i].Labels[OptInLabel] == "true" {
			jobs = append(jobs, &jl.Items[i])
		}
	}
	sl, err := f.client.CoreV1().Secrets("").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for i := range sl.Items {
		if _, ok := sl.Items[i].Labels[JobLabel]; ok {
			secrets = append(secrets, &sl.Items[i])
		}
	}
	svl, err := f.client.CoreV1().Services("").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for i := range svl.Items {
		if _, ok := svl.Items[i].Labels[JobLabel]; ok {
			services = append(services, &svl.Items[i])
		}
	}
	must(f.t, f.c.jobIndexer.Replace(jobs, ""))
	must(f.t, f.c.ownedFactory.Core().V1().Secrets().Informer().GetIndexer().Replace(secrets, ""))
	must(f.t, f.c.ownedFactory.Core().V1().Services().Informer().GetIndexer().Replace(services, ""))
	f.client.ClearActions()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sync reconciles the Job key ns/name, fails the test on an error, and refreshes the caches. It
// returns the result and the API writes made, as "verb resource name".
func (f *fixture) sync(ns, name string) (string, []string) {
	f.t.Helper()
	result, err := f.c.sync(f.ctx, ns+"/"+name)
	if err != nil {
		f.t.Fatalf("sync %s/%s: %v", ns, name, err)
	}
	var writes []string
	for _, a := range f.client.Actions() {
		// Switch on the verb: an UpdateAction also satisfies CreateAction.
		switch a.GetVerb() {
		case "create", "update":
			m, _ := meta.Accessor(a.(interface{ GetObject() runtime.Object }).GetObject())
			writes = append(writes, fmt.Sprintf("%s %s %s", a.GetVerb(), a.GetResource().Resource, m.GetName()))
		case "delete":
			writes = append(writes, fmt.Sprintf("delete %s %s", a.GetResource().Resource, a.(k8stesting.DeleteAction).GetName()))
		case "patch":
			writes = append(writes, fmt.Sprintf("patch %s", a.GetResource().Resource))
		}
	}
	f.refreshCaches()
	return result, writes
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

func (f *fixture) secret(ns, name string) *corev1.Secret {
	f.t.Helper()
	s, err := f.client.CoreV1().Secrets(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("Secret %s/%s: %v", ns, name, err)
	}
	return s
}

func (f *fixture) service(ns, name string) *corev1.Service {
	f.t.Helper()
	s, err := f.client.CoreV1().Services(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("Service %s/%s: %v", ns, name, err)
	}
	return s
}

func (f *fixture) absent(get func() error, what string) {
	f.t.Helper()
	if err := get(); !apierrors.IsNotFound(err) {
		f.t.Errorf("%s: got err %v, want NotFound", what, err)
	}
}

func (f *fixture) updateJob(job *batchv1.Job) {
	f.t.Helper()
	if _, err := f.client.BatchV1().Jobs(job.Namespace).Update(f.ctx, job, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.refreshCaches()
}

func hasEvent(events []string, prefix string) bool {
	return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, prefix) })
}

func TestSyncCreatesSecretAndService(t *testing.T) {
	job := makeJob("team-a", "mnist", 3).obj()
	f := newFixture(t, job)

	result, writes := f.sync("team-a", "mnist")
	if result != resultSynced {
		t.Errorf("result = %s, want %s", result, resultSynced)
	}
	if want := []string{"create secrets mnist-tf-config", "create services mnist"}; !slices.Equal(writes, want) {
		t.Errorf("writes = %v, want %v", writes, want)
	}

	s := f.secret("team-a", "mnist-tf-config")
	if got, want := string(s.Data[ClusterKey]), `{"worker":`+workers("team-a", "mnist", 3, 2222)+`}`; got != want {
		t.Errorf("cluster = %s, want %s", got, want)
	}
	if len(s.Data) != 1 || s.Type != corev1.SecretTypeOpaque {
		t.Errorf("Secret has keys %v and type %s, want only %q and Opaque", keys(s.Data), s.Type, ClusterKey)
	}
	if s.Labels[JobLabel] != "mnist" {
		t.Errorf("Secret labels = %v, want %s=mnist", s.Labels, JobLabel)
	}
	ref := metav1.GetControllerOf(s)
	if ref == nil || ref.UID != job.UID || ref.Kind != "Job" || ref.APIVersion != "batch/v1" || ref.BlockOwnerDeletion == nil || *ref.BlockOwnerDeletion {
		t.Errorf("Secret controller reference = %+v, want Job mnist %s without blockOwnerDeletion", ref, job.UID)
	}

	svc := f.service("team-a", "mnist")
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
		svc.Spec.Selector[batchv1.JobNameLabel] != "mnist" || len(svc.Spec.Selector) != 1 {
		t.Errorf("Service spec = %+v, want headless, publishing not-ready addresses, selecting job-name=mnist", svc.Spec)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != PortName || svc.Spec.Ports[0].Port != 2222 {
		t.Errorf("Service ports = %+v, want %s 2222", svc.Spec.Ports, PortName)
	}
	if !metav1.IsControlledBy(svc, job) {
		t.Errorf("Service is not controlled by the Job: %+v", svc.OwnerReferences)
	}
	events := f.drainEvents()
	if !hasEvent(events, "Normal "+ReasonSecretCreated) || !hasEvent(events, "Normal "+ReasonServiceCreated) {
		t.Errorf("events = %v, want %s and %s", events, ReasonSecretCreated, ReasonServiceCreated)
	}

	// Level-based: nothing changed, nothing is written.
	for range 2 {
		if result, writes := f.sync("team-a", "mnist"); result != resultSynced || len(writes) != 0 {
			t.Errorf("second sync: result %s, writes %v; want synced and none", result, writes)
		}
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
		{"one task", makeJob("ns", "a", 1).obj(), `{"worker":["a-0.a.ns.svc:2222"]}`},
		{"custom port", makeJob("ns", "a", 2).port(3333, "").obj(), `{"worker":["a-0.a.ns.svc:3333","a-1.a.ns.svc:3333"]}`},
		{"no tfjob-port: default port", makeJob("ns", "a", 1).noPorts().obj(), `{"worker":["a-0.a.ns.svc:2222"]}`},
		{"subdomain differs from name", makeJob("ns", "a", 1).subdomain("net").obj(), `{"worker":["a-0.net.ns.svc:2222"]}`},
		{"64 tasks", makeJob("ns", "a", 64).obj(), `{"worker":` + workers("ns", "a", 64, 2222) + `}`},
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
	f := newFixture(t, w.obj())
	f.sync("ns", "mnist")
	before := f.secret("ns", "mnist-tf-config")

	f.updateJob(w.size(5).obj())
	result, writes := f.sync("ns", "mnist")
	if result != resultSynced || !slices.Equal(writes, []string{"update secrets mnist-tf-config"}) {
		t.Errorf("resize: result %s, writes %v; want synced and one Secret update", result, writes)
	}
	after := f.secret("ns", "mnist-tf-config")
	if got, want := string(after.Data[ClusterKey]), `{"worker":`+workers("ns", "mnist", 5, 2222)+`}`; got != want {
		t.Errorf("cluster after resize = %s, want %s", got, want)
	}
	if after.UID != before.UID {
		t.Errorf("Secret was replaced (uid %s → %s), want it updated in place", before.UID, after.UID)
	}
	if events := f.drainEvents(); !hasEvent(events, "Normal "+ReasonSecretUpdated) {
		t.Errorf("events = %v, want %s", events, ReasonSecretUpdated)
	}

	// Parallelism alone changes (allowed by the API): the Job is reported, the Secret stays as it was.
	f.updateJob(w.parallelism(2).obj())
	if result, writes := f.sync("ns", "mnist"); result != resultInvalid || len(writes) != 0 {
		t.Errorf("parallelism != completions: result %s, writes %v; want invalid and none", result, writes)
	}
	if got := string(f.secret("ns", "mnist-tf-config").Data[ClusterKey]); !strings.Contains(got, "mnist-4.") {
		t.Errorf("Secret changed to %s, want the 5-task cluster kept", got)
	}
}

func TestSyncBadJobs(t *testing.T) {
	tests := []struct {
		name   string
		job    *batchv1.Job
		reason string
		hint   string // part of the message that says how to fix it
	}{
		{"not indexed", makeJob("ns", "bad", 2).nonIndexed().obj(), ReasonNotIndexed, "completionMode: Indexed"},
		{"parallelism != completions", makeJob("ns", "bad", 4).parallelism(2).obj(), ReasonParallelismMismatch, "set both"},
		{"no subdomain", makeJob("ns", "bad", 2).subdomain("").obj(), ReasonMissingSubdomain, "set it"},
		{"subdomain not a Service name", makeJob("ns", "bad", 2).subdomain("9net").obj(), ReasonInvalidName, "starting with a letter"},
		{"UDP port", makeJob("ns", "bad", 2).port(2222, corev1.ProtocolUDP).obj(), ReasonInvalidPort, "TCP"},
		{"port out of range", makeJob("ns", "bad", 2).port(70000, "").obj(), ReasonInvalidPort, "1 to 65535"},
		{"unknown role", makeJob("ns", "bad", 2).role("master").obj(), ReasonInvalidRole, "chief, worker, ps, evaluator"},
		{"two chiefs", makeJob("ns", "bad", 2).role(RoleChief).obj(), ReasonInvalidReplicas, "set spec.parallelism and spec.completions to 1"},
		{"zero tasks", makeJob("ns", "bad", 0).obj(), ReasonInvalidReplicas, "at least 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.job)
			result, writes := f.sync("ns", "bad")
			if result != resultInvalid || len(writes) != 0 {
				t.Errorf("result %s, writes %v; want invalid and no writes", result, writes)
			}
			events := f.drainEvents()
			if len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+tc.reason+" ") || !strings.Contains(events[0], tc.hint) {
				t.Errorf("events = %q, want one Warning %s saying %q", events, tc.reason, tc.hint)
			}
		})
	}

	t.Run("hostname too long", func(t *testing.T) {
		// The API server rejects such a Job; the controller must still not write a Secret for it.
		name := strings.Repeat("x", 62)
		f := newFixture(t, makeJob("ns", name, 11).obj())
		if result, writes := f.sync("ns", name); result != resultInvalid || len(writes) != 0 {
			t.Errorf("result %s, writes %v; want invalid and no writes", result, writes)
		}
		if events := f.drainEvents(); !hasEvent(events, "Warning "+ReasonInvalidName) {
			t.Errorf("events = %v, want %s", events, ReasonInvalidName)
		}
	})
}

func TestSyncForeignSecret(t *testing.T) {
	foreign := makeSecret("ns", "mnist-tf-config", "mine")
	f := newFixture(t, makeJob("ns", "mnist", 2).obj(), foreign)

	result, writes := f.sync("ns", "mnist")
	if result != resultConflict {
		t.Errorf("result = %s, want %s", result, resultConflict)
	}
	// The Service is independent of the Secret and still made.
	if !slices.Equal(writes, []string{"create services mnist"}) {
		t.Errorf("writes = %v, want only the Service created", writes)
	}
	if got := f.secret("ns", "mnist-tf-config"); string(got.Data[ClusterKey]) != "mine" || got.ResourceVersion != "1" {
		t.Errorf("foreign Secret was modified: %+v", got)
	}
	if events := f.drainEvents(); !hasEvent(events, "Warning "+ReasonSecretConflict) {
		t.Errorf("events = %v, want %s", events, ReasonSecretConflict)
	}
	if f.c.queue.Len() != 0 {
		t.Errorf("conflict recheck should be delayed, queue has %d items now", f.c.queue.Len())
	}

	// A Secret labelled for the Job but controlled by something else is foreign too.
	other := makeSecret("ns", "other-tf-config", "theirs")
	other.Labels = map[string]string{JobLabel: "other"}
	other.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u", Controller: ptrTrue()}}
	f = newFixture(t, makeJob("ns", "other", 1).obj(), other)
	if result, _ := f.sync("ns", "other"); result != resultConflict {
		t.Errorf("Secret controlled by a ConfigMap: result = %s, want %s", result, resultConflict)
	}
	if got := f.secret("ns", "other-tf-config"); string(got.Data[ClusterKey]) != "theirs" {
		t.Errorf("Secret controlled by someone else was modified: %+v", got)
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, makeJob("ns", "mnist", 2).obj(), tc.svc)
			result, writes := f.sync("ns", "mnist")
			if !slices.Equal(writes, []string{"create secrets mnist-tf-config"}) {
				t.Errorf("writes = %v, want the Secret created and the Service left alone", writes)
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

func TestSyncAdoptsObjectsOfEarlierJobOfSameName(t *testing.T) {
	// A Job deleted with orphan propagation while the controller was down, then re-created.
	old := makeJob("ns", "mnist", 2).uid("old-uid").obj()
	stale := desiredSecret(old, []byte(`{"worker":["stale"]}`))
	staleSvc := desiredService(old, TaskSet{Subdomain: "mnist", Port: 2222})
	stripped := desiredSecret(makeJob("ns", "b", 1).obj(), []byte("x"))
	stripped.OwnerReferences = nil // orphaned: the garbage collector removed the owner reference
	f := newFixture(t, makeJob("ns", "mnist", 3).obj(), stale, staleSvc, makeJob("ns", "b", 1).uid("new-b").obj(), stripped)

	if result, writes := f.sync("ns", "mnist"); result != resultSynced ||
		!slices.Equal(writes, []string{"update secrets mnist-tf-config", "update services mnist"}) {
		t.Errorf("result %s, writes %v; want the Secret and Service updated", result, writes)
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

	if result, writes := f.sync("ns", "b"); result != resultSynced || !slices.Equal(writes, []string{"update secrets b-tf-config", "create services b"}) {
		t.Errorf("orphaned Secret: result %s, writes %v; want it adopted", result, writes)
	}
}

func TestSyncCleanup(t *testing.T) {
	job := makeJob("ns", "mnist", 2).obj()
	foreignLabelled := makeSecret("ns", "keep", "x")
	foreignLabelled.Labels = map[string]string{JobLabel: "mnist"}
	foreignLabelled.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u", Controller: ptrTrue()}}
	owned := func() []runtime.Object {
		return []runtime.Object{
			desiredSecret(job, []byte("{}")),
			desiredService(job, TaskSet{Subdomain: "mnist", Port: 2222}),
			foreignLabelled,
			makeSecret("ns", "unrelated", "x"),
		}
	}
	wantDeleted := []string{"delete secrets mnist-tf-config", "delete services mnist"}

	t.Run("Job gone", func(t *testing.T) {
		f := newFixture(t, owned()...)
		if result, writes := f.sync("ns", "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
		f.absent(func() error {
			_, err := f.client.CoreV1().Secrets("ns").Get(f.ctx, "mnist-tf-config", metav1.GetOptions{})
			return err
		}, "Secret")
		f.secret("ns", "keep")
		f.secret("ns", "unrelated")
		if result, writes := f.sync("ns", "mnist"); result != resultCleaned || len(writes) != 0 {
			t.Errorf("second cleanup: result %s, writes %v; want nothing to do", result, writes)
		}
	})
	t.Run("Job being deleted (orphan propagation, no garbage collector)", func(t *testing.T) {
		f := newFixture(t, append(owned(), makeJob("ns", "mnist", 2).deleting().obj())...)
		if result, writes := f.sync("ns", "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
	})
	t.Run("opt-in label removed", func(t *testing.T) {
		f := newFixture(t, append(owned(), makeJob("ns", "mnist", 2).noLabel(OptInLabel).obj())...)
		if result, writes := f.sync("ns", "mnist"); result != resultCleaned || !slices.Equal(writes, wantDeleted) {
			t.Errorf("result %s, writes %v; want cleaned, %v", result, writes, wantDeleted)
		}
	})
	t.Run("cache behind the API server", func(t *testing.T) {
		f := newFixture(t, owned()...)
		// The Job exists but the cache has not seen it yet: nothing may be deleted.
		if _, err := f.client.BatchV1().Jobs("ns").Create(f.ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.client.ClearActions()
		result, err := f.c.sync(f.ctx, "ns/mnist")
		if err == nil || result != resultError {
			t.Errorf("sync = %s, %v; want an error so the key is retried", result, err)
		}
		f.secret("ns", "mnist-tf-config")
		f.service("ns", "mnist")
	})
}

func TestSyncGroup(t *testing.T) {
	const ns = "ns"
	chief := makeJob(ns, "c", 1).group("g").role(RoleChief)
	ps := makeJob(ns, "p", 2).group("g").role(RolePS).port(2223, "")
	worker := makeJob(ns, "w", 3).group("g") // role defaults to worker
	eval := makeJob(ns, "e", 1).group("g").role(RoleEvaluator).subdomain("")
	const want = `{"chief":["c-0.c.ns.svc:2222"],"ps":["p-0.p.ns.svc:2223","p-1.p.ns.svc:2223"],"worker":["w-0.w.ns.svc:2222","w-1.w.ns.svc:2222","w-2.w.ns.svc:2222"]}`

	t.Run("every member gets the whole cluster", func(t *testing.T) {
		f := newFixture(t, chief.obj(), ps.obj(), worker.obj(), eval.obj(), makeJob(ns, "solo", 1).obj())
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
		f.absent(func() error {
			_, err := f.client.CoreV1().Services(ns).Get(f.ctx, "e", metav1.GetOptions{})
			return err
		}, "evaluator Service")
		for _, name := range []string{"c", "p", "w"} {
			f.service(ns, name)
		}
	})

	t.Run("waits for the roles it declares", func(t *testing.T) {
		c := makeJob(ns, "c", 1).group("g").role(RoleChief).annotation(GroupRolesAnnotation, "worker, chief,ps")
		w := makeJob(ns, "w", 3).group("g").annotation(GroupRolesAnnotation, "chief,ps,worker")
		f := newFixture(t, c.obj(), w.obj())
		for _, name := range []string{"c", "w"} {
			if result, writes := f.sync(ns, name); result != resultWaiting || len(writes) != 0 {
				t.Errorf("%s: result %s, writes %v; want waiting and no writes", name, result, writes)
			}
		}
		if events := f.drainEvents(); !hasEvent(events, "Normal "+ReasonWaitingForGroup) || !strings.Contains(events[0], "[ps]") {
			t.Errorf("events = %v, want Normal %s naming the missing ps", events, ReasonWaitingForGroup)
		}
		p := makeJob(ns, "p", 2).group("g").role(RolePS).port(2223, "")
		if _, err := f.client.BatchV1().Jobs(ns).Create(f.ctx, p.obj(), metav1.CreateOptions{}); err != nil {
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
		jobs   []*batchv1.Job
		reason string
		hint   string
	}{
		{"two workers", []*batchv1.Job{worker.obj(), makeJob(ns, "w2", 2).group("g").obj()}, ReasonInvalidGroup, "both have role worker"},
		{"bad sibling", []*batchv1.Job{worker.obj(), makeJob(ns, "p2", 2).group("g").role(RolePS).nonIndexed().obj()}, ReasonInvalidGroup, `Job "p2" of group "g" cannot be served`},
		{"ps without workers", []*batchv1.Job{makeJob(ns, "w", 2).group("g").role(RolePS).obj()}, ReasonInvalidGroup, "no chief or worker"},
		{"roles disagree", []*batchv1.Job{
			makeJob(ns, "w", 2).group("g").annotation(GroupRolesAnnotation, "worker").obj(),
			makeJob(ns, "x", 2).group("g").role(RolePS).annotation(GroupRolesAnnotation, "ps,worker").obj(),
		}, ReasonInvalidGroup, "disagree"},
		{"role not declared", []*batchv1.Job{
			makeJob(ns, "w", 2).group("g").annotation(GroupRolesAnnotation, "worker").obj(),
			makeJob(ns, "x", 2).group("g").role(RolePS).obj(),
		}, ReasonInvalidGroup, "does not list"},
	}
	for _, tc := range badGroups {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			for _, j := range tc.jobs {
				objs = append(objs, j)
			}
			f := newFixture(t, objs...)
			if result, writes := f.sync(ns, "w"); result != resultInvalid || len(writes) != 0 {
				t.Errorf("result %s, writes %v; want invalid and no writes", result, writes)
			}
			if events := f.drainEvents(); len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+tc.reason) || !strings.Contains(events[0], tc.hint) {
				t.Errorf("events = %q, want Warning %s saying %q", events, tc.reason, tc.hint)
			}
		})
	}
}

func TestJobEventFilter(t *testing.T) {
	f := newFixture(t)
	old := makeJob("ns", "a", 2).group("g").obj()
	sibling := makeJob("ns", "b", 2).group("g").obj()
	must(t, f.c.jobIndexer.Add(old))
	must(t, f.c.jobIndexer.Add(sibling))
	queued := func() []string {
		var keys []string
		for f.c.queue.Len() > 0 {
			k, _ := f.c.queue.Get()
			f.c.queue.Done(k)
			f.c.queue.Forget(k)
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return keys
	}
	status := old.DeepCopy()
	status.ResourceVersion = "2"
	status.Status.Active = 2
	f.c.onJobUpdate(old, status)
	if got := queued(); len(got) != 0 {
		t.Errorf("status-only update queued %v, want nothing", got)
	}
	f.c.onJobUpdate(old, old)
	if got := queued(); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("resync queued %v, want the Job alone", got)
	}
	resized := old.DeepCopy()
	resized.ResourceVersion, resized.Generation = "3", 2
	f.c.onJobUpdate(old, resized)
	if got := queued(); !slices.Equal(got, []string{"ns/a", "ns/b"}) {
		t.Errorf("spec update queued %v, want the Job and its group", got)
	}
	f.c.enqueueOwner(desiredSecret(old, nil))
	if got := queued(); !slices.Equal(got, []string{"ns/a"}) {
		t.Errorf("Secret event queued %v, want its Job", got)
	}
	f.c.onService(makeService("ns", "b", true, nil)) // a Service named like b's subdomain
	if got := queued(); !slices.Equal(got, []string{"ns/b"}) {
		t.Errorf("Service event queued %v, want the Job using that subdomain", got)
	}
}

// TestRun runs the controller with its informers on a fake clientset: create, resize and delete a Job.
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
	if _, err := client.BatchV1().Jobs("ns").Create(ctx, w.obj(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForCluster := func(want string) {
		t.Helper()
		var got string
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			s, err := client.CoreV1().Secrets("ns").Get(ctx, "mnist-tf-config", metav1.GetOptions{})
			if err != nil {
				got = err.Error()
				return false, nil
			}
			got = string(s.Data[ClusterKey])
			return got == want, nil
		})
		if err != nil {
			t.Fatalf("cluster = %s, want %s", got, want)
		}
	}
	waitForCluster(`{"worker":` + workers("ns", "mnist", 2, 2222) + `}`)

	if _, err := client.BatchV1().Jobs("ns").Update(ctx, w.size(4).obj(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForCluster(`{"worker":` + workers("ns", "mnist", 4, 2222) + `}`)

	if err := client.BatchV1().Jobs("ns").Delete(ctx, "mnist", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	must(t, wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, errSecret := client.CoreV1().Secrets("ns").Get(ctx, "mnist-tf-config", metav1.GetOptions{})
		_, errSvc := client.CoreV1().Services("ns").Get(ctx, "mnist", metav1.GetOptions{})
		return apierrors.IsNotFound(errSecret) && apierrors.IsNotFound(errSvc), nil
	}))

	// Events reach the API server through the broadcaster Run starts.
	must(t, wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		ev, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(ev.Items, func(e corev1.Event) bool { return e.Reason == ReasonSecretCreated }), nil
	}))
	if after, _ := synced(reconcilesTotal.WithLabelValues(resultSynced)); after <= before {
		t.Errorf("muster_tfconfig_reconciles_total{result=synced} went from %v to %v, want it to grow", before, after)
	}
	if err := c.Run(ctx, 1); err == nil {
		t.Errorf("second Run succeeded, want an error")
	}
}
