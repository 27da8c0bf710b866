package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/pkg/controller/tfconfig"
	"github.com/muster-sched/muster/pkg/gang"
)

// The scheduler and the controller, acting as their ServiceAccounts under
// the RBAC in manifests/ on an API server that enforces RBAC, do their work;
// what they must not do is denied. The controller cannot read any Secret,
// not even its own.
func TestLeastPrivilege(t *testing.T) {
	admin := controlplane.Start(t, "--authorization-mode=RBAC")
	applyManifests(t, admin)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sched, err := admin.ServiceAccount("muster-system", "muster-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := admin.ServiceAccount("muster-system", "muster-tfconfig-controller")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.CreateNodes(ctx, admin.Client, gpuNodes(2, 8)...); err != nil {
		t.Fatal(err)
	}
	c := &cluster{ControlPlane: admin, t: t, ctx: ctx, ns: admin.Namespace(t, "rbac")}

	// A Secret and a Service the controller has no business with. The admission policies that keep
	// the controller off them are loaded asynchronously by the API server: both are in force before
	// the controller starts, so that all it does below it does under them.
	if _, err := admin.Client.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db-password"},
		Data:       map[string][]byte{"password": []byte("hunter2")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	frontend, err := admin.Client.CoreV1().Services(c.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "frontend"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "frontend"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// changeService reads the Service name as the admin and writes it back as the controller, changed.
	changeService := func(name string, dryRun bool, change func(*corev1.Service)) error {
		svc, err := admin.Client.CoreV1().Services(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(svc)
		opts := metav1.UpdateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = ctrl.Client.CoreV1().Services(c.ns).Update(ctx, svc, opts)
		return err
	}
	byServicePolicy := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), servicePolicy)
	}
	c.waitFor("the controller's admission policy on Secrets in force", 30*time.Second, func() (bool, error) {
		return apierrors.IsForbidden(readByApply(ctx, ctrl, c.ns, "db-password")), nil
	})
	c.waitFor("the controller's admission policy on Services in force", 30*time.Second, func() (bool, error) {
		return byServicePolicy(changeService("frontend", true, func(*corev1.Service) {})), nil
	})

	done, err := sched.StartScheduler(ctx)
	if err != nil {
		t.Fatalf("scheduler as its ServiceAccount: %v", err)
	}
	defer func() { cancel(); <-done }()
	controller := tfconfig.NewController(ctrl.Client)
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- controller.Run(ctx, 1) }()
	defer func() { cancel(); <-ctrlDone }()

	// The work: a gang is scheduled and its TF_CONFIG Secret written.
	c.createJob(jobSpec{name: "mnist", workers: 2, gpus: 8, labels: map[string]string{"muster.dev/tf-config": "true"}, subdomain: "mnist"})
	c.waitJobBound("mnist", 2)

	// DRA GPUs under the same role: the scheduler makes each pod's claim
	// for its nvidia.com/gpu, allocates it and reserves it for the pod.
	if _, err := admin.Client.ResourceV1().DeviceClasses().Create(ctx, testobj.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.addDRANode("dra-1", 8)
	c.addDRANode("dra-2", 8)
	c.createJob(jobSpec{name: "dra", workers: 2, gpus: 8})
	c.waitJobBound("dra", 2)
	c.waitFor("the dra Job's pods hold allocated claims", 30*time.Second, func() (bool, error) {
		pods, err := admin.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=dra"})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			if c.extendedClaimAllocated(&pods.Items[i], 8) != nil {
				return false, nil
			}
		}
		return len(pods.Items) == 2, nil
	})
	// A gang that cannot fit: the scheduler records its last failed plan
	// on the Job, under the admission policy that lets it change nothing
	// else there (in force before the plan fails).
	patchJobAs := func(as *controlplane.ControlPlane, name, patch string) error {
		_, err := as.Client.BatchV1().Jobs(c.ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	c.waitFor("the scheduler's admission policy on gang objects in force", 30*time.Second, func() (bool, error) {
		err := patchJobAs(sched, "mnist", `{"spec":{"parallelism":3}}`)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), schedulerPolicy), nil
	})
	c.createJob(jobSpec{name: "big", workers: 1, gpus: 16})
	var bigUID types.UID
	c.waitFor("the big Job's failed plan recorded on it", 30*time.Second, func() (bool, error) {
		job, err := admin.Client.BatchV1().Jobs(c.ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		bigUID = job.UID
		value, ok := job.Annotations[gang.FailedPlanAnnotation]
		if !ok {
			return false, nil
		}
		f, err := gang.DecodeFailedPlan(value)
		if err != nil {
			return false, err
		}
		// Four nodes of 8 GPUs: none has 16.
		return len(f.Nodes) == 1 && f.Nodes[0].Reason == gang.NodeInsufficientGPUs && f.Nodes[0].Nodes == 4, nil
	})
	// The scheduler's patch names the Job's UID, so that a record never
	// lands on a Job made again under the same name: the policy lets that
	// through, and the API server refuses another UID as Invalid on
	// metadata.uid, which the scheduler reads as "replaced".
	ownAnnotation := func(uid types.UID) string {
		return `{"metadata":{"uid":"` + string(uid) + `","annotations":{"` + gang.FailedPlanAnnotation + `":null}}}`
	}
	if err := patchJobAs(sched, "big", ownAnnotation(bigUID)); err != nil {
		t.Errorf("the scheduler cannot patch its own annotation: %v", err)
	}
	err = patchJobAs(sched, "big", ownAnnotation("a-replaced-job"))
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil ||
		!slices.ContainsFunc(status.Status().Details.Causes, func(c metav1.StatusCause) bool { return c.Field == "metadata.uid" }) {
		t.Errorf("the scheduler's patch naming another UID: error %v, want Invalid on metadata.uid", err)
	}
	for what, patch := range map[string]string{
		"a Job's spec": `{"spec":{"parallelism":3}}`, "a Job's labels": `{"metadata":{"labels":{"x":"y"}}}`,
		"another annotation of a Job": `{"metadata":{"annotations":{"x":"y"}}}`,
	} {
		if err := patchJobAs(sched, "big", patch); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), schedulerPolicy) {
			t.Errorf("the scheduler could patch %s (error %v), want Forbidden by %s", what, err, schedulerPolicy)
		}
	}
	c.waitFor("TF_CONFIG Secret written by the controller", 30*time.Second, func() (bool, error) {
		_, err := admin.Client.CoreV1().Secrets(c.ns).Get(ctx, "mnist-tf-config", metav1.GetOptions{})
		return err == nil, nil
	})

	// Its own Services under the policy: created labelled and headless, and put back (an update) when
	// someone changes them.
	if svc := tfWaitForService(t, admin.Client, c.ns, "mnist"); svc.Labels[tfconfig.JobLabel] != "mnist" || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("the controller's Service: labels %v, clusterIP %q; want labelled %s=mnist and headless", svc.Labels, svc.Spec.ClusterIP, tfconfig.JobLabel)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := admin.Client.CoreV1().Services(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Spec.Ports[0].Port = 80
		_, err = admin.Client.CoreV1().Services(c.ns).Update(ctx, svc, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the controller's Service put back by the controller", 30*time.Second, func() (bool, error) {
		svc, err := admin.Client.CoreV1().Services(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
		return err == nil && svc.Spec.Ports[0].Port == 2222, nil
	})

	// The controller's StatefulSet path and its Secret writes without reading: the Secret and Service
	// of a StatefulSet; someone else's Secret given back as it was; its own Secret deleted with the Job.
	set := tfStatefulSet(c.ns, "tf", 2).SchedulerName("none").Obj()
	if _, err := admin.Client.AppsV1().StatefulSets(c.ns).Create(ctx, set, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tfWaitForCluster(t, admin.Client, c.ns, "tf", tfWorkers(c.ns, "tf", "tf", 2, 2222))
	tfWaitForService(t, admin.Client, c.ns, "tf")
	theirs, err := admin.Client.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "other-tf-config"},
		Data:       map[string][]byte{"password": []byte("hunter2")},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := tfStatefulSet(c.ns, "other", 1).SchedulerName("none").Obj()
	if _, err := admin.Client.AppsV1().StatefulSets(c.ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tfWaitForEventOn(t, admin.Client, c.ns, "StatefulSet", "other", corev1.EventTypeWarning, tfconfig.ReasonSecretConflict)
	if got, err := admin.Client.CoreV1().Secrets(c.ns).Get(ctx, "other-tf-config", metav1.GetOptions{}); err != nil ||
		len(got.Data) != 1 || len(got.Labels) != 0 || len(got.OwnerReferences) != 0 {
		t.Errorf("someone else's Secret: %v, data keys %d, labels %v, owners %+v; want it as it was", err, len(got.Data), got.Labels, got.OwnerReferences)
	}
	if err := admin.Client.AppsV1().StatefulSets(c.ns).Delete(ctx, "tf", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the StatefulSet's Secret deleted by the controller", 30*time.Second, func() (bool, error) {
		_, err := admin.Client.CoreV1().Secrets(c.ns).Get(ctx, "tf-tf-config", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	// No garbage collector runs here: the controller deletes its Service.
	c.waitFor("the StatefulSet's Service deleted by the controller", 30*time.Second, func() (bool, error) {
		_, err := admin.Client.CoreV1().Services(c.ns).Get(ctx, "tf", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	// A Service of the same name that is not its own stays as it was, with a Warning Event.
	tfCheckForeignServiceKept(t, admin.Client, c.ns, "StatefulSet", "web", map[string]string{"app": "web"}, func() {
		if _, err := admin.Client.AppsV1().StatefulSets(c.ns).Create(ctx, tfStatefulSet(c.ns, "web", 2).SchedulerName("none").Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// Leader election works only on muster's own lease.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "muster-scheduler", Namespace: "muster-system"}}
	if _, err := sched.Client.CoordinationV1().Leases("muster-system").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Errorf("scheduler cannot create its lease: %v", err)
	}

	pod := c.jobPods("mnist")[0]
	// updateJobAs writes the Job mnist, as the admin reads it, back as as.
	updateJobAs := func(as *controlplane.ControlPlane) func() error {
		return func() error {
			j, err := admin.Client.BatchV1().Jobs(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = as.Client.BatchV1().Jobs(c.ns).Update(ctx, j, metav1.UpdateOptions{})
			return err
		}
	}
	denied := []struct {
		who  string
		what string
		do   func() error
	}{
		{"scheduler", "read Secrets", func() error {
			_, err := sched.Client.CoreV1().Secrets(c.ns).Get(ctx, "mnist-tf-config", metav1.GetOptions{})
			return err
		}},
		{"scheduler", "list Secrets", func() error {
			_, err := sched.Client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"scheduler", "update a pod's spec", func() error {
			p := pod.DeepCopy()
			p.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
			_, err := sched.Client.CoreV1().Pods(c.ns).Update(ctx, p, metav1.UpdateOptions{})
			return err
		}},
		{"scheduler", "evict pods (it deletes only for gang preemption)", func() error {
			return sched.Client.CoreV1().Pods(c.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: c.ns}})
		}},
		{"scheduler", "take kube-scheduler's lease", func() error {
			_, err := sched.Client.CoordinationV1().Leases("kube-system").Create(ctx,
				&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: "kube-system"}}, metav1.CreateOptions{})
			return err
		}},
		{"scheduler", "update Jobs", updateJobAs(sched)},
		{"controller", "get a Secret it did not create", func() error {
			_, err := ctrl.Client.CoreV1().Secrets(c.ns).Get(ctx, theirs.Name, metav1.GetOptions{})
			return err
		}},
		{"controller", "get even its own Secret", func() error {
			_, err := ctrl.Client.CoreV1().Secrets(c.ns).Get(ctx, "mnist-tf-config", metav1.GetOptions{})
			return err
		}},
		{"controller", "list Secrets in a namespace", func() error {
			_, err := ctrl.Client.CoreV1().Secrets(c.ns).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"controller", "list Secrets of the cluster", func() error {
			_, err := ctrl.Client.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"controller", "watch Secrets", func() error {
			w, err := ctrl.Client.CoreV1().Secrets("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"controller", "read a Secret by applying to it (admission-policy.yaml)", func() error {
			return readByApply(ctx, ctrl, c.ns, "db-password")
		}},
		{"controller", "update a Secret (it only applies)", func() error {
			_, err := ctrl.Client.CoreV1().Secrets(c.ns).Update(ctx, theirs, metav1.UpdateOptions{})
			return err
		}},
		{"controller", "create pods", func() error {
			_, err := ctrl.Client.CoreV1().Pods(c.ns).Create(ctx, testobj.MakePod("", "x").PodSpec(testobj.WorkerPodSpec("muster", 1)).Obj(),
				metav1.CreateOptions{})
			return err
		}},
		{"controller", "update Jobs", updateJobAs(ctrl)},
		{"controller", "write ConfigMaps", func() error {
			_, err := ctrl.Client.CoreV1().ConfigMaps(c.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		}},
		{"controller", "bind pods", func() error {
			return ctrl.Client.CoreV1().Pods(c.ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
				Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}, metav1.CreateOptions{})
		}},
	}
	for _, d := range denied {
		if err := d.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s could %s (error %v), want Forbidden", d.who, d.what, err)
		}
	}

	// Services. RBAC cannot narrow update or delete by label, so its ClusterRole lets the controller
	// update and delete any Service; the shipped admission policy is what keeps it to its own
	// (labelled, headless) ones, and each of these must be refused by that policy, not by RBAC.
	mnistJob, err := admin.Client.BatchV1().Jobs(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mnistOwner := []metav1.OwnerReference{*metav1.NewControllerRef(mnistJob, batchv1.SchemeGroupVersion.WithKind("Job"))}
	mnistPods := map[string]string{batchv1.JobNameLabel: "mnist"}
	createOwnedService := func(name string, labels map[string]string, clusterIP string, owners []metav1.OwnerReference, selector map[string]string) func() error {
		return func() error {
			_, err := ctrl.Client.CoreV1().Services(c.ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, OwnerReferences: owners},
				Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Selector: selector,
					Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
			}, metav1.CreateOptions{})
			return err
		}
	}
	createService := func(name string, labels map[string]string, clusterIP string) func() error {
		return createOwnedService(name, labels, clusterIP, mnistOwner, mnistPods)
	}
	ownLabel := map[string]string{tfconfig.JobLabel: "mnist"}
	for _, d := range []struct {
		what string
		do   func() error
	}{
		{"update a Service that is not its own", func() error {
			return changeService("frontend", false, func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "attacker"} })
		}},
		{"label a Service that is not its own as its own", func() error {
			return changeService("frontend", false, func(s *corev1.Service) { s.Labels = ownLabel })
		}},
		{"delete a Service that is not its own", func() error {
			return ctrl.Client.CoreV1().Services(c.ns).Delete(ctx, "frontend", metav1.DeleteOptions{})
		}},
		{"delete someone else's Service it found by name", func() error {
			return ctrl.Client.CoreV1().Services(c.ns).Delete(ctx, "web", metav1.DeleteOptions{})
		}},
		{"create a Service without its label", createService("unlabelled", nil, corev1.ClusterIPNone)},
		{"create a labelled Service that is not headless", createService("not-headless", ownLabel, "")},
		{"add external IPs to its own Service", func() error {
			return changeService("mnist", false, func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.10"} })
		}},
		{"turn its own Service into an ExternalName", func() error {
			return changeService("mnist", false, func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "attacker.example.com"
			})
		}},
		{"take its label off its own Service", func() error {
			return changeService("mnist", false, func(s *corev1.Service) { delete(s.Labels, tfconfig.JobLabel) })
		}},
		{"point its own Service at another job's pods", func() error {
			return changeService("mnist", false, func(s *corev1.Service) {
				s.Spec.Selector = map[string]string{batchv1.JobNameLabel: "frontend-job"}
			})
		}},
		{"widen its own Service to every pod", func() error {
			return changeService("mnist", false, func(s *corev1.Service) { s.Spec.Selector = nil })
		}},
		{"create a labelled headless Service no workload controls", createOwnedService("orphan", ownLabel, corev1.ClusterIPNone, nil, mnistPods)},
		{"create a Service labelled for one job selecting another's pods", createOwnedService("redirect", ownLabel, corev1.ClusterIPNone,
			mnistOwner, map[string]string{batchv1.JobNameLabel: "frontend-job"})},
	} {
		if err := d.do(); !byServicePolicy(err) {
			t.Errorf("controller could %s (error %v), want Forbidden by %s", d.what, err, servicePolicy)
		}
	}
	if err := func() error {
		_, err := ctrl.Client.CoreV1().Services(c.ns).Patch(ctx, "frontend", types.MergePatchType,
			[]byte(`{"spec":{"selector":{"app":"attacker"}}}`), metav1.PatchOptions{})
		return err
	}(); !apierrors.IsForbidden(err) {
		t.Errorf("controller could patch a Service (error %v), want Forbidden", err)
	}
	if got, err := admin.Client.CoreV1().Services(c.ns).Get(ctx, "frontend", metav1.GetOptions{}); err != nil || got.ResourceVersion != frontend.ResourceVersion {
		t.Errorf("the Service that is not the controller's: %v, resourceVersion %s → %s; want it unchanged", err, frontend.ResourceVersion, got.ResourceVersion)
	}

	// What the controller does with its own Services, done directly as its ServiceAccount: create a
	// labelled headless Service, update it, delete it.
	if err := createService("mnist-extra", ownLabel, corev1.ClusterIPNone)(); err != nil {
		t.Errorf("controller cannot create a labelled headless Service: %v", err)
	} else {
		if err := changeService("mnist-extra", false, func(s *corev1.Service) { s.Spec.Ports[0].Port = 2222 }); err != nil {
			t.Errorf("controller cannot update its own Service: %v", err)
		}
		if err := ctrl.Client.CoreV1().Services(c.ns).Delete(ctx, "mnist-extra", metav1.DeleteOptions{}); err != nil {
			t.Errorf("controller cannot delete its own Service: %v", err)
		}
	}

	// Without the policy, RBAC alone lets the controller's ServiceAccount rewrite the Service that is
	// not its own: the policy is what protects it. (A dry run: nothing is written.)
	if err := admin.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, servicePolicy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("RBAC alone to let the controller update any Service", 30*time.Second, func() (bool, error) {
		return changeService("frontend", true, func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "attacker"} }) == nil, nil
	})
}

// servicePolicy is the name of the shipped admission policy, and of its binding, that keeps the
// controller to its own Services (manifests/controller/admission-policy.yaml).
const servicePolicy = "muster-tfconfig-controller-services"

// schedulerPolicy keeps the scheduler to its annotation on gang objects
// (manifests/scheduler/admission-policy.yaml).
const schedulerPolicy = "muster-scheduler-gang-objects"

// TestTFConfigSecretApplyVerbs finds out, on a real API server that enforces RBAC, which verbs on
// Secrets the controller's server-side apply needs: an apply is a PATCH, and one that creates the
// Secret is also authorized as create. So the shipped ClusterRole grants create and patch (and delete,
// for the cleanup), and no verb that reads.
func TestTFConfigSecretApplyVerbs(t *testing.T) {
	admin := controlplane.Start(t, "--authorization-mode=RBAC")
	ctx := t.Context()
	ns := admin.Namespace(t, "apply-verbs")
	apply := func(cp *controlplane.ControlPlane, name, cluster string) error {
		_, err := cp.Client.CoreV1().Secrets(ns).Apply(ctx, applycorev1.Secret(name, ns).
			WithData(map[string][]byte{tfconfig.ClusterKey: []byte(cluster)}),
			metav1.ApplyOptions{FieldManager: tfconfig.FieldManager})
		return err
	}
	// as returns a ServiceAccount view granted exactly verbs on Secrets in ns, once the grant is in
	// force: it can read ConfigMaps through the same Role.
	as := func(name string, verbs ...string) *controlplane.ControlPlane {
		t.Helper()
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: verbs},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}},
		}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
		if _, err := admin.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		view, err := admin.ServiceAccount(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		tfPoll(t, "the Role of "+name+" in force", func(ctx context.Context) (bool, error) {
			_, err := view.Client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		})
		return view
	}
	// An existing Secret the apply updates, made by the controller's field manager.
	if err := apply(admin, "existing", "v1"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		verbs               []string
		create, update, get bool // whether an apply that creates, an apply that updates, a get is allowed
	}{
		{verbs: []string{"patch"}, create: false, update: true},
		{verbs: []string{"create"}, create: false, update: false},
		{verbs: []string{"create", "update"}, create: false, update: false},
		{verbs: []string{"create", "patch"}, create: true, update: true},
		{verbs: []string{"create", "patch", "delete"}, create: true, update: true}, // the shipped verbs
		{verbs: []string{"get"}, get: true},                                        // a check of the check: what is allowed shows
	} {
		name := "probe-" + strings.Join(tc.verbs, "-")
		t.Run(name, func(t *testing.T) {
			view := as(name, tc.verbs...)
			for _, step := range []struct {
				what    string
				allowed bool
				err     error
			}{
				{"an apply that creates", tc.create, apply(view, "new-"+name, "v1")},
				{"an apply that updates", tc.update, apply(view, "existing", name)},
				{"a get", tc.get, func() error {
					_, err := view.Client.CoreV1().Secrets(ns).Get(ctx, "existing", metav1.GetOptions{})
					return err
				}()},
			} {
				if step.allowed && step.err != nil {
					t.Errorf("%s with %v: %v, want it allowed", step.what, tc.verbs, step.err)
				}
				if !step.allowed && !apierrors.IsForbidden(step.err) {
					t.Errorf("%s with %v: %v, want Forbidden", step.what, tc.verbs, step.err)
				}
			}
		})
	}

	// The shipped ClusterRole grants exactly these on Secrets.
	var role rbacv1.ClusterRole
	for _, o := range buildManifests(t) {
		if o.GetKind() == "ClusterRole" && o.GetName() == "muster-tfconfig-controller" {
			mustConvert(t, o, &role)
		}
	}
	var secretVerbs []string
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "secrets") {
			secretVerbs = append(secretVerbs, r.Verbs...)
		}
	}
	slices.Sort(secretVerbs)
	if want := []string{"create", "delete", "patch"}; !slices.Equal(secretVerbs, want) {
		t.Errorf("the shipped ClusterRole grants %v on Secrets, want exactly %v", secretVerbs, want)
	}
}

// readByApply is what a stolen controller token could try: an empty server-side apply to a
// Secret it knows by name, whose answer would be the whole Secret.
func readByApply(ctx context.Context, as *controlplane.ControlPlane, namespace, name string) error {
	body := []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"` + name + `"}}`)
	got, err := as.Client.CoreV1().Secrets(namespace).Patch(ctx, name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: "muster-tfconfig-controller"})
	if err == nil && len(got.Data) > 0 {
		return fmt.Errorf("read %d keys of Secret %s", len(got.Data), name)
	}
	return err
}
