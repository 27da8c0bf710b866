package mustergang

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/interpodaffinity"

	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/gang"
)

// A gang with no plan gets its last failed plan recorded on its Job: every
// node counted by what kept a member off it, a framework filter's refusal
// under the filter's name. The same outcome again writes nothing more.
func TestFailedPlanRecordedOnTheGangsObject(t *testing.T) {
	// A pod that is not a member carries the members' label on n1: their
	// one-per-node anti-affinity, which only InterPodAffinity checks
	// against pods outside the gang, keeps them off n1.
	intruder := testobj.MakePod("ns", "intruder").UID("intruder").Label("app", "j").Node("n1").
		Container(testobj.MakeContainer("c").Request(v1.ResourceCPU, resource.MustParse("1")).Obj()).Obj()
	a, b := worker("j", 0, 8, ""), worker("j", 1, 8, "")
	f := newTestFramework(t, 2, []*v1.Node{gpuNode("n1", 8), gpuNode("n2", 8)}, []*v1.Pod{intruder, a, b})
	client := f.plugin.handle.ClientSet().(*fake.Clientset)
	patches := 0
	client.PrependReactor("patch", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++ // the reactor chain runs under the fake's lock
		return false, nil, nil
	})

	_, status := f.preFilter(t, a)
	require.Equal(t, fwk.UnschedulableAndUnresolvable, status.Code(), "PreFilter: %v", status)
	var record *gang.FailedPlan
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		job, err := client.BatchV1().Jobs("ns").Get(ctx, "j", metav1.GetOptions{})
		if err != nil || job.Annotations[gang.FailedPlanAnnotation] == "" {
			return false, err
		}
		record, err = gang.DecodeFailedPlan(job.Annotations[gang.FailedPlanAnnotation])
		return true, err
	})
	require.NoError(t, err, "no failed plan recorded on the Job")
	assert.ElementsMatch(t, []gang.NodeReasonCount{
		{Reason: gang.NodeFilterRejected, Filter: interpodaffinity.Name, Nodes: 1},
		{Reason: gang.NodeHasRoom, Nodes: 1},
	}, record.Nodes)
	assert.Equal(t, status.Message(), record.Message)
	assert.Equal(t, f.clock.Now().UTC(), record.Time.UTC())

	// The sibling's cycle fails the same way: no second write. (A second
	// record would be pending in latest until its patch is done.)
	_, status = f.preFilter(t, b)
	require.False(t, status.IsSuccess())
	f.plugin.failedPlans.mu.Lock()
	pending := len(f.plugin.failedPlans.latest)
	f.plugin.failedPlans.mu.Unlock()
	client.Lock()
	written := patches
	client.Unlock()
	assert.Zero(t, pending, "a second record is pending")
	assert.Equal(t, 1, written, "patches of the Job")
}

// A failed plan recorded for a Job that was then deleted and made again
// under its name is not written on the new Job, whose gang never had that
// plan; the record is dropped, not retried. The new Job's own record is
// written.
func TestFailedPlanOfAReplacedObjectIsNotWrittenOnItsSuccessor(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(testobj.MakeJob("ns", "j").UID("first").Obj())
	// The API server refuses a patch that changes metadata.uid (it is
	// immutable; the integration test of the scheduler's admission policy
	// sees the real refusal). The fake would take the new UID.
	client.PrependReactor("patch", "jobs", func(action k8stesting.Action) (bool, runtime.Object, error) {
		patch := action.(k8stesting.PatchAction)
		var body struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(patch.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		obj, err := client.Tracker().Get(batchv1.SchemeGroupVersion.WithResource("jobs"), patch.GetNamespace(), patch.GetName())
		if err != nil || body.Metadata.UID == "" || body.Metadata.UID == string(obj.(*batchv1.Job).UID) {
			return false, nil, nil
		}
		return true, nil, apierrors.NewInvalid(batchv1.SchemeGroupVersion.WithKind("Job").GroupKind(), patch.GetName(),
			field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), body.Metadata.UID, "field is immutable")})
	})
	w := newFailedPlanWriter(func() kubernetes.Interface { return client }, &gangSource{})
	key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
	annotation := func() string {
		job, err := client.BatchV1().Jobs("ns").Get(ctx, "j", metav1.GetOptions{})
		require.NoError(t, err)
		return job.Annotations[gang.FailedPlanAnnotation]
	}

	w.record(key, "first", &gang.FailedPlan{Time: time.Unix(1, 0).UTC(), Message: "first Job's plan"})
	require.NoError(t, client.BatchV1().Jobs("ns").Delete(ctx, "j", metav1.DeleteOptions{}))
	_, err := client.BatchV1().Jobs("ns").Create(ctx, testobj.MakeJob("ns", "j").UID("second").Obj(), metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, w.sync(ctx, key), "a refused record is not retried")
	assert.Empty(t, annotation(), "the first Job's failed plan on the second Job")
	assert.Empty(t, w.latest, "the refused record is still pending")

	w.record(key, "second", &gang.FailedPlan{Time: time.Unix(2, 0).UTC(), Message: "second Job's plan"})
	require.NoError(t, w.sync(ctx, key))
	record, err := gang.DecodeFailedPlan(annotation())
	require.NoError(t, err)
	assert.Equal(t, "second Job's plan", record.Message)
}

