// Package controllercmd is the tfconfig-controller command: muster's TF_CONFIG controller
// (pkg/controller/tfconfig). For each Job or StatefulSet labelled muster.dev/tf-config: "true" it
// writes the Secret <name>-tf-config and the headless Service its pods need, and never reads a
// Secret. One replica at a time is active, elected through a Lease.
package controllercmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // REST client metrics
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection"
	_ "k8s.io/component-base/metrics/prometheus/version"
	_ "k8s.io/component-base/metrics/prometheus/workqueue"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"

	"github.com/muster-sched/muster/pkg/controller/tfconfig"
)

type options struct {
	kubeconfig      string
	namespace       string
	leaderElect     bool
	leaseNamespace  string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	healthAddr      string
	metricsAddr     string
	workers         int
	resync          time.Duration
	conflictRecheck time.Duration
}

// Main runs the command with args (without the program name) and returns
// the exit code.
func Main(args []string) int {
	var o options
	flag := flag.NewFlagSet("tfconfig-controller", flag.ExitOnError)
	klog.InitFlags(flag)
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file; empty means in-cluster configuration.")
	flag.StringVar(&o.namespace, "namespace", "", "Only serve Jobs and StatefulSets in this namespace; empty means all namespaces.")
	flag.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader through a Lease so that only one replica is active.")
	flag.StringVar(&o.leaseNamespace, "leader-elect-namespace", "muster-system", "Namespace of the Lease "+tfconfig.ControllerName+".")
	flag.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long standby replicas wait before taking over an unrenewed Lease.")
	flag.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew before it gives up leading.")
	flag.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often to try to acquire or renew the Lease.")
	flag.StringVar(&o.healthAddr, "health-addr", ":8081", "Address for /healthz and /readyz; empty disables them.")
	flag.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "Address for Prometheus /metrics; empty disables it.")
	flag.IntVar(&o.workers, "workers", 2, "Jobs and StatefulSets reconciled in parallel.")
	flag.DurationVar(&o.resync, "resync-period", tfconfig.DefaultResyncPeriod, "How often every Job and StatefulSet is reconciled without a change (this also re-creates a deleted Secret).")
	flag.DurationVar(&o.conflictRecheck, "conflict-recheck", tfconfig.DefaultConflictRecheck, "How soon a Job or StatefulSet blocked by a Secret or Service it does not own is retried.")
	_ = flag.Parse(args)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		klog.Background().Error(err, "tfconfig-controller failed")
		klog.Flush()
		return 1
	}
	klog.Flush()
	return 0
}

func run(ctx context.Context, o options) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting tfconfig-controller", "version", version.Get().GitVersion)
	if o.workers < 1 {
		return fmt.Errorf("--workers must be at least 1, got %d", o.workers)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading client configuration: %w", err)
	}
	userAgent := tfconfig.ControllerName + "/" + version.Get().GitVersion
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(cfg, userAgent))
	if err != nil {
		return err
	}
	controller := tfconfig.NewController(client,
		tfconfig.WithNamespace(o.namespace),
		tfconfig.WithResyncPeriod(o.resync),
		tfconfig.WithConflictRecheck(o.conflictRecheck))

	var leading atomic.Bool
	watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	if err := serveHTTP(ctx, o, controller, &leading, watchdog); err != nil {
		return err
	}

	if !o.leaderElect {
		leading.Store(true)
		return controller.Run(ctx, o.workers)
	}

	hostname, err := os.Hostname()
	if err != nil {
		return err
	}
	// A client of its own, so that a throttled controller client cannot delay lease renewal.
	leClient, err := kubernetes.NewForConfig(rest.AddUserAgent(cfg, userAgent+"/leader-election"))
	if err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: tfconfig.ControllerName, Namespace: o.leaseNamespace},
		Client:     leClient.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: hostname + "_" + string(uuid.NewUUID())},
	}
	var runErr error
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            tfconfig.ControllerName,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.renewDeadline,
		RetryPeriod:     o.retryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Became leader", "lease", o.leaseNamespace+"/"+tfconfig.ControllerName)
				leading.Store(true)
				runErr = controller.Run(ctx, o.workers)
			},
			OnStoppedLeading: func() {
				leading.Store(false)
			},
		},
	})
	if err != nil {
		return err
	}
	elector.Run(ctx)
	if runErr != nil {
		return runErr
	}
	if ctx.Err() == nil {
		// Leadership lost while still wanted: exit so the pod restarts with fresh state.
		return errors.New("lost leadership")
	}
	return nil
}

// serveHTTP starts the health and metrics endpoints (on one server when the addresses are equal).
// /readyz fails while this replica leads but its caches have not synced.
func serveHTTP(ctx context.Context, o options, c *tfconfig.Controller, leading *atomic.Bool, watchdog *leaderelection.HealthzAdaptor) error {
	muxes := map[string]*http.ServeMux{}
	mux := func(addr string) *http.ServeMux {
		if muxes[addr] == nil {
			muxes[addr] = http.NewServeMux()
		}
		return muxes[addr]
	}
	if o.healthAddr != "" {
		m := mux(o.healthAddr)
		m.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if err := watchdog.Check(r); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		m.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if leading.Load() && !c.HasSynced() {
				http.Error(w, "caches not synced", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
	}
	if o.metricsAddr != "" {
		mux(o.metricsAddr).Handle("/metrics", legacyregistry.Handler())
	}
	for addr, m := range muxes {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "HTTP server failed", "addr", addr)
			}
		}()
		go func() {
			<-ctx.Done()
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx)
		}()
	}
	return nil
}
