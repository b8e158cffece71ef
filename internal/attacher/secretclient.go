package attacher

import (
	"context"
	"errors"
	"fmt"
	"io"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/attacher/decide"
)

// maxSecretBytes bounds what is read of a Secret GET response: the API
// server stores at most 1 MiB of data per Secret; the rest is metadata.
const maxSecretBytes = 3 << 20

// secrets reads the controller-publish secret ref names (none when nil)
// and returns its data with the facts decide.BeforeCall judges: a missing
// or forbidden secret is a fact, not an error; other read errors are
// returned and retried.
func (e *executor) secrets(ctx context.Context, ref *v1.SecretReference) (map[string]string, decide.CallFacts, error) {
	facts := decide.CallFacts{Secret: ref}
	if ref == nil {
		return nil, facts, nil
	}
	s, err := getSecret(ctx, e.client, ref.Namespace, ref.Name)
	switch {
	case apierrors.IsNotFound(err):
		facts.SecretState = decide.SecretNotFound
		return nil, facts, nil
	case apierrors.IsForbidden(err):
		facts.SecretState, facts.SecretDenial = decide.SecretForbidden, err.Error()
		return nil, facts, nil
	case err != nil:
		return nil, facts, fmt.Errorf("get controller publish secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, facts, nil
}

// getSecret reads a Secret so that its data can reach no logger, whatever
// the verbosity, the log format or the ContextualLogging feature gate.
//
// client-go's Get logs response bodies itself: rest.Request's Do passes
// the body to logBody, which at -v=8 and up logs it (a hex dump for
// protobuf, the JSON text otherwise) through klog.FromContext(ctx): the
// request context's logger with contextual logging on, the global logger
// with it off. The transport's debug wrappers (-v=6 to -v=9) log URLs,
// headers and timings, never bodies. So the Secret is fetched with
// Request.Stream instead, which hands back the body of a successful
// response untouched (only an error response, a Status without secret
// data, is read and logged), and decoded here. Rate limiting, retries,
// authentication and the wire format stay client-go's.
//
// withoutAPIDumps additionally keeps the URL and headers out of the log
// when contextual logging is on.
func getSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) (*v1.Secret, error) {
	ctx = withoutAPIDumps(ctx)
	rc, ok := client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		// A fake clientset (unit tests): no HTTP, nothing logged.
		return client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	body, err := rc.Get().Namespace(namespace).Resource("secrets").Name(name).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s: %w", namespace, name, err)
	}
	if len(data) > maxSecretBytes {
		return nil, fmt.Errorf("read Secret %s/%s: response larger than %d bytes", namespace, name, maxSecretBytes)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, &v1.Secret{})
	if err != nil {
		// The decoder's message may quote the data it choked on: say
		// only that decoding failed.
		return nil, fmt.Errorf("decode Secret %s/%s: %w", namespace, name, errSecretUndecodable)
	}
	s, ok := obj.(*v1.Secret)
	if !ok {
		return nil, fmt.Errorf("decode Secret %s/%s: got a %T", namespace, name, obj)
	}
	return s, nil
}

var errSecretUndecodable = errors.New("the API server's response is not a Secret in a known encoding")
