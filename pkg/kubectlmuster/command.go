package kubectlmuster

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/muster-sched/muster/pkg/apis/config"
)

// connectFunc reaches the cluster and says which namespace the flags and
// kubeconfig name.
type connectFunc func() (Clients, string, error)

// command holds the flags every subcommand shares.
type command struct {
	streams       genericiooptions.IOStreams
	connect       connectFunc
	opts          Options
	gpu           string
	preset        string
	levels        string
	allNamespaces bool
	output        string
}

// NewCommand is kubectl-muster: gangs, explain and top, with kubectl's
// connection flags (--kubeconfig, --context, -n, ...).
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	connect := func() (Clients, string, error) {
		cfg, err := flags.ToRESTConfig()
		if err != nil {
			return Clients{}, "", err
		}
		cfg.QPS, cfg.Burst = 50, 100
		// Built-in lists of 10k pods decode several times faster as
		// protobuf; the dynamic client (CRDs) stays on JSON.
		kcfg := rest.CopyConfig(cfg)
		kcfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
		kcfg.ContentType = runtime.ContentTypeProtobuf
		kube, err := kubernetes.NewForConfig(kcfg)
		if err != nil {
			return Clients{}, "", err
		}
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return Clients{}, "", err
		}
		ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return Clients{}, "", err
		}
		return Clients{Kube: kube, Dynamic: dyn}, ns, nil
	}
	root := newCommand(streams, connect)
	flags.AddFlags(root.PersistentFlags())
	return root
}

// newCommand builds the command tree over connect (tests pass fake clients).
func newCommand(streams genericiooptions.IOStreams, connect connectFunc) *cobra.Command {
	c := &command{streams: streams, connect: connect, opts: DefaultOptions()}
	root := &cobra.Command{
		Use:   "kubectl-muster",
		Short: "Show muster's gangs, explain why one waits, and where GPUs are free",
		Long: "kubectl muster shows the gangs the muster scheduler knows of (Jobs, StatefulSets, PodGroups of schedulerName muster),\n" +
			"explains why one is not running and what would make it fit, and shows free GPUs per zone, rack and node.\n" +
			"It only reads (ClusterRole muster-viewer). See docs/explain.md.",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Usage reads "kubectl muster ...", as kubectl runs it.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl muster"},
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	pf := root.PersistentFlags()
	pf.StringVar(&c.opts.SchedulerName, "scheduler-name", c.opts.SchedulerName, "schedulerName of muster's pods")
	pf.StringVar(&c.gpu, "gpu-resource", string(c.opts.GPU), "the GPU resource (muster's gpuResourceName)")
	pf.StringVar(&c.preset, "topology-preset", "default", "muster's topology preset: default, gke, aws or topograph")
	pf.StringVar(&c.levels, "topology-levels", "", "muster's topologyLevels, tightest first, as NAME=NODE_LABEL,...; overrides --topology-preset")

	gangs := &cobra.Command{
		Use:   "gangs [-A|-n NAMESPACE] [-o wide|json|yaml]",
		Short: "List the gangs muster knows of: members bound/quorum, phase, GPUs, domain, age of the phase",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return c.runGangs(cmd.Context()) },
	}
	gangs.Flags().BoolVarP(&c.allNamespaces, "all-namespaces", "A", false, "list the gangs of every namespace")
	gangs.Flags().StringVarP(&c.output, "output", "o", "", "output format: wide, json or yaml")

	explain := &cobra.Command{
		Use:   "explain KIND/NAME [-n NAMESPACE] [-o json|yaml]",
		Short: "Explain a gang: its phase, why it waits, the nodes by reason, and what would make it fit",
		Long: "Explain a gang: its phase and since when, muster's latest message, the nodes grouped by the reason they cannot take\n" +
			"a member, and what would make it fit, planned with muster's own planner on the live cluster state.\n" +
			"KIND is job, statefulset (sts), podgroup (scheduler-plugins, podgroup.scheduling.x-k8s.io),\n" +
			"podgroup.scheduling.k8s.io (workloadpodgroup: Kubernetes' own) or pod (the pod's gang).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return c.runExplain(cmd.Context(), args[0]) },
	}
	explain.Flags().StringVarP(&c.output, "output", "o", "", "output format: json or yaml")

	top := &cobra.Command{
		Use:   "top [-o wide|json|yaml] [--worker-gpus N]",
		Short: "Free and held GPUs per zone and rack (and node with -o wide), and the largest gang that fits in each",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return c.runTop(cmd.Context()) },
	}
	top.Flags().StringVarP(&c.output, "output", "o", "", "output format: wide, json or yaml")
	top.Flags().Int64Var(&c.opts.WorkerGPUs, "worker-gpus", c.opts.WorkerGPUs, "GPUs of one worker, for the largest gang that fits")

	root.AddCommand(gangs, explain, top)
	return root
}

