package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/controller/tfconfig"
)

// TestTFConfigController runs the TF_CONFIG controller against a real kube-apiserver and the real
// Job controller. Each subtest has its own namespace and its own controller, limited to it.
func TestTFConfigController(t *testing.T) {
	cp := controlplane.Start(t)
	client := cp.Client

	t.Run("Secret content", func(t *testing.T) {
		for _, tc := range []struct {
			n         int32
			subdomain string
			port      int32
		}{
			{n: 1, subdomain: "mnist", port: 2222},
			{n: 3, subdomain: "workers", port: 3333},
			{n: 64, subdomain: "mnist", port: 2222},
		} {
			t.Run(fmt.Sprintf("N=%d", tc.n), func(t *testing.T) {
				ns := cp.Namespace(t, "tfconfig-content")
				tfStartController(t, client, ns)
				job := tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", tc.n).Subdomain(tc.subdomain).ContainerPorts(tfjobPort(tc.port)).Obj())
				want := tfWorkers(ns, "mnist", tc.subdomain, tc.n, tc.port)
				secret := tfWaitForCluster(t, client, ns, "mnist", want)

				if !metav1.IsControlledBy(secret, job) {
					t.Errorf("Secret owner references = %+v, want a controller reference to Job %s", secret.OwnerReferences, job.UID)
				}
				if secret.Labels[tfconfig.JobLabel] != "mnist" || len(secret.Data) != 1 {
					t.Errorf("Secret labels %v and keys %d, want %s=mnist and only %q", secret.Labels, len(secret.Data), tfconfig.JobLabel, tfconfig.ClusterKey)
				}
				svc := tfWaitForService(t, client, ns, tc.subdomain)
				if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
					svc.Spec.Selector[batchv1.JobNameLabel] != "mnist" || !metav1.IsControlledBy(svc, job) {
					t.Errorf("Service %s = %+v (owners %+v), want headless, publishing not-ready addresses, selecting the Job's pods, owned by the Job",
						svc.Name, svc.Spec, svc.OwnerReferences)
				}
				if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != tc.port || svc.Spec.Ports[0].Name != tfconfig.PortName {
					t.Errorf("Service ports = %+v, want %s %d", svc.Spec.Ports, tfconfig.PortName, tc.port)
				}
			})
		}
	})

	t.Run("resize", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-resize")
		tfStartController(t, client, ns)
		tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 2).Obj())
		tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", 2, 2222))
		for _, n := range []int32{5, 3} {
			// Indexed Jobs may change completions together with parallelism. A merge patch does not
			// conflict with the Job controller's status updates.
			patch := fmt.Sprintf(`{"spec":{"parallelism":%d,"completions":%d}}`, n, n)
			if _, err := client.BatchV1().Jobs(ns).Patch(t.Context(), "mnist", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatalf("resizing to %d: %v", n, err)
			}
			tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", n, 2222))
		}
	})

	t.Run("deletion", func(t *testing.T) {
		for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationOrphan, metav1.DeletePropagationForeground} {
			t.Run(string(policy), func(t *testing.T) {
				ns := cp.Namespace(t, "tfconfig-delete")
				tfStartController(t, client, ns)
				tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 2).Obj())
				tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", 2, 2222))
				tfWaitForService(t, client, ns, "mnist")

				// No garbage collector runs here, and orphan propagation would strip owner references
				// anyway: the controller itself must delete what it made.
				if err := client.BatchV1().Jobs(ns).Delete(t.Context(), "mnist", metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
					t.Fatal(err)
				}
				tfPoll(t, "Secret and Service deleted", func(ctx context.Context) (bool, error) {
					_, errSecret := client.CoreV1().Secrets(ns).Get(ctx, "mnist-tf-config", metav1.GetOptions{})
					_, errSvc := client.CoreV1().Services(ns).Get(ctx, "mnist", metav1.GetOptions{})
					return apierrors.IsNotFound(errSecret) && apierrors.IsNotFound(errSvc), nil
				})
			})
		}
	})

	// The controller applies its Secret without reading it first. Whatever already has that name and
	// is not its own is left as it was: an apply that would change a field someone else set fails
	// (409), and one that merged into someone else's Secret is taken back.
	t.Run("foreign Secret", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			data map[string][]byte
			why  string // in the event
		}{
			{"another cluster", map[string][]byte{"cluster": []byte("written by hand")}, "conflict"},
			{"no cluster key", map[string][]byte{"password": []byte("hunter2")}, `holds the key "password"`},
			{"the same cluster", map[string][]byte{"cluster": []byte(tfWorkers("", "mnist", "mnist", 2, 2222))}, "wrote its data"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ns := cp.Namespace(t, "tfconfig-foreign-secret")
				if tc.name == "the same cluster" {
					tc.data["cluster"] = []byte(tfWorkers(ns, "mnist", "mnist", 2, 2222))
				}
				tfStartController(t, client, ns)
				foreign, err := client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Name: "mnist-tf-config", Labels: map[string]string{"team": "a"}},
					Data:       tc.data,
				}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 2).Obj())
				if msg := tfWaitForEventOn(t, client, ns, "Job", "mnist", corev1.EventTypeWarning, tfconfig.ReasonSecretConflict); !strings.Contains(msg, tc.why) {
					t.Errorf("%s event says %q, want it to say %q", tfconfig.ReasonSecretConflict, msg, tc.why)
				}
				tfWaitForService(t, client, ns, "mnist") // the Service does not depend on the Secret

				got, err := client.CoreV1().Secrets(ns).Get(t.Context(), "mnist-tf-config", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if !maps.EqualFunc(got.Data, foreign.Data, bytes.Equal) || !maps.Equal(got.Labels, foreign.Labels) || len(got.OwnerReferences) != 0 {
					t.Errorf("foreign Secret changed: data %q labels %v owners %+v; was data %q labels %v",
						got.Data, got.Labels, got.OwnerReferences, foreign.Data, foreign.Labels)
				}
				for _, e := range got.ManagedFields {
					if e.Manager == tfconfig.FieldManager {
						t.Errorf("the controller still owns fields of the foreign Secret: %s", e.FieldsV1.Raw)
					}
				}

				// Once the user removes it, the controller writes its own.
				if err := client.CoreV1().Secrets(ns).Delete(t.Context(), "mnist-tf-config", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", 2, 2222))
			})
		}
	})

	// The user deletes the controller's Secret and makes their own under its name. The controller,
	// which remembers its Secret's UID, never writes into the new one (with another cluster key its
	// apply would conflict; with other keys only, it would merge), and the Job's deletion leaves it.
	t.Run("a Secret replaced by the user", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			data map[string][]byte
		}{
			{"another cluster", map[string][]byte{"cluster": []byte("mine")}},
			{"other keys only", map[string][]byte{"password": []byte("hunter2")}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ns := cp.Namespace(t, "tfconfig-replaced")
				tfStartController(t, client, ns)
				tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 2).Obj())
				tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", 2, 2222))
				tfWaitForService(t, client, ns, "mnist")
				if err := client.CoreV1().Secrets(ns).Delete(t.Context(), "mnist-tf-config", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				users, err := client.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Name: "mnist-tf-config"}, Data: tc.data}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				// A change of the Job's metadata makes the controller apply again.
				patch := `{"metadata":{"annotations":{"example.com/touched":"yes"}}}`
				if _, err := client.BatchV1().Jobs(ns).Patch(t.Context(), "mnist", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
				tfWaitForEventOn(t, client, ns, "Job", "mnist", corev1.EventTypeWarning, tfconfig.ReasonSecretConflict)
				got, err := client.CoreV1().Secrets(ns).Get(t.Context(), "mnist-tf-config", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got.ResourceVersion != users.ResourceVersion {
					t.Errorf("the user's Secret was written (resourceVersion %s, made at %s): data %q labels %v owners %+v",
						got.ResourceVersion, users.ResourceVersion, got.Data, got.Labels, got.OwnerReferences)
				}

				if err := client.BatchV1().Jobs(ns).Delete(t.Context(), "mnist", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
					t.Fatal(err)
				}
				// The Service goes with the Job; once it has, the controller has run its cleanup.
				tfPoll(t, "Service deleted", func(ctx context.Context) (bool, error) {
					_, err := client.CoreV1().Services(ns).Get(ctx, "mnist", metav1.GetOptions{})
					return apierrors.IsNotFound(err), nil
				})
				got, err = client.CoreV1().Secrets(ns).Get(t.Context(), "mnist-tf-config", metav1.GetOptions{})
				if err != nil || !maps.EqualFunc(got.Data, tc.data, bytes.Equal) {
					t.Errorf("the user's Secret: %v, data %q; want it kept as made", err, got.Data)
				}
			})
		}
	})

	t.Run("foreign Service", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-foreign-service")
		tfStartController(t, client, ns)
		tfCheckForeignServiceKept(t, client, ns, "Job", "mnist", map[string]string{batchv1.JobNameLabel: "mnist"}, func() {
			tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 2).Obj())
		})
	})

	t.Run("bad Jobs", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-bad")
		tfStartController(t, client, ns)
		for _, tc := range []struct {
			name   string
			mutate func(*testobj.JobWrapper)
			reason string
		}{
			{"not-indexed", func(j *testobj.JobWrapper) { j.CompletionMode(batchv1.NonIndexedCompletion) }, tfconfig.ReasonNotIndexed},
			{"half-parallel", func(j *testobj.JobWrapper) { j.Parallelism(1) }, tfconfig.ReasonParallelismMismatch},
			{"no-subdomain", func(j *testobj.JobWrapper) { j.Subdomain("") }, tfconfig.ReasonMissingSubdomain},
			{"udp-port", func(j *testobj.JobWrapper) {
				j.ContainerPorts(corev1.ContainerPort{Name: tfconfig.PortName, ContainerPort: 2222, Protocol: corev1.ProtocolUDP})
			}, tfconfig.ReasonInvalidPort},
			{"master-role", func(j *testobj.JobWrapper) { j.Annotation(tfconfig.RoleAnnotation, "master") }, tfconfig.ReasonInvalidRole},
			{"two-chiefs", func(j *testobj.JobWrapper) {
				j.Annotation(tfconfig.RoleAnnotation, string(tfconfig.RoleChief))
			}, tfconfig.ReasonInvalidReplicas},
		} {
			t.Run(tc.name, func(t *testing.T) {
				job := tfIndexedJob(ns, tc.name, 2)
				tc.mutate(job)
				tfCreate(t, client.BatchV1().Jobs(ns).Create, job.Obj())
				tfWaitForEvent(t, client, ns, tc.name, corev1.EventTypeWarning, tc.reason)
				// The Event is recorded by the reconcile that decided not to write anything.
				if _, err := client.CoreV1().Secrets(ns).Get(t.Context(), tc.name+"-tf-config", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("Secret %s-tf-config: err %v, want NotFound", tc.name, err)
				}
				svcs, err := client.CoreV1().Services(ns).List(t.Context(), metav1.ListOptions{
					LabelSelector: labels.SelectorFromSet(labels.Set{tfconfig.JobLabel: tc.name}).String()})
				if err != nil || len(svcs.Items) != 0 {
					t.Errorf("Services made for %s: %d, %v; want none", tc.name, len(svcs.Items), err)
				}
			})
		}
	})

	t.Run("group", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-group")
		tfStartController(t, client, ns)
		member := func(name string, role tfconfig.Role, n int32) *batchv1.Job {
			job := tfIndexedJob(ns, name, n).Label(tfconfig.GroupLabel, "ps-mnist").
				Annotation(tfconfig.RoleAnnotation, string(role)).Annotation(tfconfig.GroupRolesAnnotation, "chief,evaluator,ps,worker")
			if role == tfconfig.RoleEvaluator {
				job.Subdomain("")
			}
			return job.Obj()
		}
		// Created one by one: no Secret may appear before the last role exists.
		tfCreate(t, client.BatchV1().Jobs(ns).Create, member("w", tfconfig.RoleWorker, 3))
		tfCreate(t, client.BatchV1().Jobs(ns).Create, member("c", tfconfig.RoleChief, 1))
		tfWaitForEvent(t, client, ns, "c", corev1.EventTypeNormal, tfconfig.ReasonWaitingForGroup)
		for _, name := range []string{"w", "c"} {
			if _, err := client.CoreV1().Secrets(ns).Get(t.Context(), name+"-tf-config", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Secret of %s written before the group was complete (err %v)", name, err)
			}
		}
		tfCreate(t, client.BatchV1().Jobs(ns).Create, member("p", tfconfig.RolePS, 2))
		tfCreate(t, client.BatchV1().Jobs(ns).Create, member("e", tfconfig.RoleEvaluator, 1))

		want := fmt.Sprintf(`{"chief":%s,"ps":%s,"worker":%s}`,
			tfAddrs(ns, "c", "c", 1, 2222), tfAddrs(ns, "p", "p", 2, 2222), tfAddrs(ns, "w", "w", 3, 2222))
		for _, name := range []string{"c", "p", "w", "e"} {
			tfWaitForCluster(t, client, ns, name, want)
		}
		for _, name := range []string{"c", "p", "w"} {
			tfWaitForService(t, client, ns, name)
		}
	})

	t.Run("restart changes nothing", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-restart")
		stop := tfStartController(t, client, ns)
		tfCreate(t, client.BatchV1().Jobs(ns).Create, tfIndexedJob(ns, "mnist", 3).Obj())
		secret := tfWaitForCluster(t, client, ns, "mnist", tfWorkers(ns, "mnist", "mnist", 3, 2222))
		svc := tfWaitForService(t, client, ns, "mnist")
		stop()

		before := tfReconcileCount(t, "synced")
		tfStartController(t, client, ns)
		// The new instance has reconciled the Job (the only one in its namespace) at least once.
		tfPoll(t, "a reconcile by the new controller", func(context.Context) (bool, error) {
			return tfReconcileCount(t, "synced") > before, nil
		})
		gotSecret, err := client.CoreV1().Secrets(ns).Get(t.Context(), "mnist-tf-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gotSvc, err := client.CoreV1().Services(ns).Get(t.Context(), "mnist", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if gotSecret.ResourceVersion != secret.ResourceVersion || gotSecret.UID != secret.UID {
			t.Errorf("Secret changed across the restart: resourceVersion %s → %s", secret.ResourceVersion, gotSecret.ResourceVersion)
		}
		if gotSvc.ResourceVersion != svc.ResourceVersion || gotSvc.UID != svc.UID {
			t.Errorf("Service changed across the restart: resourceVersion %s → %s", svc.ResourceVersion, gotSvc.ResourceVersion)
		}
	})
}

