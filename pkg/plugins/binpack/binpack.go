// Package binpack is MusterBinPack: NodeResourcesFit's scoring (its
// strategy and resource weights, unchanged) without NodeResourcesFit's cost
// for pods that ask for none of the extended resources it weighs.
//
// Upstream's scorer asks, for every node and every weighed resource the pod
// does not request, whether the resource's name is an extended one
// (schedutil.IsScalarResourceName, a qualified-name validation). With
// nvidia.com/gpu among the weights, a plain pod pays that on every node it
// scores: on upstream's SchedulingPodAntiAffinity (5000 nodes) it was most of
// the gap between muster and the default profile. The name does not change
// from node to node, so MusterBinPack asks once per pod: a pod that requests
// none of the extended resources is scored by a scorer over the native ones
// (cpu, memory) only, which gives it the same score, since upstream's scorer
// leaves an unrequested extended resource out of the weighted mean; any
// other pod is scored over every resource, as NodeResourcesFit would.
package binpack

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	kubeschedulerv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"sigs.k8s.io/yaml"
)

// Name is the plugin's name in a profile.
const Name = "MusterBinPack"

// DefaultStrategy is used when the profile gives MusterBinPack no args: the
// weights muster ships, GPUs first so that large holes stay free for gangs.
func DefaultStrategy() *config.ScoringStrategy {
	return &config.ScoringStrategy{
		Type: config.MostAllocated,
		Resources: []config.ResourceSpec{
			{Name: "nvidia.com/gpu", Weight: 5},
			{Name: string(v1.ResourceCPU), Weight: 1},
			{Name: string(v1.ResourceMemory), Weight: 1},
		},
	}
}

// BinPack scores nodes with one of two NodeResourcesFit scorers, chosen per
// pod by whether it requests any of the weighed extended resources.
type BinPack struct {
	// all weighs every configured resource; native weighs only the
	// non-extended ones (nil when every resource is native: all serves).
	all, native *noderesources.Fit
	extended    []v1.ResourceName
}

var (
	_ fwk.PreScorePlugin = &BinPack{}
	_ fwk.ScorePlugin    = &BinPack{}
	_ fwk.SignPlugin     = &BinPack{}
)

// New builds the plugin from NodeResourcesFit's args (v1, as written in the
// profile's pluginConfig; only scoringStrategy is read).
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	strategy, err := decodeStrategy(obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	newFit := func(s *config.ScoringStrategy) (*noderesources.Fit, error) {
		pl, err := noderesources.NewFit(ctx, &config.NodeResourcesFitArgs{ScoringStrategy: s}, h, fts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
		return pl.(*noderesources.Fit), nil
	}
	b := &BinPack{}
	if b.all, err = newFit(strategy); err != nil {
		return nil, err
	}
	native := *strategy
	native.Resources = nil
	for _, r := range strategy.Resources {
		if schedutil.IsScalarResourceName(v1.ResourceName(r.Name)) {
			b.extended = append(b.extended, v1.ResourceName(r.Name))
		} else {
			native.Resources = append(native.Resources, r)
		}
	}
	if len(b.extended) > 0 && len(native.Resources) > 0 {
		if b.native, err = newFit(&native); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// decodeStrategy reads the v1 NodeResourcesFitArgs the profile gives
// MusterBinPack, defaulted and converted as kube-scheduler does its own.
func decodeStrategy(obj runtime.Object) (*config.ScoringStrategy, error) {
	if obj == nil {
		return DefaultStrategy(), nil
	}
	raw, ok := obj.(*runtime.Unknown)
	if !ok {
		return nil, fmt.Errorf("want args as written in pluginConfig, got %T", obj)
	}
	var external kubeschedulerv1.NodeResourcesFitArgs
	if err := yaml.UnmarshalStrict(raw.Raw, &external); err != nil {
		return nil, fmt.Errorf("decoding args: %w", err)
	}
	if len(external.IgnoredResources) > 0 || len(external.IgnoredResourceGroups) > 0 {
		return nil, fmt.Errorf("args: only scoringStrategy is read; ignoredResources belong to NodeResourcesFit's args")
	}
	if external.ScoringStrategy == nil {
		return DefaultStrategy(), nil
	}
	kubeschedulerscheme.Scheme.Default(&external)
	var internal config.NodeResourcesFitArgs
	if err := kubeschedulerscheme.Scheme.Convert(&external, &internal, nil); err != nil {
		return nil, fmt.Errorf("converting args: %w", err)
	}
	return internal.ScoringStrategy, nil
}

// Name returns the plugin's name.
func (b *BinPack) Name() string { return Name }

// scorer is the scorer for pod: the native-only one when the pod requests
// none of the weighed extended resources.
func (b *BinPack) scorer(pod *v1.Pod) *noderesources.Fit {
	if b.native == nil || requestsAny(pod, b.extended) {
		return b.all
	}
	return b.native
}

// PreScore writes the chosen scorer's state (NodeResourcesFit's own key:
// NodeResourcesFit's PreScore and Score are disabled where this plugin runs).
func (b *BinPack) PreScore(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	return b.scorer(pod).PreScore(ctx, cs, pod, nodes)
}

// Score is NodeResourcesFit's score by the chosen scorer.
func (b *BinPack) Score(ctx context.Context, cs fwk.CycleState, pod *v1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	return b.scorer(pod).Score(ctx, cs, pod, ni)
}

// ScoreExtensions is NodeResourcesFit's (none: scores are in [0, 100]).
func (b *BinPack) ScoreExtensions() fwk.ScoreExtensions { return b.all.ScoreExtensions() }

// SignPod is NodeResourcesFit's: the pod's resource requests decide both
// the choice of scorer and the score.
func (b *BinPack) SignPod(ctx context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	return b.all.SignPod(ctx, pod)
}

// requestsAny says whether any container of pod (init containers included)
// requests or limits one of names. Extended resources cannot be requested
// at the pod level, and their requests equal their limits when both are set.
func requestsAny(pod *v1.Pod, names []v1.ResourceName) bool {
	for _, cs := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range cs {
			for _, n := range names {
				if q, ok := cs[i].Resources.Requests[n]; ok && !q.IsZero() {
					return true
				}
				if q, ok := cs[i].Resources.Limits[n]; ok && !q.IsZero() {
					return true
				}
			}
		}
	}
	return false
}
