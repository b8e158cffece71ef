package testsupport

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// server answers every request with an empty VolumeAttachment and counts
// what reached it.
func server(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var reached atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"kind":"VolumeAttachment","apiVersion":"storage.k8s.io/v1","metadata":{"name":"va"}}`))
	}))
	t.Cleanup(s.Close)
	return s, &reached
}

func client(t *testing.T, s *httptest.Server, tr *APITransport) kubernetes.Interface {
	return clientSending(t, s, tr, "")
}

// clientSending is client with the content type it sends objects in
// ("": client-go's default, JSON).
func clientSending(t *testing.T, s *httptest.Server, tr *APITransport, contentType string) kubernetes.Interface {
	cfg := &rest.Config{Host: s.URL, ContentConfig: rest.ContentConfig{ContentType: contentType}}
	cfg.Wrap(tr.Wrap)
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAPITransportFailsTheNthMatchingWriteWithAStatusClientGoUnderstands(t *testing.T) {
	s, reached := server(t)
	tr := NewAPITransport()
	c := client(t, s, tr)
	ctx := context.Background()
	tr.FailNth(Match{Method: "create", Resource: "volumeattachments"}, 2, http.StatusConflict, "")
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}}
	for i := 1; i <= 3; i++ {
		_, err := c.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
		if i == 2 && !apierrors.IsConflict(err) {
			t.Errorf("create %d: %v, want a Conflict", i, err)
		}
		if i != 2 && err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	if got := reached.Load(); got != 2 {
		t.Errorf("%d requests reached the server, want 2 (the failed one must not)", got)
	}
	w := tr.Writes()
	if len(w) != 3 || w[1].Code != http.StatusConflict || !w[1].Injected || w[0].Code != http.StatusCreated || w[0].Injected {
		t.Errorf("writes = %+v, want 3 with the second an injected 409", w)
	}
	if got := tr.Count("POST volumeattachments"); got != 3 {
		t.Errorf("Count = %d, want 3", got)
	}
}

func TestAPITransportRecordsWritesByResourceSubresourceAndName(t *testing.T) {
	s, _ := server(t)
	tr := NewAPITransport()
	c := client(t, s, tr)
	ctx := context.Background()
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}}
	_, _ = c.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
	_, _ = c.StorageV1().VolumeAttachments().Get(ctx, "va", metav1.GetOptions{})
	_ = c.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{})
	w := tr.Writes()
	if len(w) != 2 {
		t.Fatalf("writes = %+v, want the update and the delete (no GET)", w)
	}
	for m, want := range map[Match]bool{
		{Resource: "volumeattachments"}:                          false,
		{Resource: "volumeattachments/status"}:                   true,
		{Resource: "volumeattachments/*"}:                        true,
		{Method: "update", Resource: "volumeattachments/status"}: true,
		{Method: "patch", Resource: "volumeattachments/status"}:  false,
		{Resource: "volumeattachments/*", Name: "other"}:         false,
	} {
		if got := m.matches(w[0].Method, parsePath(w[0].Path)); got != want {
			t.Errorf("%+v matches %s: %v, want %v", m, w[0].Path, got, want)
		}
	}
	if w[0].Key() != "PUT volumeattachments/status" || w[0].Name != "va" {
		t.Errorf("first write = %+v", w[0])
	}
	if w[1].Key() != "DELETE pods" || w[1].Namespace != "ns" || w[1].Name != "p" {
		t.Errorf("second write = %+v", w[1])
	}
}

func TestAPITransportFailAfterWriteLetsTheWriteThroughAndHidesTheAnswer(t *testing.T) {
	s, reached := server(t)
	tr := NewAPITransport()
	c := client(t, s, tr)
	tr.FailAfterWrite(Match{Method: "create", Resource: "volumeattachments", Name: ""}, 1, http.StatusGatewayTimeout, "")
	_, err := c.StorageV1().VolumeAttachments().Create(context.Background(), &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va"}}, metav1.CreateOptions{})
	if !apierrors.IsTimeout(err) {
		t.Errorf("create: %v, want a Timeout", err)
	}
	if reached.Load() != 1 {
		t.Errorf("the write did not reach the server")
	}
}

func TestAPITransportDelayAndPartition(t *testing.T) {
	s, reached := server(t)
	tr := NewAPITransport()
	tr.SetPartitionTimeout(50 * time.Millisecond)
	c := client(t, s, tr)
	ctx := context.Background()
	r := tr.Delay(Match{Method: "get"}, 100*time.Millisecond)
	start := time.Now()
	_, _ = c.StorageV1().VolumeAttachments().Get(ctx, "va", metav1.GetOptions{})
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("delayed GET took %s, want at least 100ms", d)
	}
	tr.Remove(r)
	tr.Partition()
	before := reached.Load()
	if _, err := c.StorageV1().VolumeAttachments().Get(ctx, "va", metav1.GetOptions{}); err == nil {
		t.Error("GET in a partition succeeded")
	}
	if reached.Load() != before {
		t.Error("a request in a partition reached the server")
	}
	tr.Heal()
	if _, err := c.StorageV1().VolumeAttachments().Get(ctx, "va", metav1.GetOptions{}); err != nil {
		t.Errorf("GET after Heal: %v", err)
	}
}

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/storage.k8s.io/v1/volumeattachments/va/status": "volumeattachments/status",
		"/apis/storage.k8s.io/v1/volumeattachments":           "volumeattachments",
		"/api/v1/namespaces/ns/pods/p/status":                 "pods/status",
		"/api/v1/namespaces/ns/events":                        "events",
		"/api/v1/persistentvolumes/pv":                        "persistentvolumes",
		"/api/v1/namespaces":                                  "namespaces",
	} {
		if got := ResourceOf(path); got != want {
			t.Errorf("ResourceOf(%s) = %q, want %q", path, got, want)
		}
	}
}

// A write counts from the moment it is sent: a test that saw the write's
// effect on the server, before the writer's client read the answer,
// finds it counted. Writes lists it once answered.
func TestAPITransportCountsAWriteBeforeItsAnswer(t *testing.T) {
	received, release := make(chan struct{}), make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(received) // the server has the write: its effect is visible
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"kind":"VolumeAttachment","apiVersion":"storage.k8s.io/v1","metadata":{"name":"va"}}`))
	}))
	t.Cleanup(s.Close)
	tr := NewAPITransport()
	c := client(t, s, tr)
	done := make(chan error, 1)
	go func() {
		_, err := c.StorageV1().VolumeAttachments().Patch(context.Background(), "va", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{}, "status")
		done <- err
	}()
	<-received
	if got := tr.Count("PATCH volumeattachments/status"); got != 1 {
		t.Errorf("Count while the answer is pending = %d, want 1", got)
	}
	if got := len(tr.Writes()); got != 0 {
		t.Errorf("Writes while the answer is pending = %d, want 0 (no answer yet)", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w := tr.Writes(); len(w) != 1 || w[0].Code != http.StatusOK || w[0].Key() != "PATCH volumeattachments/status" {
		t.Errorf("Writes after the answer = %+v, want the answered PATCH", w)
	}
	if got := tr.Count("PATCH volumeattachments/status"); got != 1 {
		t.Errorf("Count after the answer = %d, want still 1", got)
	}
}

func TestAPITransportDeniedListsRefusedReadsAndWritesButNotInjectedAnswers(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		code := http.StatusOK
		switch {
		case r.Method == http.MethodGet:
			code = http.StatusForbidden
		case r.Method == http.MethodDelete:
			code = http.StatusUnauthorized
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":` + strconv.Itoa(code) + `}`))
	}))
	t.Cleanup(s.Close)
	tr := NewAPITransport()
	c := client(t, s, tr)
	ctx := context.Background()
	tr.Fail(Match{Method: "patch", Resource: "volumeattachments"}, 0, http.StatusForbidden, "injected")
	_, _ = c.StorageV1().VolumeAttachments().Get(ctx, "va", metav1.GetOptions{})
	_ = c.StorageV1().VolumeAttachments().Delete(ctx, "va", metav1.DeleteOptions{})
	_, _ = c.StorageV1().VolumeAttachments().Patch(ctx, "va", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
	want := []string{
		"403 GET /apis/storage.k8s.io/v1/volumeattachments/va",
		"401 DELETE /apis/storage.k8s.io/v1/volumeattachments/va",
	}
	if got := tr.Denied(); !slices.Equal(got, want) {
		t.Errorf("Denied() = %q, want %q", got, want)
	}
}
