package controlplane

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/restmapper"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
)

// StartGarbageCollector runs kube-controller-manager's garbage collector
// until the test ends, so that deleting an owner deletes its dependents as in
// a cluster: a deleted Job's pods, a deleted TFJob's pods and PodGroup, a
// deleted Job's Kueue Workload, a deleted pod's ResourceClaims (those the
// ResourceClaim controller made from a template and the scheduler's
// extended-resource claim, both owned by the pod; the ResourceClaim
// controller only deallocates them and leaves the deletion to the
// collector). It finds CRDs installed later within seconds. Start leaves it
// off: muster's own tests delete what they mean to.
func (cp *ControlPlane) StartGarbageCollector() error {
	metadataClient, err := metadata.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	discoveryClient := cp.Client.Discovery()
	// The mapper gets its own discovery cache: Sync resets it when
	// resources change.
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.Client.Discovery()))
	ctx, cancel := context.WithCancel(context.Background())
	informersStarted := make(chan struct{})
	close(informersStarted) // every informer the collector needs is its own
	gc, err := garbagecollector.NewGarbageCollector(ctx, cp.Client, metadataClient, mapper,
		garbagecollector.DefaultIgnoredResources(),
		metadataInformers{metadatainformer.NewSharedInformerFactory(metadataClient, 0)}, informersStarted)
	if err != nil {
		cancel()
		return err
	}
	done := make(chan struct{}, 2)
	cp.tb.Cleanup(func() {
		cancel()
		<-done
		<-done
	})
	go func() { gc.Run(ctx, 4, 10*time.Second); done <- struct{}{} }()
	go func() { gc.Sync(ctx, discoveryClient, 2*time.Second); done <- struct{}{} }()
	return nil
}

// metadataInformers serves the collector every resource through metadata
// informers: it reads owner references only.
type metadataInformers struct {
	metadatainformer.SharedInformerFactory
}

func (m metadataInformers) ForResource(resource schema.GroupVersionResource) (informers.GenericInformer, error) {
	return m.SharedInformerFactory.ForResource(resource), nil
}
