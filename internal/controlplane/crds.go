package controlplane

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/muster-sched/muster/manifests"
)

// installCRDs creates every CRD shipped in manifests/crds and waits until the
// API server serves them.
func (cp *ControlPlane) installCRDs() error {
	files, err := fs.Glob(manifests.FS, "crds/*.yaml")
	if err != nil {
		return err
	}
	for _, f := range files {
		if path.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := manifests.FS.ReadFile(f)
		if err != nil {
			return err
		}
		if err := cp.installCRD(data); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

// InstallCRDFiles creates the CRDs in the given files (one
// CustomResourceDefinition each, as controller-gen writes them: another
// tool's CRDs, say) and waits until the API server serves them.
func (cp *ControlPlane) InstallCRDFiles(files ...string) error {
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := cp.installCRD(data); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

func (cp *ControlPlane) installCRD(data []byte) error {
	client, err := apiextensionsclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := client.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
	}
	return nil
}
