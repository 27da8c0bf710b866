//go:build e2e

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/apis/scheduling/v1alpha1"
	"github.com/muster-sched/muster/test/e2e/tools"
)

// What Kubeflow's training-operator v1.8.1 expects of a cluster, read from
// its source (cmd/training-operator.v1/main.go, pkg/cert/cert.go).
const (
	// The operator's namespace: MY_POD_NAMESPACE, or this.
	kubeflowNamespace = "kubeflow"
	// The Secret its certificate rotator writes the webhook's CA and
	// serving certificate into (--webhook-secret-name).
	operatorCertSecret = "training-operator-webhook-cert"
	// The ValidatingWebhookConfiguration the rotator injects its CA into.
	operatorWebhookConfig = "validator.training-operator.kubeflow.org"
	// The operator's source file that hard-codes (no flag) where its
	// certificate rotator waits for the Secret's files to appear (the
	// kubelet's Secret mount in a cluster), as certDir.
	operatorCertDirSource = "pkg/cert/cert.go"
	// The TFJob CRD in the module's source.
	tfJobCRDFile = "manifests/base/crds/kubeflow.org_tfjobs.yaml"
	// Pod label the operator sets to the TFJob's name.
	tfJobNameLabel = "training.kubeflow.org/job-name"
)

var tfJobResource = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "tfjobs"}

// startTrainingOperator installs the TFJob CRD from the operator's source,
// gives the operator what its certificate rotator needs outside a cluster
// and runs it with --gang-scheduler-name=muster and only the TFJob scheme.
func (c *e2eCluster) startTrainingOperator() *toolProcess {
	c.t.Helper()
	binary, source := toolBinary(c.t, tools.TrainingOperator)
	if err := c.InstallCRDFiles(filepath.Join(source, tfJobCRDFile)); err != nil {
		c.t.Fatalf("installing the TFJob CRD: %v", err)
	}

	// The rotator fills an existing Secret and injects its CA into an
	// existing webhook configuration. This one matches no request and
	// ignores failures, so the API server never calls the operator.
	c.createNamespace(kubeflowNamespace)
	_, err := c.Client.CoreV1().Secrets(kubeflowNamespace).Create(c.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: operatorCertSecret},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.create(schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}, false, `
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: `+operatorWebhookConfig+`
webhooks:
- name: never-called.e2e.muster.dev
  clientConfig:
    url: https://127.0.0.1:1/never-called
  rules:
  - apiGroups: ["e2e.muster.dev"]
    apiVersions: ["v1"]
    resources: ["nothing"]
    operations: ["CREATE"]
  failurePolicy: Ignore
  sideEffects: None
  admissionReviewVersions: ["v1"]
`)

	// The webhook server reads its certificates from
	// $TMPDIR/k8s-webhook-server/serving-certs: a directory of this test.
	tmp := filepath.Join(c.t.TempDir(), "tmp")
	operator := c.startTool("training-operator", binary,
		[]string{"KUBECONFIG=" + c.Kubeconfig, "TMPDIR=" + tmp},
		"--gang-scheduler-name="+schedulerName,
		"--enable-scheme=tfjob",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-server-port=%d", freePort(c.t)),
	)

	// Play the kubelet: once the rotator has written the certificates,
	// "mount" the Secret where the webhook server reads it and where the
	// rotator looks for it.
	var files map[string][]byte
	c.waitFor("the operator's certificates in Secret "+kubeflowNamespace+"/"+operatorCertSecret, 60*time.Second, func() (bool, error) {
		secret, err := c.Client.CoreV1().Secrets(kubeflowNamespace).Get(c.ctx, operatorCertSecret, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		files = secret.Data
		return len(files["tls.crt"]) > 0 && len(files["tls.key"]) > 0, nil
	})
	writeFiles(c.t, filepath.Join(tmp, "k8s-webhook-server", "serving-certs"), files)
	provideFiles(c.t, rotatorCertDir(c.t, source), map[string][]byte{"tls.crt": files["tls.crt"], "tls.key": files["tls.key"]})

	// The controllers start only once the certificates are ready.
	c.waitFor("the training-operator's TFJob controller", 90*time.Second, func() (bool, error) {
		return operator.logHasLine("Starting workers", `"controller": "tfjob-controller"`), nil
	})
	return operator
}

// tfReplicas is one replica type of a TFJob: how many, GPUs each.
type tfReplicas struct {
	kind     string // Chief, Worker, PS
	replicas int
	gpus     int
}

// createTFJob creates a TFJob as a user would with the operator's gang
// scheduling on: no schedulerName, the operator sets it.
func (c *e2eCluster) createTFJob(name string, replicas ...tfReplicas) {
	c.t.Helper()
	var specs strings.Builder
	for _, r := range replicas {
		limits := ""
		if r.gpus > 0 {
			limits = fmt.Sprintf("\n              limits: {nvidia.com/gpu: %d}", r.gpus)
		}
		// terminationGracePeriodSeconds 0: no kubelet confirms that a
		// deleted pod stopped, so a grace period would keep it forever.
		fmt.Fprintf(&specs, `
    %s:
      replicas: %d
      restartPolicy: Never
      template:
        spec:
          terminationGracePeriodSeconds: 0
          containers:
          - name: tensorflow
            image: tensorflow/tensorflow:2.15.0-gpu
            resources:
              requests: {cpu: "1"}%s`, r.kind, r.replicas, limits)
	}
	c.create(tfJobResource, true, fmt.Sprintf(`
apiVersion: kubeflow.org/v1
kind: TFJob
metadata:
  name: %s
spec:
  tfReplicaSpecs:%s
`, name, specs.String()))
}

