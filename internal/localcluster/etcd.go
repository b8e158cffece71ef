package localcluster

import (
	"fmt"
	"net"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd runs an embedded single-member etcd on loopback ports picked
// free at start. Both its client and its peer URL are https and demand a
// client certificate signed by pki's CA (see etcdPKI): loopback is open to
// every user of the machine, and etcd holds every Secret in the clear.
// fsync is off: the data only has to survive a restart of the
// API server inside this process (and a clean stop/start of the cluster), not a
// power loss, and fsync dominates write latency on small VMs.
func startEtcd(dataDir, logOutput string, pki *etcdPKI, ready time.Duration) (*embed.Etcd, string, error) {
	if logOutput == "" {
		logOutput = "stderr"
	}
	var lastErr error
	// Ports are picked by listening on :0 and closing; another process can
	// grab one in between, so retry a few times.
	for attempt := 0; attempt < 5; attempt++ {
		clientPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		peerPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		clientURL := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
		peerURL := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
		tlsInfo := transport.TLSInfo{
			CertFile:       pki.ServerCert,
			KeyFile:        pki.ServerKey,
			TrustedCAFile:  pki.CAFile,
			ClientCertAuth: true,
		}

		cfg := embed.NewConfig()
		cfg.Name = "latch-local"
		cfg.Dir = dataDir
		cfg.UnsafeNoFsync = true
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{logOutput}
		cfg.ListenClientUrls = []url.URL{clientURL}
		cfg.AdvertiseClientUrls = []url.URL{clientURL}
		cfg.ListenPeerUrls = []url.URL{peerURL}
		cfg.AdvertisePeerUrls = []url.URL{peerURL}
		cfg.ClientTLSInfo = tlsInfo
		cfg.PeerTLSInfo = tlsInfo
		cfg.ListenMetricsUrls = nil
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		// Plenty for tests and benchmarks (the default is 2 GiB); keep the
		// backend from growing without bound in long soaks.
		cfg.QuotaBackendBytes = 8 << 30
		cfg.AutoCompactionMode = "periodic"
		cfg.AutoCompactionRetention = "5m"

		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = fmt.Errorf("start embedded etcd in %s: %w", dataDir, err)
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			return e, clientURL.String(), nil
		case err := <-e.Err():
			e.Close()
			lastErr = fmt.Errorf("embedded etcd failed while starting: %w", err)
		case <-time.After(ready):
			e.Close()
			return nil, "", fmt.Errorf("embedded etcd not ready after %s", ready)
		}
	}
	return nil, "", lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
