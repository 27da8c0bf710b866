package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/manifests"
	"github.com/muster-sched/muster/pkg/controllercmd"
	"github.com/muster-sched/muster/pkg/schedulercmd"
)

// runAsScheduler makes this test binary act as cmd/scheduler (the same
// command) when started
// with it set, so HA tests run real scheduler processes (kube-scheduler exits
// the process when it loses leadership) without building another binary.
const (
	runAsScheduler  = "MUSTER_TEST_RUN_SCHEDULER"
	runAsController = "MUSTER_TEST_RUN_CONTROLLER"
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(runAsScheduler) == "1":
		os.Exit(cli.Run(schedulercmd.New()))
	case os.Getenv(runAsController) == "1":
		os.Exit(controllercmd.Main(os.Args[1:]))
	}
	if v := os.Getenv(vmoduleEnv); v != "" {
		// The in-process scheduler logs at verbosity 0 otherwise, and a
		// failure's cause is often in the queue's or muster's V(4) lines.
		var fs flag.FlagSet
		klog.InitFlags(&fs)
		if err := fs.Set("vmodule", v); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", vmoduleEnv, err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// vmoduleEnv raises the log verbosity of chosen files of the processes the
// tests run in this one, as klog's -vmodule does: for example
// MUSTER_TEST_VMODULE=scheduling_queue=6,wake=4,events=4 make test-integration.
const vmoduleEnv = "MUSTER_TEST_VMODULE"

// replica is a component process (scheduler or controller) with leader
// election on.
type replica struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{}
	log   string
	lease string
}

// leads reports whether the replica's log says it acquired its lease.
func (r *replica) leads() bool {
	return r.logged(`"Successfully acquired lease" lock="muster-system/` + r.lease + `"`)
}

// logged reports whether the replica's log so far contains s.
func (r *replica) logged(s string) bool {
	out, _ := os.ReadFile(r.log)
	return strings.Contains(string(out), s)
}

func (c *cluster) startReplica(name string, extraConfig string) *replica {
	c.t.Helper()
	data, err := manifests.FS.ReadFile(manifests.SchedulerConfig)
	if err != nil {
		c.t.Fatal(err)
	}
	dir := c.t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	data = append(data, extraConfig...)
	if err := os.WriteFile(config, data, 0o600); err != nil {
		c.t.Fatal(err)
	}
	return c.startProcess(name, runAsScheduler, "muster-scheduler", "--config="+config, "--kubeconfig="+c.Kubeconfig, "--secure-port=0",
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms", "--v=1")
}

// startProcess runs this test binary as the component selected by env, with
// args, logging to a file; it is killed when the test ends.
func (c *cluster) startProcess(name, env, lease string, args ...string) *replica {
	c.t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), env+"=1")
	log, err := os.Create(filepath.Join(c.t.TempDir(), name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, done: make(chan struct{}), log: log.Name(), lease: lease}
	go func() { _ = cmd.Wait(); close(r.done); _ = log.Close() }()
	c.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-r.done
		if c.t.Failed() {
			out, err := os.ReadFile(log.Name())
			c.t.Logf("%s log (tail, %v):\n%s", name, err, tail(string(out), 3000))
		}
	})
	return r
}

// waitForLeader waits until one of the two replicas leads and returns it
// first.
func (c *cluster) waitForLeader(a, b *replica) (leader, follower *replica) {
	c.t.Helper()
	c.waitFor("a leader", 60*time.Second, func() (bool, error) {
		switch {
		case a.leads():
			leader, follower = a, b
		case b.leads():
			leader, follower = b, a
		}
		return leader != nil, nil
	})
	return leader, follower
}

