package app

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultContentType is the wire format the controllers speak to the API
// server by default: protobuf, as kube-controller-manager and the kubelet
// do. client-go on its own speaks JSON, which costs both the API server
// (encoding every watch event and response) and the client (decoding them)
// several times as much CPU.
const DefaultContentType = runtime.ContentTypeProtobuf

// ValidateContentType checks a --kube-api-content-type value.
func ValidateContentType(ct string) error {
	switch ct {
	case runtime.ContentTypeProtobuf, runtime.ContentTypeJSON:
		return nil
	}
	return fmt.Errorf("--kube-api-content-type=%q: must be %q or %q", ct, runtime.ContentTypeProtobuf, runtime.ContentTypeJSON)
}

// RESTConfig builds the API client configuration of a controller binary:
// from kubeconfig when set (out of cluster), else the Pod's service
// account, with the client-side rate limit of --kube-api-qps and
// --kube-api-burst and the wire format of --kube-api-content-type.
func RESTConfig(kubeconfig string, qps float64, burst int, contentType string) (*rest.Config, error) {
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
	cfg.ContentType = contentType
	return cfg, nil
}

// ComponentConfig is the client configuration a component builds its
// clientset from: a copy of base with the component's user agent and, when
// base names no wire format, DefaultContentType. JSON stays acceptable in
// answers, for any kind the API server cannot serve as protobuf.
func ComponentConfig(base *rest.Config, userAgent string) *rest.Config {
	cfg := rest.AddUserAgent(rest.CopyConfig(base), userAgent)
	if cfg.ContentType == "" {
		cfg.ContentType = DefaultContentType
	}
	if cfg.AcceptContentTypes == "" && cfg.ContentType == runtime.ContentTypeProtobuf {
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	return cfg
}

// LeaseClient is the API client of a component's leader election or
// presence Lease: the component's config with a rate limiter of its own
// (user agent "<component>/leader-election", as kube-controller-manager
// names its leader election client). A renewal sent through the client
// that does the work would queue behind that work's writes in the
// client-side rate limiter: a burst of a few hundred VolumeAttachments at
// the default QPS holds it back for longer than the renew deadline, and
// the component would stop working in the middle of the burst for a
// Lease nobody else wanted.
func LeaseClient(base *rest.Config, component string) (kubernetes.Interface, error) {
	cfg := ComponentConfig(base, component+"/leader-election")
	cfg.RateLimiter = nil // never share the work client's limiter
	return kubernetes.NewForConfig(cfg)
}
