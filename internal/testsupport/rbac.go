package testsupport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// RepoFile reads a file of latch's checkout, named from the repository's
// root ("deploy/csi-attacher/rbac.yaml").
func RepoFile(rel string) ([]byte, error) {
	_, file, _, _ := runtime.Caller(0)
	return os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", filepath.FromSlash(rel)))
}

// ApplyRBAC creates the ServiceAccounts, ClusterRoles, ClusterRoleBindings,
// Roles and RoleBindings of manifests (YAML, several documents each), in
// order; an object that exists already is left as it is. It returns the
// objects it read; any other kind is an error.
func ApplyRBAC(ctx context.Context, client kubernetes.Interface, manifests ...[]byte) ([]k8sruntime.Object, error) {
	var out []k8sruntime.Object
	for _, m := range manifests {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(m)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return out, err
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				return out, fmt.Errorf("decode RBAC manifest: %w", err)
			}
			if err := createRBAC(ctx, client, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				return out, fmt.Errorf("create %T: %w", obj, err)
			}
			out = append(out, obj)
		}
	}
	return out, nil
}

func createRBAC(ctx context.Context, client kubernetes.Interface, obj k8sruntime.Object) error {
	var err error
	create := metav1.CreateOptions{}
	switch o := obj.(type) {
	case *v1.ServiceAccount:
		_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, create)
	case *rbacv1.ClusterRole:
		_, err = client.RbacV1().ClusterRoles().Create(ctx, o, create)
	case *rbacv1.ClusterRoleBinding:
		_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, create)
	case *rbacv1.Role:
		_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, create)
	case *rbacv1.RoleBinding:
		_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, create)
	default:
		return fmt.Errorf("unexpected %T in an RBAC manifest", obj)
	}
	return err
}