// killAndFailOver kills the leader without letting it release the lease and
// waits for the follower to take over.
func (c *cluster) killAndFailOver(leader, follower *replica) {
	c.t.Helper()
	_ = leader.cmd.Process.Kill()
	<-leader.done
	c.waitFor("the follower leads", 60*time.Second, func() (bool, error) {
		select {
		case <-follower.done:
			return false, fmt.Errorf("follower exited")
		default:
		}
		return follower.leads(), nil
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Two scheduler replicas with leader election. The leader is killed while a
// gang waits at Permit (one member's cycle is held by an extender); the
// other replica takes over. The gang is never partly bound: nothing binds
// while the member is held, and once it is released the whole gang binds on
// the new leader.
func TestFailoverWhileGangWaits(t *testing.T) {
	cp := controlplane.Start(t)
	c := &cluster{ControlPlane: cp, t: t, ctx: context.Background(), ns: cp.Namespace(t, "ha")}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "muster-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.addNodes(gpuNodes(3, 8)...)
	obs := c.observeGangs(map[string]int{"": 3})
	ext := startHoldingExtender(t, 2) // the third member is held
	replicas := map[string]*replica{}
	for _, name := range []string{"a", "b"} {
		replicas[name] = c.startReplica(name, ext.Config())
	}
	leader, follower := c.waitForLeader(replicas["a"], replicas["b"])

	c.createPodGroup("ha", 3, ptr.To[int32](600))
	for i := range 3 {
		c.createGroupPod("ha", fmt.Sprintf("ha-%d", i), 8, held)
	}
	c.waitFor("two members waiting at Permit on the leader", 60*time.Second, func() (bool, error) {
		passed, held := ext.membersAtPermit()
		return len(passed) == 2 && held, nil
	})

	// The standby watches nothing until it leads (delayCacheUntilActive in
	// the shipped config): it would otherwise post Events and write
	// PodGroup status beside the leader, from a view without its plans.
	c.waitFor("the follower waits for the lease", 30*time.Second, func() (bool, error) {
		return follower.logged("Attempting to acquire leader lease"), nil
	})
	if follower.logged("Watching PodGroups") {
		t.Fatal("the standby watches PodGroups before it leads")
	}

	// Stop the leader hard (no lease release), while the gang waits in its
	// memory only; the follower must take over.
	c.killAndFailOver(leader, follower)
	c.waitFor("the new leader watches PodGroups", 30*time.Second, func() (bool, error) {
		return follower.logged("Starting informers and waiting for sync") && follower.logged("Watching PodGroups"), nil
	})
	if n := countBound(c.groupPods("ha")); n != 0 {
		t.Fatalf("%d members bound while one member is held", n)
	}

	defer func() {
		if t.Failed() {
			for _, p := range c.groupPods("ha") {
				t.Logf("pod %s: node %q nominated %q conditions %+v", p.Name, p.Spec.NodeName, p.Status.NominatedNodeName, p.Status.Conditions)
			}
		}
	}()
	ext.Release()
	c.waitFor("whole gang bound by the surviving replica", 90*time.Second, func() (bool, error) {
		return countBound(c.groupPods("ha")) == 3, nil
	})
	obs.check(t, 10*time.Second)
}

// Two TF_CONFIG controller replicas with leader election: the leader is
// killed, the follower takes over, serves a new Job, and leaves the Secret the
// old leader wrote untouched.
func TestControllerFailover(t *testing.T) {
	cp := controlplane.Start(t)
	c := &cluster{ControlPlane: cp, t: t, ctx: context.Background(), ns: cp.Namespace(t, "ctrl-ha")}
	if _, err := c.Client.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "muster-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := map[string]*replica{}
	for _, name := range []string{"a", "b"} {
		replicas[name] = c.startProcess("controller-"+name, runAsController, "muster-tfconfig-controller",
			"--kubeconfig="+cp.Kubeconfig, "--health-addr=", "--metrics-addr=",
			"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms")
	}
	leader, follower := c.waitForLeader(replicas["a"], replicas["b"])
	tfJob := func(name string) {
		c.createJob(jobSpec{name: name, workers: 2, gpus: 1, scheduler: "none",
			labels: map[string]string{"muster.dev/tf-config": "true"}, subdomain: name})
	}
	secret := func(name string) *corev1.Secret {
		var s *corev1.Secret
		c.waitFor("Secret "+name, 60*time.Second, func() (bool, error) {
			got, err := c.Client.CoreV1().Secrets(c.ns).Get(c.ctx, name, metav1.GetOptions{})
			s = got
			return err == nil, nil
		})
		return s
	}
	tfJob("first")
	before := secret("first-tf-config")

	c.killAndFailOver(leader, follower)
	tfJob("second")
	secret("second-tf-config")
	after := secret("first-tf-config")
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the new leader rewrote an unchanged Secret (resourceVersion %s -> %s)", before.ResourceVersion, after.ResourceVersion)
	}
}