// tfCheckForeignServiceKept creates a Service that is not the controller's under name, selecting the
// pods by selector, then the 2-task workload kind/name (create). The controller says so with a
// ServiceConflict Event on the workload, writes the Secret all the same and leaves the Service alone.
func tfCheckForeignServiceKept(t *testing.T, client kubernetes.Interface, ns, kind, name string, selector map[string]string, create func()) {
	t.Helper()
	foreign, err := client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{ // not headless: pod hostnames would not resolve through it
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	create()
	tfWaitForEventOn(t, client, ns, kind, name, corev1.EventTypeWarning, tfconfig.ReasonServiceConflict)
	tfWaitForCluster(t, client, ns, name, tfWorkers(ns, name, name, 2, 2222))
	got, err := client.CoreV1().Services(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("foreign Service was modified: resourceVersion %s → %s", foreign.ResourceVersion, got.ResourceVersion)
	}
}

// tfStartController runs a controller limited to namespace ns until the test ends or stop is called,
// and returns once its caches have synced.
func tfStartController(t *testing.T, client kubernetes.Interface, ns string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := tfconfig.NewController(client, tfconfig.WithNamespace(ns), tfconfig.WithConflictRecheck(time.Second))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, 2) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("controller Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	tfPoll(t, "controller caches synced", func(context.Context) (bool, error) { return c.HasSynced(), nil })
	return stop
}

// tfIndexedJob is an opted-in Indexed Job of n tasks with subdomain name and a tfjob-port 2222.
func tfIndexedJob(ns, name string, n int32) *testobj.JobWrapper {
	return testobj.MakeJob(ns, name).Label(tfconfig.OptInLabel, "true").Indexed().Workers(n).BackoffLimit(0).
		Subdomain(name).RestartPolicy(corev1.RestartPolicyNever).Container(tfContainer())
}

// tfContainer is the TensorFlow container of tfIndexedJob and tfStatefulSet; no kubelet runs it.
func tfContainer() corev1.Container {
	return testobj.MakeContainer("tensorflow").Image("registry.k8s.io/pause:3.10").Ports(tfjobPort(2222)).Obj()
}

// tfjobPort is the container port named tfjob-port.
func tfjobPort(port int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: tfconfig.PortName, ContainerPort: port}
}

