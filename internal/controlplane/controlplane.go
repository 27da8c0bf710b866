// Package controlplane runs a real Kubernetes control plane inside the current
// process: embedded etcd, kube-apiserver, the Job, StatefulSet and
// ResourceClaim controllers, plus the muster scheduler on demand. Integration tests and `make demo` use it; nothing is
// downloaded and no external binary is started.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/controller/statefulset"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// ControlPlane is a running etcd + kube-apiserver + Job, StatefulSet and
// ResourceClaim controllers.
type ControlPlane struct {
	// Config is an admin client configuration.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Kubeconfig is the path of a kubeconfig file for Config.
	Kubeconfig string

	tb ktesting.TB
}

// Start starts etcd, kube-apiserver (admission plugins ServiceAccount and
// TaintNodesByCondition off, so plain Node objects are schedulable), installs
// muster's CRDs and starts the Job, StatefulSet and ResourceClaim controllers.
// Everything stops in tb.Cleanup.
// Start fails tb on error. apiserverFlags are added to kube-apiserver's
// (e.g. --authorization-mode=RBAC; the default authorizes everything).
func Start(tb ktesting.TB, apiserverFlags ...string) *ControlPlane {
	tb.Helper()
	cp, err := start(tb, apiserverFlags)
	if err != nil {
		tb.Fatalf("starting control plane: %v", err)
	}
	return cp
}

func start(tb ktesting.TB, apiserverFlags []string) (*ControlPlane, error) {
	if err := reportSemanticVersion(); err != nil {
		return nil, fmt.Errorf("version: %w", err)
	}
	etcdURL, err := startEtcd(tb)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}

	storage := storagebackend.NewDefaultConfig(path.Join(uuid.New().String(), "registry"), nil)
	storage.Transport.ServerList = []string{etcdURL}
	flags := append([]string{
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
	}, apiserverFlags...)
	server, err := kubeapiservertesting.StartTestServer(tb, kubeapiservertesting.NewDefaultTestServerOptions(), flags, storage)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	tb.Cleanup(server.TearDownFn)

	cfg := rest.CopyConfig(server.ClientConfig)
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Config: cfg, Client: client, tb: tb}
	if cp.Kubeconfig, err = writeKubeconfig(tb.TempDir(), cfg); err != nil {
		return nil, err
	}
	if err := cp.installCRDs(); err != nil {
		return nil, fmt.Errorf("installing CRDs: %w", err)
	}
	if err := cp.startControllers(); err != nil {
		return nil, fmt.Errorf("workload controllers: %w", err)
	}
	return cp, nil
}

// reportSemanticVersion makes the API server's /version a semantic version,
// as a real cluster's is. A binary built without -ldflags (a test) has the
// placeholder gitVersion "v0.0.0-master+$Format:%H$", which clients that
// parse the server's version reject (Kueue does, at start). component-base
// lets the placeholder's own semantic part stand in for it.
func reportSemanticVersion() error {
	current := version.Get().GitVersion
	if _, err := utilversion.ParseSemantic(current); err == nil {
		return nil
	}
	semantic, _, _ := strings.Cut(current, "+")
	return version.SetDynamicVersion(semantic)
}

// startEtcd starts an embedded etcd on free loopback ports. A port found free
// can be taken by another listener or an outgoing connection before etcd binds
// it (tests start control planes concurrently), so a bind that fails with
// "address already in use" is tried again on new ports.
func startEtcd(tb ktesting.TB) (string, error) {
	for attempt := 1; ; attempt++ {
		u, err := startEtcdOnce(tb)
		if err == nil || attempt == 5 || !isAddrInUse(err) {
			return u, err
		}
		tb.Logf("etcd: %v; trying other ports", err)
	}
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func startEtcdOnce(tb ktesting.TB) (string, error) {
	cfg := embed.NewConfig()
	cfg.Dir = tb.TempDir()
	cfg.LogLevel = "fatal" // shutdown reports closed listeners as errors
	cfg.UnsafeNoFsync = true
	clientURL, peerURL := freeURL(), freeURL()
	if clientURL == nil || peerURL == nil {
		return "", fmt.Errorf("no free port")
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", err
	}
	tb.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return "", fmt.Errorf("etcd did not become ready within 60s")
	}
	return clientURL.String(), nil
}

