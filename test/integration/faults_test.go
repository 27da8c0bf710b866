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

	"github.com/muster-sched/muster/pkg/controlplane"
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
	u, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCutProxy(t, u.Host)
	viaProxy, err := cp.Via("https://" + proxy.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
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
