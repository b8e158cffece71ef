// Command csi-mock-driver serves the latch mock CSI driver
// (internal/csimock) on a unix socket, with an optional loopback HTTP
// endpoint to inspect calls and change fault rules at runtime. See
// docs/csi-mock-driver.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	os.Exit(code)
}

// run serves until ctx is done and returns the exit code. started, if not
// nil, is told the HTTP endpoint's bound address once everything serves
// (tests pass port 0).
func run(ctx context.Context, args []string, stderr io.Writer, started func(httpAddr string)) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if opts.version {
		fmt.Println("csi-mock-driver", version.Version)
		return 0
	}
	defer klog.Flush()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	if err := serve(ctx, opts, started); err != nil {
		logger.Error(err, "CSI mock driver failed")
		return 1
	}
	return 0
}

func serve(ctx context.Context, opts *options, started func(string)) error {
	logger := klog.FromContext(ctx)
	cfg := opts.driver
	if opts.faultConfig != "" {
		rules, err := csimock.LoadRules(opts.faultConfig)
		if err != nil {
			return err
		}
		cfg.Faults = append(cfg.Faults, rules...)
	}
	cfg.Faults = append(cfg.Faults, opts.latencies...)
	d, err := csimock.New(cfg)
	if err != nil {
		return err
	}

	httpAddr := ""
	if opts.httpEndpoint != "" {
		lis, err := net.Listen("tcp", opts.httpEndpoint)
		if err != nil {
			return fmt.Errorf("listen on --http-endpoint: %w", err)
		}
		httpAddr = lis.Addr().String()
		srv := &http.Server{Handler: d.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "HTTP endpoint stopped")
			}
		}()
		defer func() {
			shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx) // exiting anyway
		}()
		logger.Info("HTTP endpoint serving", "address", httpAddr)
	}

	if err := d.Start(ctx, opts.csiAddress); err != nil {
		return err
	}
	defer d.Stop() // removes the socket
	for _, n := range opts.nodes {
		ep, err := d.StartNode(ctx, n)
		if err != nil {
			return err
		}
		defer ep.Stop() // removes its sockets
		logger.Info("CSI mock node endpoint started", "node", n.NodeID, "endpoint", ep.Endpoint(), "registration", ep.RegistrationSocket())
	}
	logger.Info("CSI mock driver started", "endpoint", d.Endpoint(), "driver", cfg.Name, "faultRules", len(cfg.Faults))
	if started != nil {
		started(httpAddr)
	}
	<-ctx.Done()
	logger.Info("CSI mock driver stopping")
	return nil
}