func freeURL() *url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil
	}
	defer func() { _ = l.Close() }()
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

// As returns a view of the control plane whose Config, Client and
// Kubeconfig act as the given user (through impersonation), e.g. a
// component's ServiceAccount, so RBAC applies to it.
func (cp *ControlPlane) As(user string, groups ...string) (*ControlPlane, error) {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cp.withConfig(cfg)
}

// Via returns a view of the control plane whose clients reach the API
// server at host instead (e.g. through a proxy a test can cut).
func (cp *ControlPlane) Via(host string) (*ControlPlane, error) {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Host = host
	return cp.withConfig(cfg)
}

// withConfig is a view of the control plane with its clients and kubeconfig
// built from cfg.
func (cp *ControlPlane) withConfig(cfg *rest.Config) (*ControlPlane, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	path, err := writeKubeconfig(cp.tb.TempDir(), cfg)
	if err != nil {
		return nil, err
	}
	return &ControlPlane{Config: cfg, Client: client, Kubeconfig: path, tb: cp.tb}, nil
}

// ServiceAccount is As for the ServiceAccount namespace/name with the groups
// the API server gives ServiceAccount tokens.
func (cp *ControlPlane) ServiceAccount(namespace, name string) (*ControlPlane, error) {
	return cp.As("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

func writeKubeconfig(dir string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthority:     cfg.CAFile,
		CertificateAuthorityData: cfg.CAData,
		InsecureSkipTLSVerify:    cfg.Insecure,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		Token:                 cfg.BearerToken,
		TokenFile:             cfg.BearerTokenFile,
		ClientCertificate:     cfg.CertFile,
		ClientKey:             cfg.KeyFile,
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Impersonate:           cfg.Impersonate.UserName,
		ImpersonateGroups:     cfg.Impersonate.Groups,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = "test"
	p := filepath.Join(dir, "kubeconfig")
	return p, clientcmd.WriteToFile(*kc, p)
}

// startControllers runs the workload controllers muster serves, Job and
// StatefulSet, and kube-controller-manager's ResourceClaim controller: the
// API server serves resource.k8s.io/v1 (DRA is GA), and without the
// controller a pod naming a ResourceClaimTemplate never gets its claim, and
// a deleted pod's claims stay allocated (reserved for a pod that is gone).
func (cp *ControlPlane) startControllers() error {
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(cp.Client, 0)
	cp.tb.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	jc, err := job.NewController(ctx, cp.Client, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(),
		factory.Scheduling().V1beta1().Workloads(), factory.Scheduling().V1beta1().PodGroups())
	if err != nil {
		return err
	}
	// StatefulSets are the other workload muster forms gangs of.
	ssc := statefulset.NewStatefulSetController(ctx, factory.Core().V1().Pods(), factory.Apps().V1().StatefulSets(),
		factory.Core().V1().PersistentVolumeClaims(), factory.Apps().V1().ControllerRevisions(), cp.Client)
	// Its scheduling/v1beta1 PodGroup informer is only used with the
	// DRAWorkloadResourceClaims and GenericWorkload gates, off by default.
	rcc, err := resourceclaim.NewController(klog.FromContext(ctx), cp.Client, factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(), factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	go jc.Run(ctx, 4)
	go ssc.Run(ctx, 2)
	go rcc.Run(ctx, 2)
	return nil
}

// Namespace creates a fresh namespace named after prefix and returns its name.
func (cp *ControlPlane) Namespace(tb ktesting.TB, prefix string) string {
	tb.Helper()
	ns, err := cp.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}
