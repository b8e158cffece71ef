package app

// client-go's REST client metrics, as kube-controller-manager serves them
// (the external-attacher serves none; for csi-attacher they are latch's
// addition): rest_client_requests_total{code,method,host},
// rest_client_request_duration_seconds{verb,host},
// rest_client_rate_limiter_duration_seconds{verb,host} (time a request
// waited for the client-side --kube-api-qps/--kube-api-burst limit), the
// request and response sizes, retries and the transport cache's counters.
// Importing the package registers them with component-base's legacy
// registry, which both binaries serve, and hooks them into client-go for
// every client the process builds. docs/metrics.md lists them.
import _ "k8s.io/component-base/metrics/prometheus/restclient"
