// Package demo runs muster's main job end to end on an in-process control
// plane: a small GPU cluster, the muster scheduler and the TF_CONFIG
// controller, and TensorFlow jobs submitted as users would.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/internal/testobj"
	"github.com/muster-sched/muster/manifests"
	configv1 "github.com/muster-sched/muster/pkg/apis/config/v1"
	"github.com/muster-sched/muster/pkg/controller/tfconfig"
	"github.com/muster-sched/muster/pkg/gang"
	"github.com/muster-sched/muster/pkg/kubectlmuster"
)

// Options configure a demo run.
type Options struct {
	Out io.Writer
	// Logs receives the control plane's and scheduler's logs (discarded when nil).
	Logs io.Writer
}

// Run starts the control plane, a 2 racks × 4 nodes × 8 GPUs cluster, the
// scheduler and the controller, submits the shipped MNIST example and prints
// where each worker landed and the TF_CONFIG it would read; then submits a
// gang too big for a rack and runs `kubectl muster gangs` and `kubectl
// muster explain` on it.
func Run(ctx context.Context, opts Options) error {
	out := opts.Out
	tb := &controlplane.ProcessTB{Output: routeLogs(opts.Logs)}
	defer tb.Close()

	start := time.Now()
	fmt.Fprintln(out, "muster demo: starting etcd, kube-apiserver and the Job and StatefulSet controllers in this process...")
	cp := controlplane.Start(tb)
	nodes := testobj.Cluster(2, 4, 1, 8)
	if err := controlplane.CreateNodes(ctx, cp.Client, nodes...); err != nil {
		return err
	}
	fmt.Fprintf(out, "control plane up in %s; created %d nodes (2 racks × 4 nodes × 8 nvidia.com/gpu)\n", time.Since(start).Round(time.Millisecond), len(nodes))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	schedDone, err := cp.StartScheduler(ctx)
	if err != nil {
		return err
	}
	defer func() { cancel(); <-schedDone }()
	controller := tfconfig.NewController(cp.Client)
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- controller.Run(ctx, 2) }()
	defer func() { cancel(); <-ctrlDone }()
	fmt.Fprintln(out, "muster scheduler (profile \"muster\", config manifests/scheduler/scheduler-config.yaml) and TF_CONFIG controller running")

	ns := cp.Namespace(tb, "team-a")
	job, err := applyExample(ctx, cp, ns)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nsubmitted %s: Indexed Job %s/%s, %d workers × 1 nvidia.com/gpu, schedulerName: muster\n",
		manifests.MNISTExample, ns, job.Name, *job.Spec.Parallelism)

	pods, err := waitBound(ctx, cp, ns, job.Name, int(*job.Spec.Parallelism))
	if err != nil {
		return err
	}
	secret, err := waitSecret(ctx, cp, ns, tfconfig.SecretName(job.Name))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "all %d workers bound in %s (as one gang)\n\n", len(pods), time.Since(start).Round(time.Millisecond))
	if err := printPlacement(out, cp, ctx, pods, secret); err != nil {
		return err
	}
	return explainUnschedulable(ctx, out, cp, ns)
}