// A patch the API server fails every time (an API server that keeps
// answering 500) is retried maxFailedPlanRetries times, and then its
// record is dropped, not kept for the life of the scheduler.
func TestFailedPlanFailingForGoodIsDropped(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(testobj.MakeJob("ns", "j").UID("uid").Obj())
	client.PrependReactor("patch", "jobs", func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(fmt.Errorf("etcd is away"))
	})
	w := newFailedPlanWriter(func() kubernetes.Interface { return client }, &gangSource{})
	defer w.queue.ShutDown()
	key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
	w.record(key, "uid", &gang.FailedPlan{Time: time.Unix(1, 0).UTC(), Message: "plan"})
	// As runGangQueue retries: each failure is requeued until the last.
	for retry := 0; retry < maxFailedPlanRetries; retry++ {
		require.Error(t, w.sync(ctx, key))
		require.Len(t, w.latest, 1, "dropped after %d of %d retries", retry, maxFailedPlanRetries)
		w.queue.AddRateLimited(key)
	}
	require.Error(t, w.sync(ctx, key))
	assert.Empty(t, w.latest, "a record refused for good is kept")
}

// A patch refused by policy (an admission webhook denying Job updates, a
// ValidatingAdmissionPolicy, an object at its size limit) meets the same
// refusal at once: it is tried once, not retried, and its record dropped.
func TestFailedPlanRefusedByPolicyIsNotRetried(t *testing.T) {
	refusals := map[string]func(name string) error{
		"webhook denial": func(name string) error {
			return apierrors.NewForbidden(batchv1.Resource("jobs"), name, fmt.Errorf("denied by policy"))
		},
		"policy's CEL": func(name string) error {
			return apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, name, nil)
		},
		"too large": func(string) error { return apierrors.NewRequestEntityTooLargeError("annotations too large") },
	}
	for what, refusal := range refusals {
		t.Run(what, func(t *testing.T) {
			client := fake.NewClientset(testobj.MakeJob("ns", "j").UID("uid").Obj())
			patches := 0
			client.PrependReactor("patch", "jobs", func(action k8stesting.Action) (bool, runtime.Object, error) {
				patches++
				return true, nil, refusal(action.(k8stesting.PatchAction).GetName())
			})
			w := newFailedPlanWriter(func() kubernetes.Interface { return client }, &gangSource{})
			defer w.queue.ShutDown()
			key := gang.Key{Kind: gang.KindJob, Namespace: "ns", Name: "j"}
			w.record(key, "uid", &gang.FailedPlan{Time: time.Unix(1, 0).UTC(), Message: "plan"})
			require.NoError(t, w.sync(context.Background(), key), "a refusal by policy is retried")
			assert.Equal(t, 1, patches)
			assert.Empty(t, w.latest, "the refused record is kept")
		})
	}
}