// setup checks the shared flags and connects.
func (c *command) setup(formats ...string) (Clients, string, error) {
	ok := c.output == ""
	for _, f := range formats {
		ok = ok || c.output == f
	}
	if !ok {
		return Clients{}, "", fmt.Errorf("unknown output format %q (known: %v)", c.output, formats)
	}
	c.opts.GPU = corev1.ResourceName(c.gpu)
	if c.levels != "" {
		levels, err := ParseLevels(c.levels)
		if err != nil {
			return Clients{}, "", fmt.Errorf("--topology-levels: %w", err)
		}
		c.opts.Levels = levels
	} else if c.opts.Levels = PresetLevels(c.preset); c.opts.Levels == nil {
		return Clients{}, "", fmt.Errorf("unknown topology preset %q (known: %s)", c.preset, strings.Join(config.TopologyPresetNames, ", "))
	}
	return c.connect()
}

// note tells the user, once each, which kinds were skipped.
func (c *command) note(snap *Snapshot) {
	for _, s := range snap.Skipped {
		fmt.Fprintf(c.streams.ErrOut, "note: %s\n", s)
	}
}

func (c *command) runGangs(ctx context.Context) error {
	clients, ns, err := c.setup("wide", "json", "yaml")
	if err != nil {
		return err
	}
	scope := Scope{Namespace: ns, AllNamespaces: c.allNamespaces}
	snap, err := read(ctx, clients, scope, reads{owners: true})
	if err != nil {
		return err
	}
	c.note(snap)
	gangs := Gangs(snap, scope, c.opts)
	if c.output == "json" || c.output == "yaml" {
		return printDocument(c.streams.Out, c.output, GangList{APIVersion: APIVersion, Kind: "GangList", Items: gangs})
	}
	if len(gangs) == 0 {
		fmt.Fprintf(c.streams.ErrOut, "No gangs of scheduler %q found%s.\n", c.opts.SchedulerName, scope.where())
		return nil
	}
	return printGangs(c.streams.Out, gangs, c.allNamespaces, c.output == "wide", snap.Now)
}

func (c *command) runExplain(ctx context.Context, arg string) error {
	kind, name, err := ParseRef(arg)
	if err != nil {
		return err
	}
	clients, ns, err := c.setup("json", "yaml")
	if err != nil {
		return err
	}
	snap, err := read(ctx, clients, Scope{Namespace: ns}, reads{owners: true, allPods: true, pvcs: true})
	if err != nil {
		return err
	}
	c.note(snap)
	ex, err := Explain(snap, ns, kind, name, c.opts)
	if err != nil {
		return err
	}
	if c.output != "" {
		return printDocument(c.streams.Out, c.output, ExplanationDocument{APIVersion: APIVersion, Kind: "GangExplanation", Explanation: ex})
	}
	return printExplanation(c.streams.Out, ex, string(c.opts.GPU), snap.Now)
}

func (c *command) runTop(ctx context.Context) error {
	clients, _, err := c.setup("wide", "json", "yaml")
	if err != nil {
		return err
	}
	if c.opts.WorkerGPUs < 1 {
		return fmt.Errorf("--worker-gpus must be at least 1, got %d", c.opts.WorkerGPUs)
	}
	snap, err := read(ctx, clients, Scope{AllNamespaces: true}, reads{allPods: true})
	if err != nil {
		return err
	}
	root := Top(snap, c.opts)
	if c.output == "json" || c.output == "yaml" {
		return printDocument(c.streams.Out, c.output, TopDocument{APIVersion: APIVersion, Kind: "GPUTopology", Cluster: root})
	}
	return printTop(c.streams.Out, root, c.output == "wide")
}
