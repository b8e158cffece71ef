package app

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"strings"

	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/version"
)

// Flags is the command-line scaffolding the controller binaries share: a
// flag set that stops at the first error, component-base's logging flags
// and --feature-gates (the logging gates). Each binary registers its own
// flags on the embedded FlagSet, with its own help texts.
type Flags struct {
	*flag.FlagSet
	// Logging holds the logging flags (-v, --logging-format, ...).
	Logging *logsapi.LoggingConfiguration
	// Gates knows the logging feature gates; SetFeatureGates sets them.
	Gates        featuregate.MutableVersionedFeatureGate
	featureGates map[string]bool
	// checks run after parsing, in registration order (Add…Flags).
	checks []func() error
}

// NewFlags is the flag set of the binary name, with --feature-gates
// described by featureGatesHelp.
func NewFlags(name, featureGatesHelp string) (*Flags, error) {
	f := &Flags{
		FlagSet:      flag.NewFlagSet(name, flag.ContinueOnError),
		Logging:      logsapi.NewLoggingConfiguration(),
		Gates:        featuregate.NewFeatureGate(),
		featureGates: map[string]bool{},
	}
	if err := logsapi.AddFeatureGates(f.Gates); err != nil {
		return nil, err
	}
	f.Var(cliflag.NewMapStringBool(&f.featureGates), "feature-gates", featureGatesHelp)
	return f, nil
}

// Parse adds the logging flags, parses args (Go's flag package accepts
// -flag and --flag alike), refuses positional arguments and runs the
// checks of the shared flags (AddClientFlags, AddLeaderFlags). It returns
// flag.ErrHelp for -h.
func (f *Flags) Parse(args []string) error {
	logsapi.AddGoFlags(f.Logging, f.FlagSet)
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", f.Args())
	}
	for _, check := range f.checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// ListFeatureGatesInHelp appends the gates Gates knows to --feature-gates'
// usage, one "Name=true|false (STAGE - default=...)" line each, as
// featuregate's own flag lists them (GA and deprecated gates are left out
// there too). Binaries call it once they have added their gates.
func (f *Flags) ListFeatureGatesInHelp() {
	fl := f.Lookup("feature-gates")
	fl.Usage = strings.TrimSpace(fl.Usage) + " Options are:\n" + strings.Join(f.Gates.KnownFeatures(), "\n")
}

// FeatureGatesSet are the gates --feature-gates named, with their values
// (a copy).
func (f *Flags) FeatureGatesSet() map[string]bool {
	return maps.Clone(f.featureGates)
}

// SetFeatureGates applies --feature-gates to Gates. Binaries call it after
// their own checks of the other flags.
func (f *Flags) SetFeatureGates() error {
	if err := f.Gates.SetFromMap(f.featureGates); err != nil {
		return fmt.Errorf("--feature-gates: %w", err)
	}
	return nil
}

// Start is the first step of a controller binary once its logging is
// applied: it puts the process's logger into ctx, logs that component
// starts, with the build's version, and builds the API client
// configuration (RESTConfig). An error is logged too; the binary then
// exits 1.
func Start(ctx context.Context, component string, c ClientOptions) (context.Context, *rest.Config, error) {
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Starting "+component, "version", version.Version)
	applyMemoryLimit(logger)
	restConfig, err := RESTConfig(c.Kubeconfig, c.QPS, c.Burst, c.ContentType)
	if err != nil {
		logger.Error(err, "Cannot build an API client configuration")
		return ctx, nil, err
	}
	return ctx, restConfig, nil
}
