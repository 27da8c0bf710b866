package tfconfig

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
)

const (
	exampleManifest    = "../../../manifests/examples/mnist-mwms.yaml"
	statefulSetExample = "../../../manifests/examples/mnist-mwms-statefulset.yaml"
)

// loadManifest decodes every document of a YAML file strictly (unknown or duplicate fields fail).
func loadManifest(t *testing.T, path string) []runtime.Object {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []runtime.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		objs = append(objs, obj)
	}
}

// apiServerDefaults applies what the API server adds to a Job and its template that matters here.
func apiServerDefaults(job *batchv1.Job, namespace string) {
	job.Namespace = namespace
	job.UID = types.UID("uid-" + namespace + "-" + job.Name)
	if job.Spec.Template.Labels == nil {
		job.Spec.Template.Labels = map[string]string{}
	}
	job.Spec.Template.Labels[batchv1.JobNameLabel] = job.Name
	job.Spec.Template.Labels[batchv1.ControllerUidLabel] = string(job.UID)
	for i := range job.Spec.Template.Spec.Containers {
		for j := range job.Spec.Template.Spec.Containers[i].Ports {
			if job.Spec.Template.Spec.Containers[i].Ports[j].Protocol == "" {
				job.Spec.Template.Spec.Containers[i].Ports[j].Protocol = corev1.ProtocolTCP
			}
		}
	}
}

// podFromTemplate is the pod a workload controller makes from tmpl: a copy of its metadata and spec,
// named name in namespace.
func podFromTemplate(tmpl *corev1.PodTemplateSpec, namespace, name string) *corev1.Pod {
	copied := tmpl.DeepCopy()
	pod := &corev1.Pod{ObjectMeta: copied.ObjectMeta, Spec: copied.Spec}
	pod.Namespace, pod.Name = namespace, name
	return pod
}

// podForIndex builds the pod the Job controller (v1.37, pkg/controller/job) creates for index i:
// index annotation and label, hostname <job>-<i>, and JOB_COMPLETION_INDEX appended to every
// container's env unless the container already declares it.
func podForIndex(job *batchv1.Job, i int) *corev1.Pod {
	pod := podFromTemplate(&job.Spec.Template, job.Namespace, fmt.Sprintf("%s-%d-x7k2p", job.Name, i))
	metav1.SetMetaDataLabel(&pod.ObjectMeta, batchv1.JobCompletionIndexAnnotation, strconv.Itoa(i))
	metav1.SetMetaDataAnnotation(&pod.ObjectMeta, batchv1.JobCompletionIndexAnnotation, strconv.Itoa(i))
	pod.Spec.Hostname = fmt.Sprintf("%s-%d", job.Name, i)
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for c := range cs {
			if !slices.ContainsFunc(cs[c].Env, func(e corev1.EnvVar) bool { return e.Name == "JOB_COMPLETION_INDEX" }) {
				cs[c].Env = append(cs[c].Env, corev1.EnvVar{Name: "JOB_COMPLETION_INDEX", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: fmt.Sprintf("metadata.labels['%s']", batchv1.JobCompletionIndexAnnotation)},
				}})
			}
		}
	}
	return pod
}

// TestExampleTFConfig runs the shipped example through the controller and the kubelet's expansion
// code for every index, and checks what TensorFlow would read.
func TestExampleTFConfig(t *testing.T) {
	const ns = "team-a"
	var job *batchv1.Job
	var svc *corev1.Service
	for _, obj := range loadManifest(t, exampleManifest) {
		switch o := obj.(type) {
		case *batchv1.Job:
			job = o
		case *corev1.Service:
			svc = o
		default:
			t.Fatalf("unexpected %T in the example", obj)
		}
	}
	if job == nil || svc == nil {
		t.Fatalf("the example should hold a Job and a Service")
	}
	apiServerDefaults(job, ns)
	svc.Namespace = ns
	if job.Labels[OptInLabel] != "true" || job.Spec.Template.Spec.SchedulerName != "muster" {
		t.Errorf("the example Job must opt in (%s) and use schedulerName muster", OptInLabel)
	}

	// The controller, on the example as applied: the user's Service is accepted as it is.
	f := newFixture(t, job, svc)
	if result, writes := f.sync(ns, job.Name); result != resultSynced || !slices.Equal(writes, []string{"apply secrets mnist-tf-config"}) {
		t.Fatalf("sync: result %s, writes %v, events %v; want the Secret applied and nothing else", result, writes, f.drainEvents())
	}
	secret := f.secret(ns, SecretName(job.Name))

	n := int(*job.Spec.Completions)
	sub := job.Spec.Template.Spec.Subdomain
	port, err := tfPort(&job.Spec.Template.Spec)
	if err != nil {
		t.Fatal(err)
	}
	// DNS: pod hostname <job>-<i> under a headless Service named like the subdomain, selecting the pods.
	if svc.Name != sub || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s (clusterIP %q) should be headless and named like the subdomain %s", svc.Name, svc.Spec.ClusterIP, sub)
	}
	if ok, why := serviceServes(svc, jobWorkload{job}); !ok {
		t.Errorf("the example's Service does not serve the Job: %s", why)
	}
	for i := range n {
		checkWorkerTFConfig(t, podForIndex(job, i), i, n, port, secret.Data)
	}
}

