//go:build e2e

package integration

// End-to-end tests: the released binaries of tools that platform teams run
// beside muster (Kubeflow's training-operator, Kueue), built at pinned
// versions by test/e2e/tools, against the in-process control plane with the
// muster scheduler. `make e2e` runs them; they are behind the e2e build tag
// so that `make test` does not build the tools.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/test/e2e/tools"
)

var withoutMuster = flag.Bool("e2e-without-muster", false,
	"run the end-to-end tests without the muster scheduler, to see them fail: the tools' pods stay Pending")

// e2eCluster is a cluster with the garbage collector (the tools rely on
// owner references, as in a real cluster) and the tools started for a test.
type e2eCluster struct {
	*cluster
	dyn   dynamic.Interface
	tools []*toolProcess
}

// startE2ECluster starts a control plane with the garbage collector, the
// nodes and the muster scheduler (unless -e2e-without-muster).
func startE2ECluster(t *testing.T, nodes ...*corev1.Node) *e2eCluster {
	t.Helper()
	c := startClusterWithoutScheduler(t, nodes...)
	if err := c.StartGarbageCollector(); err != nil {
		t.Fatalf("garbage collector: %v", err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if *withoutMuster {
		t.Log("-e2e-without-muster: the muster scheduler is not started")
	} else {
		c.startScheduler()
	}
	return &e2eCluster{cluster: c, dyn: dyn}
}

// toolBinary builds the tool at its pinned version, or reuses the cached
// build; a tool that cannot be built fails the test with the reason.
func toolBinary(t *testing.T, tool tools.Tool) (binary, source string) {
	t.Helper()
	binary, build, err := tool.Binary()
	if err != nil {
		t.Fatalf("cannot build %s %s: %v", tool.Name, tool.Version, err)
	}
	t.Logf("%s: %s", tool.Name, build)
	if source, err = tool.SourceDir(); err != nil {
		t.Fatalf("source of %s %s: %v", tool.Name, tool.Version, err)
	}
	return binary, source
}

// toolProcess is a tool's binary running until the test ends, logging to a
// file in the test's temp dir.
type toolProcess struct {
	name string
	log  string
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// startTool runs binary with args and env (added to the test's), and stops
// it when the test ends; its log is printed if the test failed.
func (c *e2eCluster) startTool(name, binary string, env []string, args ...string) *toolProcess {
	c.t.Helper()
	logFile, err := os.Create(filepath.Join(c.t.TempDir(), name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting %s: %v", name, err)
	}
	p := &toolProcess{name: name, log: logFile.Name(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	c.tools = append(c.tools, p)
	c.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if c.t.Failed() {
			c.t.Logf("%s log %s (tail):\n%s", name, p.log, p.tail(12000))
		}
	})
	return p
}

// exited is an error once the process has ended: a tool must run until the
// test ends.
func (p *toolProcess) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log tail:\n%s", p.name, p.err, p.tail(3000))
	default:
		return nil
	}
}

// logHasLine reports whether one line of the log contains every part.
func (p *toolProcess) logHasLine(parts ...string) bool {
	data, _ := os.ReadFile(p.log)
	for _, line := range strings.Split(string(data), "\n") {
		if containsAll(line, parts...) {
			return true
		}
	}
	return false
}

func containsAll(s string, parts ...string) bool {
	for _, part := range parts {
		if !strings.Contains(s, part) {
			return false
		}
	}
	return true
}

func (p *toolProcess) tail(n int) string {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return tail(string(data), n)
}

// waitFor is cluster.waitFor that also fails at once when a tool has exited.
func (c *e2eCluster) waitFor(what string, timeout time.Duration, cond func() (bool, error)) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, p := range c.tools {
			if err := p.exited(); err != nil {
				return false, err
			}
		}
		return cond()
	})
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitPodsBound waits until the pods labelled key=value are want, all bound.
func (c *e2eCluster) waitPodsBound(what, key, value string, want int, timeout time.Duration) []corev1.Pod {
	c.t.Helper()
	return c.waitPods(what, key, value, want, timeout, fmt.Sprintf("bound (%s=%s)", key, value),
		func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
}

// waitPodsUnschedulable waits until the pods labelled key=value are want,
// none holding a node (bound or nominated), each PodScheduled=False.
func (c *e2eCluster) waitPodsUnschedulable(what, key, value string, want int, timeout time.Duration) []corev1.Pod {
	c.t.Helper()
	return c.waitPods(what, key, value, want, timeout, "unschedulable, holding nothing", func(p *corev1.Pod) bool {
		return p.Spec.NodeName == "" && p.Status.NominatedNodeName == "" && unschedulableWith(p)
	})
}

// waitPods waits until the pods labelled key=value are want and each is in
// the state `is` checks (named by state); on failure it says where each pod
// is stuck.
func (c *e2eCluster) waitPods(what, key, value string, want int, timeout time.Duration, state string, is func(*corev1.Pod) bool) []corev1.Pod {
	c.t.Helper()
	var pods []corev1.Pod
	defer func() {
		if c.t.Failed() {
			c.t.Logf("pods of %s:\n%s", what, describePods(pods))
		}
	}()
	c.waitFor(fmt.Sprintf("%d pods of %s %s", want, what, state), timeout, func() (bool, error) {
		pods = c.podsLabelled(key, value)
		if len(pods) != want {
			return false, nil
		}
		for i := range pods {
			if !is(&pods[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	return pods
}

// describePods is one line per pod: phase, node, nomination and why it is
// not scheduled.
func describePods(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "  (no pods)"
	}
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "  %s: phase %s, scheduler %q, node %q, nominated %q", p.Name, p.Status.Phase, p.Spec.SchedulerName, p.Spec.NodeName, p.Status.NominatedNodeName)
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled {
				fmt.Fprintf(&b, ", PodScheduled=%s %s: %s", cond.Status, cond.Reason, cond.Message)
			}
		}
		if len(p.Status.Conditions) == 0 {
			b.WriteString(", never tried by a scheduler")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// create creates an object of the resource from YAML (in the test
// namespace when namespaced and the YAML names none).
func (c *e2eCluster) create(resource schema.GroupVersionResource, namespaced bool, manifest string) *unstructured.Unstructured {
	c.t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		c.t.Fatalf("parsing %s: %v\n%s", resource.Resource, err, manifest)
	}
	var client dynamic.ResourceInterface = c.dyn.Resource(resource)
	if namespaced {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(c.ns)
		}
		client = c.dyn.Resource(resource).Namespace(obj.GetNamespace())
	}
	created, err := client.Create(c.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating %s %s: %v", resource.Resource, obj.GetName(), err)
	}
	return created
}

func (c *e2eCluster) createNamespace(name string) {
	c.t.Helper()
	_, err := c.Client.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// selfSignedCert writes tls.crt and tls.key for localhost into dir, as
// cert-manager or a Secret mount would provide them in a cluster.
func selfSignedCert(t *testing.T, dir string) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
	return certPEM, keyPEM
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// provideFiles writes files into dir, a path a tool hard-codes outside the
// test's temp dir, unless dir already holds them (a real installation's,
// another run's): those are left as they are. What it creates, files and
// directories, is removed when the test ends.
func provideFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	var present []string
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			present = append(present, name)
		}
	}
	switch {
	case len(present) == len(files):
		t.Logf("%s already holds %v; the test uses them as they are", dir, present)
		return
	case len(present) > 0:
		t.Fatalf("%s holds %v but not all of the files the tool needs; remove them or complete them", dir, present)
	}
	created, err := mkdirAllCreated(dir)
	if err != nil {
		t.Fatalf("creating %s (the tool hard-codes it): %v", dir, err)
	}
	t.Cleanup(func() {
		for name := range files {
			_ = os.Remove(filepath.Join(dir, name))
		}
		for i := len(created) - 1; i >= 0; i-- {
			_ = os.Remove(created[i]) // only if empty: another run may use it
		}
	})
	for name, data := range files {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_, err = f.Write(data)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Fatalf("writing %s: %v", filepath.Join(dir, name), err)
		}
	}
}

// mkdirAllCreated is os.MkdirAll that returns the directories it created,
// outermost first.
func mkdirAllCreated(dir string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append([]string{d}, missing...)
		if d == filepath.Dir(d) {
			break
		}
	}
	return missing, os.MkdirAll(dir, 0o755)
}

// freePort is a loopback port free now, for a tool's listener.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
