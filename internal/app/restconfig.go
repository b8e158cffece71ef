package app

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig builds the API client configuration of a controller binary:
// from kubeconfig when set (out of cluster), else the Pod's service
// account, with the client-side rate limit of --kube-api-qps and
// --kube-api-burst.
func RESTConfig(kubeconfig string, qps float64, burst int) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("build the API client configuration: %w", err)
	}
	cfg.QPS = float32(qps)
	cfg.Burst = burst
	return cfg, nil
}