// tfCreate creates obj with create (a typed client's Create), or fails the test.
func tfCreate[T metav1.Object](t *testing.T, create func(context.Context, T, metav1.CreateOptions) (T, error), obj T) T {
	t.Helper()
	created, err := create(t.Context(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
	return created
}

// tfAddrs is the JSON list of the addresses of an n-task Job.
func tfAddrs(ns, job, subdomain string, n, port int32) string {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = fmt.Sprintf(`"%s-%d.%s.%s.svc:%d"`, job, i, subdomain, ns, port)
	}
	return "[" + strings.Join(addrs, ",") + "]"
}

func tfWorkers(ns, job, subdomain string, n, port int32) string {
	return `{"worker":` + tfAddrs(ns, job, subdomain, n, port) + `}`
}

func tfPoll(t *testing.T, what string, cond wait.ConditionWithContextFunc) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// tfWaitForCluster waits until the Secret of job holds exactly want, and returns it.
func tfWaitForCluster(t *testing.T, client kubernetes.Interface, ns, job, want string) *corev1.Secret {
	t.Helper()
	var secret *corev1.Secret
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := client.CoreV1().Secrets(ns).Get(ctx, job+tfconfig.SecretSuffix, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		secret, last = s, string(s.Data[tfconfig.ClusterKey])
		return last == want, nil
	})
	if err != nil {
		t.Fatalf("Secret %s/%s%s: cluster %q, want %q", ns, job, tfconfig.SecretSuffix, last, want)
	}
	return secret
}