// checkWorkerTFConfig computes the TF_CONFIG of the container "tensorflow" of pod, task i of n workers,
// with the kubelet's expansion code, and checks it against TensorFlow's rules and the naming scheme:
// worker j is <name>-<j>.<subdomain>.<namespace>.svc:<port>, and the pod's own address is its DNS name.
func checkWorkerTFConfig(t *testing.T, pod *corev1.Pod, i, n int, port int32, secretData map[string][]byte) {
	t.Helper()
	tfConfig, err := TFConfigForPod(pod, "tensorflow", secretData)
	if err != nil {
		t.Fatalf("index %d: %v", i, err)
	}
	if err := ValidateTFConfig(tfConfig); err != nil {
		t.Errorf("index %d: TF_CONFIG %s: %v", i, tfConfig, err)
	}
	var cfg struct {
		Cluster map[string][]string
		Task    struct {
			Type  string
			Index int
		}
	}
	if err := json.Unmarshal([]byte(tfConfig), &cfg); err != nil {
		t.Fatalf("index %d: %v", i, err)
	}
	if cfg.Task.Type != "worker" || cfg.Task.Index != i {
		t.Errorf("index %d: task = %+v, want worker %d", i, cfg.Task, i)
	}
	if len(cfg.Cluster) != 1 || len(cfg.Cluster["worker"]) != n {
		t.Fatalf("index %d: cluster = %v, want %d workers and nothing else", i, cfg.Cluster, n)
	}
	name := strings.TrimSuffix(pod.Spec.Hostname, "-"+strconv.Itoa(i))
	for j, addr := range cfg.Cluster["worker"] {
		if want := fmt.Sprintf("%s-%d.%s.%s.svc:%d", name, j, pod.Spec.Subdomain, pod.Namespace, port); addr != want {
			t.Errorf("index %d: worker %d address %q, want %q", i, j, addr, want)
		}
	}
	// The task's own address is the pod's own DNS name, and its port is the one the container exposes.
	own := cfg.Cluster["worker"][i]
	if want := fmt.Sprintf("%s.%s.%s.svc:%d", pod.Spec.Hostname, pod.Spec.Subdomain, pod.Namespace, port); own != want {
		t.Errorf("index %d: own address %s, want %s", i, own, want)
	}
}

// podForOrdinal builds the pod the StatefulSet controller (v1.37, pkg/controller/statefulset,
// newStatefulSetPod and initIdentity) creates for ordinal i: name and hostname <set>-<i>, subdomain
// the serviceName, the template's labels plus the pod-name and pod-index labels. It adds no env.
func podForOrdinal(set *appsv1.StatefulSet, i int) *corev1.Pod {
	pod := podFromTemplate(&set.Spec.Template, set.Namespace, fmt.Sprintf("%s-%d", set.Name, i))
	metav1.SetMetaDataLabel(&pod.ObjectMeta, appsv1.StatefulSetPodNameLabel, pod.Name)
	metav1.SetMetaDataLabel(&pod.ObjectMeta, appsv1.PodIndexLabel, strconv.Itoa(i))
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = set.Spec.ServiceName
	return pod
}