// explainUnschedulable submits a gang that cannot fit on purpose (5 workers
// of 8 GPUs in one rack of 4 nodes) and shows what kubectl muster says
// about it: the gangs, then the explanation.
func explainUnschedulable(ctx context.Context, out io.Writer, cp *controlplane.ControlPlane, ns string) error {
	const name = "too-big"
	job := testobj.MakeJob(ns, name).Indexed().Workers(5).BackoffLimit(0).
		PodSpec(testobj.WorkerPodSpec("muster", 8)).PodAnnotation(gang.AnnotationTopologyRequired, "rack").Obj()
	if _, err := cp.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nsubmitted Job %s/%s: 5 workers × 8 nvidia.com/gpu, muster.dev/topology-required: rack (a rack has 4 nodes)\n", ns, name)
	if err := waitUnschedulable(ctx, cp, ns, name, 5); err != nil {
		return err
	}
	for _, args := range [][]string{{"gangs"}, {"explain", "job/" + name}} {
		fmt.Fprintf(out, "\n$ kubectl muster %s -n %s\n", strings.Join(args, " "), ns)
		// The plugin's notes (APIs this demo's API server does not serve)
		// are left out; an error is returned and printed.
		cmd := kubectlmuster.NewCommand(genericiooptions.IOStreams{In: strings.NewReader(""), Out: out, ErrOut: io.Discard})
		cmd.SetArgs(append([]string{"--kubeconfig", cp.Kubeconfig, "--namespace", ns}, args...))
		if err := cmd.ExecuteContext(ctx); err != nil {
			return fmt.Errorf("kubectl muster %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}

// waitUnschedulable waits until the Job's want pods all have
// PodScheduled=False: muster has looked at the gang and said why it waits.
func waitUnschedulable(ctx context.Context, cp *controlplane.ControlPlane, ns, job string, want int) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			return false, err
		}
		refused := 0
		for _, p := range list.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					refused++
				}
			}
		}
		return len(list.Items) == want && refused == want, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the %d workers of %s to be reported unschedulable: %w", want, job, err)
	}
	return nil
}

func applyExample(ctx context.Context, cp *controlplane.ControlPlane, ns string) (*batchv1.Job, error) {
	data, err := manifests.FS.ReadFile(manifests.MNISTExample)
	if err != nil {
		return nil, err
	}
	var job *batchv1.Job
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		switch o := obj.(type) {
		case *corev1.Service:
			if _, err := cp.Client.CoreV1().Services(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		case *batchv1.Job:
			if job, err = cp.Client.BatchV1().Jobs(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unexpected %T in %s", obj, manifests.MNISTExample)
		}
	}
	if job == nil {
		return nil, fmt.Errorf("no Job in %s", manifests.MNISTExample)
	}
	return job, nil
}

func waitBound(ctx context.Context, cp *controlplane.ControlPlane, ns, job string, want int) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			return false, err
		}
		pods = list.Items
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return len(pods) == want && bound == want, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for %d workers of %s to be bound: %w", want, job, err)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods, nil
}

func waitSecret(ctx context.Context, cp *controlplane.ControlPlane, ns, name string) (*corev1.Secret, error) {
	var secret *corev1.Secret
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := cp.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		secret = s
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for Secret %s: %w", name, err)
	}
	return secret, nil
}

func printPlacement(out io.Writer, cp *controlplane.ControlPlane, ctx context.Context, pods []corev1.Pod, secret *corev1.Secret) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "WORKER\tINDEX\tNODE\tRACK\tGPUS")
	for _, p := range pods {
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		gpus := p.Spec.Containers[0].Resources.Limits[configv1.DefaultGPUResourceName]
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Annotations[batchv1.JobCompletionIndexAnnotation], p.Spec.NodeName,
			node.Labels[configv1.LabelRack], gpus.String())
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nSecret %s/%s (written by the TF_CONFIG controller), key cluster:\n  %s\n", secret.Namespace, secret.Name, secret.Data["cluster"])
	fmt.Fprintln(out, "\nTF_CONFIG each worker reads (the kubelet's $(VAR) expansion of the pod's env):")
	for _, p := range pods {
		tfConfig, err := tfconfig.TFConfigForPod(&p, p.Spec.Containers[0].Name, secret.Data)
		if err != nil {
			return fmt.Errorf("TF_CONFIG of %s: %w", p.Name, err)
		}
		fmt.Fprintf(out, "  %s: %s\n", p.Name, strings.TrimSpace(tfConfig))
	}
	return nil
}

// routeLogs sends klog output (the control plane's and the scheduler's) to w,
// or discards it when w is nil, and returns where it goes. Error lines go
// there too, not also to stderr (klog's default stderrthreshold): the
// embedded control plane logs a few at start-up that are not failures.
func routeLogs(w io.Writer) io.Writer {
	if w == nil {
		w = io.Discard
	}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(w)
	return w
}
