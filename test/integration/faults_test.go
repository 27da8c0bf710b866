package integration

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/muster-sched/muster/internal/controlplane"
	"github.com/muster-sched/muster/pkg/controller/tfconfig"
)

// cutProxy forwards TCP to the API server until cut: then it drops every open
// connection and every new one (counting them), until restored.
type cutProxy struct {
	target  string
	l       net.Listener
	cut     atomic.Bool
	dropped atomic.Int64
	mu      sync.Mutex
	conns   map[net.Conn]bool
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{target: target, l: l, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = l.Close(); p.closeAll() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			if p.cut.Load() {
				p.dropped.Add(1)
				_ = conn.Close()
				continue
			}
			go p.forward(conn)
		}
	}()
	return p
}

// proxied puts a cutProxy in front of the control plane's API server and
// returns it with a view of the control plane that goes through it.
func proxied(t *testing.T, cp *controlplane.ControlPlane) (*cutProxy, *controlplane.ControlPlane) {
	t.Helper()
	u, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCutProxy(t, u.Host)
	viaProxy, err := cp.Via("https://" + proxy.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return proxy, viaProxy
}

func (p *cutProxy) forward(in net.Conn) {
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = in.Close()
		return
	}
	p.mu.Lock()
	p.conns[in], p.conns[out] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
	_, _ = io.Copy(in, out)
	_ = in.Close()
}

func (p *cutProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if cut {
		p.closeAll()
	}
}

// The API server becomes unreachable for the scheduler while a new gang is
// submitted; nothing is bound meanwhile, and once the connection returns the
// scheduler catches up and places the whole gang.
func TestSchedulerSurvivesAPIOutage(t *testing.T) {
	cp := controlplane.Start(t)
	proxy, viaProxy := proxied(t, cp)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{ControlPlane: cp, t: t, ctx: ctx, ns: cp.Namespace(t, "outage")}
	c.addNodes(gpuNodes(4, 8)...)
	done, err := viaProxy.StartScheduler(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); <-done }()

	c.createJob(jobSpec{name: "before", workers: 2, gpus: 8})
	c.waitJobBound("before", 2)

	proxy.setCut(true)
	c.createJob(jobSpec{name: "during", workers: 2, gpus: 8})
	// The outage lasts until the scheduler has tried to reconnect a few times.
	c.waitFor("scheduler reconnect attempts refused", 60*time.Second, func() (bool, error) { return proxy.dropped.Load() >= 5, nil })
	if n := countBound(c.jobPods("during")); n != 0 {
		t.Fatalf("%d pods bound while the scheduler could not reach the API server", n)
	}
	proxy.setCut(false)
	c.waitJobBound("during", 2)
}

// The TF_CONFIG controller loses the API server while a Job is created and
// writes its Secret once the connection returns.
func TestControllerSurvivesAPIOutage(t *testing.T) {
	cp := controlplane.Start(t)
	proxy, viaProxy := proxied(t, cp)
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{ControlPlane: cp, t: t, ctx: ctx, ns: cp.Namespace(t, "ctrl-outage")}
	controller := tfconfig.NewController(viaProxy.Client)
	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx, 1) }()
	defer func() { cancel(); <-done }()
	c.waitFor("controller synced", 30*time.Second, func() (bool, error) { return controller.HasSynced(), nil })

	proxy.setCut(true)
	c.createJob(jobSpec{name: "during", workers: 2, gpus: 1, scheduler: "none",
		labels: map[string]string{"muster.dev/tf-config": "true"}, subdomain: "during"})
	c.waitFor("controller reconnect attempts refused", 60*time.Second, func() (bool, error) { return proxy.dropped.Load() >= 3, nil })
	if _, err := c.Client.CoreV1().Secrets(c.ns).Get(ctx, "during-tf-config", metav1.GetOptions{}); err == nil {
		t.Fatal("Secret written while the controller could not reach the API server")
	}
	proxy.setCut(false)
	c.waitFor("Secret written after the outage", 60*time.Second, func() (bool, error) {
		_, err := c.Client.CoreV1().Secrets(c.ns).Get(ctx, "during-tf-config", metav1.GetOptions{})
		return err == nil, nil
	})
}

// Without the PodGroup CRD the scheduler starts (it never waits on an API
// that is not served), explains pods that name a PodGroup, and still
// schedules Job gangs.
func TestWithoutPodGroupCRD(t *testing.T) {
	cp := controlplane.Start(t)
	ext, err := apiextensionsclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ext.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, "podgroups.scheduling.x-k8s.io", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c := &cluster{ControlPlane: cp, t: t, ctx: ctx, ns: cp.Namespace(t, "nocrd")}
	c.waitFor("PodGroup API gone from discovery", 60*time.Second, func() (bool, error) {
		_, err := cp.Client.Discovery().ServerResourcesForGroupVersion("scheduling.x-k8s.io/v1alpha1")
		return apierrors.IsNotFound(err), nil
	})
	c.addNodes(gpuNodes(2, 8)...)
	stop := c.startScheduler()
	defer stop()
	c.createGroupPod("pg", "grouped", 1)
	c.waitFor("grouped pod explained", 30*time.Second, func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(c.ns).Get(ctx, "grouped", metav1.GetOptions{})
		return err == nil && unschedulableWith(p, "the PodGroup API (podgroups.scheduling.x-k8s.io) is not installed"), err
	})
	c.createJob(jobSpec{name: "job", workers: 2, gpus: 8})
	c.waitJobBound("job", 2)
}
