// Package deps pins module dependencies during bootstrap.
package deps

import (
	_ "github.com/container-storage-interface/spec/lib/go/csi"
	_ "github.com/kubernetes-csi/csi-lib-utils/connection"
	_ "github.com/kubernetes-csi/csi-lib-utils/metrics"
	_ "github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	_ "github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/component-base/logs"
	_ "k8s.io/csi-translation-lib"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	_ "k8s.io/utils/clock"
)
