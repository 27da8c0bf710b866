package integration

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/pkg/controller/tfconfig"
	"github.com/muster-sched/muster/pkg/controlplane"
)

// The scheduler and the controller, acting as their ServiceAccounts under
// the RBAC in manifests/ on an API server that enforces RBAC, do their work;
// what they must not do is denied.
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
	c.waitFor("TF_CONFIG Secret written by the controller", 30*time.Second, func() (bool, error) {
		_, err := admin.Client.CoreV1().Secrets(c.ns).Get(ctx, "mnist-tf-config", metav1.GetOptions{})
		return err == nil, nil
	})

	// Leader election works only on muster's own lease.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "muster-scheduler", Namespace: "muster-system"}}
	if _, err := sched.Client.CoordinationV1().Leases("muster-system").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Errorf("scheduler cannot create its lease: %v", err)
	}

	pod := c.jobPods("mnist")[0]
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
		{"scheduler", "update Jobs", func() error {
			j, err := admin.Client.BatchV1().Jobs(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = sched.Client.BatchV1().Jobs(c.ns).Update(ctx, j, metav1.UpdateOptions{})
			return err
		}},
		{"controller", "create pods", func() error {
			_, err := ctrl.Client.CoreV1().Pods(c.ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
				Spec: workerPodSpec("muster", 1)}, metav1.CreateOptions{})
			return err
		}},
		{"controller", "update Jobs", func() error {
			j, err := admin.Client.BatchV1().Jobs(c.ns).Get(ctx, "mnist", metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = ctrl.Client.BatchV1().Jobs(c.ns).Update(ctx, j, metav1.UpdateOptions{})
			return err
		}},
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
}