func tfWaitForService(t *testing.T, client kubernetes.Interface, ns, name string) *corev1.Service {
	t.Helper()
	var svc *corev1.Service
	tfPoll(t, "Service "+name, func(ctx context.Context) (bool, error) {
		s, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		svc = s
		return err == nil, err
	})
	return svc
}

// tfWaitForEvent waits for an Event of the given type and reason about the Job named job.
func tfWaitForEvent(t *testing.T, client kubernetes.Interface, ns, job, eventType, reason string) {
	t.Helper()
	tfWaitForEventOn(t, client, ns, "Job", job, eventType, reason)
}

// tfWaitForEventOn waits for an Event of the given type and reason about the object kind/name, and
// returns its message.
func tfWaitForEventOn(t *testing.T, client kubernetes.Interface, ns, kind, name, eventType, reason string) string {
	t.Helper()
	var message string
	tfPoll(t, fmt.Sprintf("%s Event %s on %s %s", eventType, reason, kind, name), func(ctx context.Context) (bool, error) {
		events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == kind && e.Type == eventType && e.Reason == reason {
				message = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	return message
}

// tfReconcileCount reads muster_tfconfig_reconciles_total{result} from the process's registry
// (0 before the first reconcile registers a value).
func tfReconcileCount(t *testing.T, result string) float64 {
	t.Helper()
	values, _ := testutil.GetCounterValuesFromGatherer(legacyregistry.DefaultGatherer, "muster_tfconfig_reconciles_total",
		map[string]string{"result": result}, "result")
	return values[result]
}

// TestTFConfigControllerStatefulSet runs the TF_CONFIG controller against a real kube-apiserver and
// the real StatefulSet controller, which makes the pods whose names the Secret lists.
func TestTFConfigControllerStatefulSet(t *testing.T) {
	cp := controlplane.Start(t)
	client := cp.Client

	t.Run("Secret content and scaling", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-sts")
		tfStartController(t, client, ns)
		set := tfCreate(t, client.AppsV1().StatefulSets(ns).Create, tfStatefulSet(ns, "tf", 3).ServiceName("peers").ContainerPorts(tfjobPort(3333)).Obj())
		secret := tfWaitForCluster(t, client, ns, "tf", tfWorkers(ns, "tf", "peers", 3, 3333))
		if !metav1.IsControlledBy(secret, set) || secret.Labels[tfconfig.JobLabel] != "tf" || len(secret.Data) != 1 || secret.Type != corev1.SecretTypeOpaque {
			t.Errorf("Secret = labels %v, owners %+v, %d keys, type %s; want labelled, controlled by the StatefulSet, only %q, Opaque",
				secret.Labels, secret.OwnerReferences, len(secret.Data), secret.Type, tfconfig.ClusterKey)
		}
		svc := tfWaitForService(t, client, ns, "peers")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses || !maps.Equal(svc.Spec.Selector, set.Spec.Selector.MatchLabels) ||
			!metav1.IsControlledBy(svc, set) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 3333 {
			t.Errorf("Service = %+v (owners %+v), want headless, publishing not-ready addresses, selecting %v on port 3333, controlled by the StatefulSet",
				svc.Spec, svc.OwnerReferences, set.Spec.Selector.MatchLabels)
		}
		// The real StatefulSet controller's pods: pod i is task i, and its DNS name is task i's address.
		tfCheckStatefulSetPods(t, client, set, svc, secret, 3)

		for _, n := range []int32{5, 2} {
			tfScaleStatefulSet(t, client, ns, "tf", n)
			tfWaitForCluster(t, client, ns, "tf", tfWorkers(ns, "tf", "peers", n, 3333))
		}
		tfWaitForEventOn(t, client, ns, "StatefulSet", "tf", corev1.EventTypeNormal, tfconfig.ReasonSecretUpdated)

		// Scaled to zero, the Secret is kept for the scale-up.
		tfScaleStatefulSet(t, client, ns, "tf", 0)
		tfWaitForEventOn(t, client, ns, "StatefulSet", "tf", corev1.EventTypeNormal, tfconfig.ReasonScaledToZero)
		tfWaitForCluster(t, client, ns, "tf", tfWorkers(ns, "tf", "peers", 2, 3333))
		tfScaleStatefulSet(t, client, ns, "tf", 4)
		tfWaitForCluster(t, client, ns, "tf", tfWorkers(ns, "tf", "peers", 4, 3333))
	})

	t.Run("the shipped example", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-sts-example")
		tfStartController(t, client, ns)
		data, err := manifests.FS.ReadFile("examples/mnist-mwms-statefulset.yaml")
		if err != nil {
			t.Fatal(err)
		}
		set := &appsv1.StatefulSet{}
		if err := yaml.UnmarshalStrict(data, set); err != nil {
			t.Fatal(err)
		}
		set.Namespace = ns
		set = tfCreate(t, client.AppsV1().StatefulSets(ns).Create, set)
		n := *set.Spec.Replicas
		secret := tfWaitForCluster(t, client, ns, set.Name, tfWorkers(ns, set.Name, set.Spec.ServiceName, n, 2222))
		svc := tfWaitForService(t, client, ns, set.Spec.ServiceName)
		tfCheckStatefulSetPods(t, client, set, svc, secret, n)
	})

	t.Run("foreign Service", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-sts-foreign-service")
		tfStartController(t, client, ns)
		tfCheckForeignServiceKept(t, client, ns, "StatefulSet", "tf", map[string]string{"app": "tf"}, func() {
			tfCreate(t, client.AppsV1().StatefulSets(ns).Create, tfStatefulSet(ns, "tf", 2).Obj())
		})
	})

	t.Run("no serviceName", func(t *testing.T) {
		ns := cp.Namespace(t, "tfconfig-sts-no-service")
		tfStartController(t, client, ns)
		tfCreate(t, client.AppsV1().StatefulSets(ns).Create, tfStatefulSet(ns, "tf", 2).ServiceName("").Obj())
		msg := tfWaitForEventOn(t, client, ns, "StatefulSet", "tf", corev1.EventTypeWarning, tfconfig.ReasonMissingServiceName)
		if !strings.Contains(msg, "spec.serviceName") {
			t.Errorf("%s event says %q, want it to name spec.serviceName", tfconfig.ReasonMissingServiceName, msg)
		}
		// The Event is recorded by the reconcile that decided not to write anything.
		if _, err := client.CoreV1().Secrets(ns).Get(t.Context(), "tf-tf-config", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret tf-tf-config: err %v, want NotFound", err)
		}
		svcs, err := client.CoreV1().Services(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(svcs.Items) != 0 {
			t.Errorf("Services: %d, %v; want none", len(svcs.Items), err)
		}
	})

	for _, leave := range []string{"deleted", "opted out"} {
		t.Run(leave, func(t *testing.T) {
			ns := cp.Namespace(t, "tfconfig-sts-cleanup")
			tfStartController(t, client, ns)
			tfCreate(t, client.AppsV1().StatefulSets(ns).Create, tfStatefulSet(ns, "tf", 2).Obj())
			tfWaitForCluster(t, client, ns, "tf", tfWorkers(ns, "tf", "tf", 2, 2222))
			tfWaitForService(t, client, ns, "tf")
			var err error
			if leave == "deleted" {
				err = client.AppsV1().StatefulSets(ns).Delete(t.Context(), "tf", metav1.DeleteOptions{})
			} else {
				patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, tfconfig.OptInLabel)
				_, err = client.AppsV1().StatefulSets(ns).Patch(t.Context(), "tf", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			tfPoll(t, "Secret and Service deleted", func(ctx context.Context) (bool, error) {
				_, errSecret := client.CoreV1().Secrets(ns).Get(ctx, "tf-tf-config", metav1.GetOptions{})
				_, errSvc := client.CoreV1().Services(ns).Get(ctx, "tf", metav1.GetOptions{})
				return apierrors.IsNotFound(errSecret) && apierrors.IsNotFound(errSvc), nil
			})
		})
	}
}

// tfStatefulSet is an opted-in Parallel StatefulSet of n pods with serviceName name, selecting its pods
// by app=name, with a tfjob-port 2222. No scheduler runs: its pods stay pending, which is all the
// controller needs.
func tfStatefulSet(ns, name string, n int32) *testobj.StatefulSetWrapper {
	return testobj.MakeStatefulSet(ns, name).Label(tfconfig.OptInLabel, "true").Replicas(n).ServiceName(name).
		PodManagementPolicy(appsv1.ParallelPodManagement).SelectPods(map[string]string{"app": name}).Container(tfContainer())
}

func tfScaleStatefulSet(t *testing.T, client kubernetes.Interface, ns, name string, n int32) {
	t.Helper()
	// Through the scale subresource, as kubectl scale and the HorizontalPodAutoscaler do; the
	// StatefulSet controller's status updates make a read-then-write conflict now and then.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		scale, err := client.AppsV1().StatefulSets(ns).GetScale(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		scale.Spec.Replicas = n
		_, err = client.AppsV1().StatefulSets(ns).UpdateScale(t.Context(), name, scale, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("scaling StatefulSet %s to %d: %v", name, n, err)
	}
}

// tfCheckStatefulSetPods waits for the n pods the StatefulSet controller makes and checks each against
// the Secret and the Service: the Service selects it, and the TF_CONFIG its container would get (the
// kubelet's own expansion, over the pod as the API server holds it) makes it task i at its own address.
func tfCheckStatefulSetPods(t *testing.T, client kubernetes.Interface, set *appsv1.StatefulSet, svc *corev1.Service, secret *corev1.Secret, n int32) {
	t.Helper()
	var pods []corev1.Pod
	tfPoll(t, fmt.Sprintf("%d pods of StatefulSet %s", n, set.Name), func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(set.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(set.Spec.Selector.MatchLabels).String()})
		if err != nil {
			return false, err
		}
		pods = list.Items
		return len(pods) == int(n), nil
	})
	var cluster struct{ Worker []string }
	if err := json.Unmarshal(secret.Data[tfconfig.ClusterKey], &cluster); err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		pod := &pods[i]
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			t.Errorf("Service %s (selector %v) does not select pod %s (labels %v)", svc.Name, svc.Spec.Selector, pod.Name, pod.Labels)
		}
		index, err := strconv.Atoi(pod.Labels[appsv1.PodIndexLabel])
		if err != nil || index >= len(cluster.Worker) {
			t.Errorf("pod %s: label %s = %q, want an index below %d", pod.Name, appsv1.PodIndexLabel, pod.Labels[appsv1.PodIndexLabel], len(cluster.Worker))
			continue
		}
		self := fmt.Sprintf("%s.%s.%s.svc:", pod.Spec.Hostname, pod.Spec.Subdomain, pod.Namespace)
		if !strings.HasPrefix(cluster.Worker[index], self) {
			t.Errorf("pod %s (index %d) resolves as %s…, but the cluster lists %s for task %d", pod.Name, index, self, cluster.Worker[index], index)
		}
		if !slices.ContainsFunc(pod.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "TF_CONFIG" }) {
			continue // a test StatefulSet without the env
		}
		tfConfig, err := tfconfig.TFConfigForPod(pod, pod.Spec.Containers[0].Name, secret.Data)
		if err != nil {
			t.Errorf("pod %s: %v", pod.Name, err)
			continue
		}
		if err := tfconfig.ValidateTFConfig(tfConfig); err != nil {
			t.Errorf("pod %s: TF_CONFIG %s: %v", pod.Name, tfConfig, err)
		}
		if want := fmt.Sprintf(`"task":{"type":"worker","index":%d}`, index); !strings.Contains(tfConfig, want) {
			t.Errorf("pod %s: TF_CONFIG %s, want %s", pod.Name, tfConfig, want)
		}
	}
}
