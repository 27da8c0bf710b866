package testobj

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// objectMeta holds the ObjectMeta setters every wrapper shares. A wrapper
// embeds it, and its MakeX wires it to the wrapper (self, which each setter
// returns so that chains go on with the wrapper's own methods) and to the
// wrapped object's ObjectMeta. Its methods are one level shallower than the
// ObjectMeta fields of the same names, so w.UID is the setter.
type objectMeta[W any] struct {
	self W
	meta *metav1.ObjectMeta
}

func newObjectMeta[W any](self W, meta *metav1.ObjectMeta) objectMeta[W] {
	return objectMeta[W]{self: self, meta: meta}
}

// GenerateName sets the prefix the API server names the object from.
func (m objectMeta[W]) GenerateName(prefix string) W { m.meta.GenerateName = prefix; return m.self }

// UID sets the object's UID.
func (m objectMeta[W]) UID(uid string) W { m.meta.UID = types.UID(uid); return m.self }

// Generation sets the object's generation.
func (m objectMeta[W]) Generation(g int64) W { m.meta.Generation = g; return m.self }

// ResourceVersion sets the object's resource version.
func (m objectMeta[W]) ResourceVersion(rv string) W { m.meta.ResourceVersion = rv; return m.self }

// Created sets the creation timestamp.
func (m objectMeta[W]) Created(t time.Time) W {
	m.meta.CreationTimestamp = metav1.NewTime(t)
	return m.self
}

// Deleting marks the object as being deleted now, kept by the orphan
// finalizer.
func (m objectMeta[W]) Deleting() W {
	m.meta.DeletionTimestamp = ptr.To(metav1.Now())
	m.meta.Finalizers = []string{metav1.FinalizerOrphanDependents}
	return m.self
}

// Label sets label k to v on the object itself (a Job's or StatefulSet's
// pod template has PodLabel or SelectPods).
func (m objectMeta[W]) Label(k, v string) W {
	metav1.SetMetaDataLabel(m.meta, k, v)
	return m.self
}

// Annotation sets annotation k to v on the object itself.
func (m objectMeta[W]) Annotation(k, v string) W {
	metav1.SetMetaDataAnnotation(m.meta, k, v)
	return m.self
}
