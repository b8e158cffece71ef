package localcluster

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// RunTestMain starts one cluster for a whole test package, stores it in
// *shared, runs the tests and stops the cluster. Use it from TestMain:
//
//	var cluster *localcluster.Cluster
//	func TestMain(m *testing.M) { os.Exit(localcluster.RunTestMain(m, &cluster)) }
//
// Tests in the package share the cluster, so they must use unique object
// names (or a namespace of their own).
func RunTestMain(m *testing.M, shared **Cluster) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := Start(ctx, Options{})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
		return 1
	}
	*shared = c
	code := m.Run()
	c.Stop()
	return code
}