// A TFJob with a Chief (1 GPU), three Workers (1 GPU each) and a PS (no GPU)
// is one gang of five heterogeneous members: the operator creates one
// PodGroup of minMember 5 and labels the pods with it, and muster places all
// five.
func TestE2EKubeflowTFJob(t *testing.T) {
	c := startE2ECluster(t, gpuNodes(3, 2)...)
	c.startTrainingOperator()

	c.createTFJob("mnist", tfReplicas{"Chief", 1, 1}, tfReplicas{"Worker", 3, 1}, tfReplicas{"PS", 1, 0})
	pods := c.waitPodsBound("TFJob mnist", v1alpha1.PodGroupLabel, "mnist", 5, 90*time.Second)

	gpusByType := map[string]int64{}
	for _, p := range pods {
		if p.Spec.SchedulerName != schedulerName {
			t.Errorf("pod %s: schedulerName %q, want %q set by the operator", p.Name, p.Spec.SchedulerName, schedulerName)
		}
		gpu := p.Spec.Containers[0].Resources.Limits[configv1.DefaultGPUResourceName]
		gpusByType[p.Labels["training.kubeflow.org/replica-type"]] += gpu.Value()
	}
	if want := map[string]int64{"chief": 1, "worker": 3, "ps": 0}; fmt.Sprint(gpusByType) != fmt.Sprint(want) {
		t.Errorf("GPUs by replica type = %v, want %v", gpusByType, want)
	}

	groups, err := c.dyn.Resource(v1alpha1.Resource).Namespace(c.ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(groups.Items) != 1 {
		t.Fatalf("%d PodGroups in the namespace, want the one the operator creates", len(groups.Items))
	}
	pg, err := v1alpha1.FromUnstructured(&groups.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	owner := metav1.GetControllerOf(pg)
	if pg.Name != "mnist" || pg.Spec.MinMember != 5 || owner == nil || owner.Kind != "TFJob" || owner.Name != "mnist" {
		t.Errorf("PodGroup %s: minMember %d, controller %+v; want mnist, 5, TFJob mnist", pg.Name, pg.Spec.MinMember, owner)
	}
	c.waitFor("PodGroup mnist status: 5 scheduled", 30*time.Second, func() (bool, error) {
		got, err := c.podGroups().Get(c.ctx, c.ns, "mnist")
		if err != nil {
			return false, err
		}
		return got.Status.Scheduled == 5, nil
	})
}

// Two TFJobs of 4 GPUs each on 6 GPUs: one is placed whole, the other holds
// nothing and says why, and is placed whole once the first is deleted (its
// pods and PodGroup go through their owner references). Neither is ever
// partly bound.
func TestE2EKubeflowCompetingTFJobs(t *testing.T) {
	c := startE2ECluster(t, gpuNodes(3, 2)...)
	c.startTrainingOperator()
	gangs := c.observeGangsBy(v1alpha1.PodGroupLabel, map[string]int{"tf-a": 5, "tf-b": 5})

	job := []tfReplicas{{"Chief", 1, 1}, {"Worker", 3, 1}, {"PS", 1, 0}}
	c.createTFJob("tf-a", job...)
	c.createTFJob("tf-b", job...)

	var winner, loser string
	c.waitFor("one of tf-a and tf-b bound whole", 90*time.Second, func() (bool, error) {
		for _, name := range []string{"tf-a", "tf-b"} {
			if pods := c.podsLabelled(v1alpha1.PodGroupLabel, name); len(pods) == 5 && countBound(pods) == 5 {
				winner = name
				return true, nil
			}
		}
		return false, nil
	})
	loser = map[string]string{"tf-a": "tf-b", "tf-b": "tf-a"}[winner]
	c.waitPodsUnschedulable("TFJob "+loser, v1alpha1.PodGroupLabel, loser, 5, 60*time.Second)

	err := c.dyn.Resource(tfJobResource).Namespace(c.ns).Delete(c.ctx, winner, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		t.Fatal(err)
	}
	c.waitPodsBound("TFJob "+loser, v1alpha1.PodGroupLabel, loser, 5, 90*time.Second)
	c.waitFor("the deleted TFJob's pods and PodGroup gone", 60*time.Second, func() (bool, error) {
		_, err := c.podGroups().Get(c.ctx, c.ns, winner)
		return len(c.podsLabelled(v1alpha1.PodGroupLabel, winner)) == 0 && apierrors.IsNotFound(err), nil
	})
	gangs.check(t, 5*time.Second)
}

// rotatorCertDir reads the certificate directory the pinned operator's
// rotator hard-codes, so the test follows the tool's own constant.
func rotatorCertDir(t *testing.T, source string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(source, operatorCertDirSource))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`certDir\s*=\s*"([^"]+)"`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no certDir constant in the operator's %s: the pinned version changed how it finds its certificates", operatorCertDirSource)
	}
	return string(m[1])
}
