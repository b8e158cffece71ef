package kubetest

import (
	"net/http"
	"strings"
	"sync"
)

// WireFormats records, through a client's transport, the Content-Type of
// every API server answer by resource ("volumeattachments",
// "persistentvolumes", ...): what a component really speaks on the wire.
type WireFormats struct {
	mu   sync.Mutex
	seen map[string]map[string]int // resource → media type → answers
}

// NewWireFormats returns an empty recorder.
func NewWireFormats() *WireFormats { return &WireFormats{seen: map[string]map[string]int{}} }

// Wrap is a rest.Config WrapTransport.
func (w *WireFormats) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode >= 300 {
			return resp, err
		}
		media, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
		res, _ := ResourceOfPath(req.URL.Path)
		w.mu.Lock()
		if w.seen[res] == nil {
			w.seen[res] = map[string]int{}
		}
		w.seen[res][strings.TrimSpace(media)]++
		w.mu.Unlock()
		return resp, nil
	})
}

// Of returns the media types answered for resource, with their counts.
func (w *WireFormats) Of(resource string) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.seen[resource] {
		out[k] = v
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ResourceOfPath returns the resource and subresource of an API path:
// /apis/storage.k8s.io/v1/volumeattachments/x/status → volumeattachments,
// status; /api/v1/namespaces/ns/pods → pods, "". A path it cannot read
// is returned whole as the resource.
func ResourceOfPath(path string) (resource, subresource string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	i := 2 // api/v1/<resource>
	if len(parts) > 0 && parts[0] == "apis" {
		i = 3 // apis/<group>/<version>/<resource>
	}
	if i < len(parts) && parts[i] == "namespaces" && i+2 < len(parts) {
		i += 2
	}
	if i >= len(parts) {
		return path, ""
	}
	if i+2 < len(parts) {
		subresource = parts[i+2]
	}
	return parts[i], subresource
}