// TestStatefulSetExampleTFConfig runs the shipped StatefulSet example through the controller and the
// kubelet's expansion code for every pod, and checks what TensorFlow would read.
func TestStatefulSetExampleTFConfig(t *testing.T) {
	const ns = "team-a"
	var set *appsv1.StatefulSet
	for _, obj := range loadManifest(t, statefulSetExample) {
		o, ok := obj.(*appsv1.StatefulSet)
		if !ok || set != nil {
			t.Fatalf("the example should hold one StatefulSet and nothing else, found %T", obj)
		}
		set = o
	}
	if set == nil {
		t.Fatalf("the example should hold a StatefulSet")
	}
	set.Namespace, set.UID = ns, types.UID("uid-"+ns+"-"+set.Name)
	for i := range set.Spec.Template.Spec.Containers {
		for j := range set.Spec.Template.Spec.Containers[i].Ports {
			set.Spec.Template.Spec.Containers[i].Ports[j].Protocol = corev1.ProtocolTCP
		}
	}
	spec := set.Spec.Template.Spec
	if set.Labels[OptInLabel] != "true" || spec.SchedulerName != "muster" || set.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("the example StatefulSet must opt in (%s), use schedulerName muster and podManagementPolicy Parallel (a gang)", OptInLabel)
	}
	if len(spec.InitContainers) != 0 {
		t.Errorf("the example still has init containers %v: TF_CONFIG needs none", spec.InitContainers)
	}
	if gpus := spec.Containers[0].Resources.Limits[configv1.DefaultGPUResourceName]; gpus.Value() < 1 {
		t.Errorf("the example's workers ask for no GPU")
	}

	// The controller, on the example as applied: it writes the Secret and the headless Service.
	f := newFixture(t, set)
	want := []string{"apply secrets " + SecretName(set.Name), "create services " + set.Spec.ServiceName}
	if result, writes := f.syncSet(ns, set.Name); result != resultSynced || !slices.Equal(writes, want) {
		t.Fatalf("sync: result %s, writes %v, events %v; want %v", result, writes, f.drainEvents(), want)
	}
	secret := f.secret(ns, SecretName(set.Name))
	svc := f.service(ns, set.Spec.ServiceName)
	port, err := tfPort(&spec)
	if err != nil {
		t.Fatal(err)
	}
	n := int(*set.Spec.Replicas)
	for i := range n {
		pod := podForOrdinal(set, i)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			t.Errorf("the Service %s (selector %v) does not select pod %s", svc.Name, svc.Spec.Selector, pod.Name)
		}
		checkWorkerTFConfig(t, pod, i, n, port, secret.Data)
	}
}

// TestJobControllerAppendTrap shows why the example declares JOB_COMPLETION_INDEX first: left to the
// Job controller, it is appended after TF_CONFIG and $(JOB_COMPLETION_INDEX) stays unexpanded.
func TestJobControllerAppendTrap(t *testing.T) {
	job := makeJob("ns", "mnist", 2).Obj()
	job.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "TF_CLUSTER_SPEC", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "mnist-tf-config"}, Key: ClusterKey}}},
		{Name: "TF_CONFIG", Value: `{"cluster":$(TF_CLUSTER_SPEC),"task":{"type":"worker","index":$(JOB_COMPLETION_INDEX)}}`},
	}
	data := map[string][]byte{ClusterKey: []byte(`{"worker":["mnist-0.mnist.ns.svc:2222","mnist-1.mnist.ns.svc:2222"]}`)}
	got, err := TFConfigForPod(podForIndex(job, 1), "tensorflow", data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, `"index":$(JOB_COMPLETION_INDEX)`) {
		t.Errorf("TF_CONFIG = %s, want the index reference left unexpanded", got)
	}
	if err := ValidateTFConfig(got); err == nil {
		t.Errorf("ValidateTFConfig(%s) succeeded, want a JSON error", got)
	}
}

func TestTFConfigForPod(t *testing.T) {
	secretRef := func(key string, optional bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: key, Optional: ptr.To(optional)}}
	}
	data := map[string][]byte{"cluster": []byte(`{"worker":["a:1"]}`), "other": []byte("$(ROLE)")}
	tests := []struct {
		name    string
		envFrom []corev1.EnvFromSource
		env     []corev1.EnvVar
		want    string
		wantErr string
	}{
		{
			name: "fieldRef and secretKeyRef before use",
			env: []corev1.EnvVar{
				{Name: "I", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['idx']"}}},
				{Name: "C", ValueFrom: secretRef("cluster", false)},
				{Name: "TF_CONFIG", Value: `{"cluster":$(C),"task":{"type":"worker","index":$(I)}}`},
			},
			want: `{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}`,
		},
		{
			name:    "envFrom secret with a prefix",
			envFrom: []corev1.EnvFromSource{{Prefix: "TF_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}},
			env:     []corev1.EnvVar{{Name: "TF_CONFIG", Value: `{"cluster":$(TF_cluster)}`}},
			want:    `{"cluster":{"worker":["a:1"]}}`,
		},
		{
			name: "secret text is not expanded again, $$ escapes",
			env: []corev1.EnvVar{
				{Name: "ROLE", Value: "worker"},
				{Name: "O", ValueFrom: secretRef("other", false)},
				{Name: "TF_CONFIG", Value: `$(O) $$(ROLE) $(ROLE) $(UNDEFINED)`},
			},
			want: `$(ROLE) $(ROLE) worker $(UNDEFINED)`,
		},
		{
			name: "later declarations are not visible",
			env: []corev1.EnvVar{
				{Name: "TF_CONFIG", Value: `$(LATER)`},
				{Name: "LATER", Value: "x"},
			},
			want: `$(LATER)`,
		},
		{
			name: "optional sources that cannot be resolved are skipped",
			env: []corev1.EnvVar{
				{Name: "M", ValueFrom: secretRef("missing", true)},
				{Name: "CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k", Optional: ptr.To(true)}}},
				{Name: "TF_CONFIG", Value: `$(M)$(CM)`},
			},
			want: `$(M)$(CM)`,
		},
		{
			name:    "missing secret key",
			env:     []corev1.EnvVar{{Name: "C", ValueFrom: secretRef("missing", false)}, {Name: "TF_CONFIG", Value: "x"}},
			wantErr: "couldn't find key missing",
		},
		{
			name:    "configMap",
			env:     []corev1.EnvVar{{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}}},
			wantErr: "resolved offline",
		},
		{
			name:    "no TF_CONFIG",
			env:     []corev1.EnvVar{{Name: "X", Value: "1"}},
			wantErr: "does not set TF_CONFIG",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			pod.Annotations = map[string]string{"idx": "0"}
			pod.Spec.Containers = []corev1.Container{{Name: "tf", EnvFrom: tc.envFrom, Env: tc.env}}
			got, err := TFConfigForPod(pod, "tf", data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := TFConfigForPod(&corev1.Pod{}, "nope", nil); err == nil {
		t.Errorf("unknown container: want an error")
	}
}

func TestValidateTFConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"worker", `{"cluster":{"worker":["a-0.s.ns.svc:2222","a-1.s.ns.svc:2222"]},"task":{"type":"worker","index":1}}`, ""},
		{"index as a string", `{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":"0"}}`, ""},
		{"evaluator outside the cluster", `{"cluster":{"worker":["a:1"]},"task":{"type":"evaluator","index":0}}`, ""},
		{"no cluster, no task: local", `{}`, ""},
		{"unexpanded reference", `{"cluster":$(TF_CLUSTER_SPEC),"task":{"type":"worker","index":0}}`, "not a JSON object"},
		{"trailing data", `{"cluster":{}} x`, "trailing"},
		{"legacy master", `{"cluster":{"master":["a:1"]},"task":{"type":"master","index":0}}`, "not a TensorFlow task type"},
		{"two chiefs", `{"cluster":{"chief":["a:1","b:1"]},"task":{"type":"chief","index":0}}`, "allows one"},
		{"index out of range", `{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":1}}`, "out of range"},
		{"negative index", `{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":-1}}`, "non-negative"},
		{"task type not in cluster", `{"cluster":{"worker":["a:1"]},"task":{"type":"ps","index":0}}`, "out of range"},
		{"no port", `{"cluster":{"worker":["a"]},"task":{"type":"worker","index":0}}`, "host:port"},
		{"bad port", `{"cluster":{"worker":["a:0"]},"task":{"type":"worker","index":0}}`, "port"},
		{"bad host", `{"cluster":{"worker":["A_b:1"]},"task":{"type":"worker","index":0}}`, "DNS"},
		{"cluster without task", `{"cluster":{"worker":["a:1"]}}`, "no task"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateTFConfig(tc.in)
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("ValidateTFConfig: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ValidateTFConfig = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
