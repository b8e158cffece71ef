package app

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ClientOptions are the flags of the API client both binaries have under
// the same names: --kubeconfig, --kube-api-qps, --kube-api-burst and
// --kube-api-content-type.
type ClientOptions struct {
	Kubeconfig  string
	QPS         float64
	Burst       int
	ContentType string
}

// AddClientFlags registers c's flags with c's values as defaults (an empty
// ContentType defaults to DefaultContentType). Parse checks the content
// type.
func (f *Flags) AddClientFlags(c *ClientOptions) {
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	f.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "Path to a kubeconfig file. Required only when running out of cluster.")
	f.Float64Var(&c.QPS, "kube-api-qps", c.QPS, "Client-side QPS limit towards the API server. The API server's Priority and Fairness protects it.")
	f.IntVar(&c.Burst, "kube-api-burst", c.Burst, "Client-side burst towards the API server.")
	f.StringVar(&c.ContentType, "kube-api-content-type", c.ContentType, "Wire format of requests to the API server: application/vnd.kubernetes.protobuf or application/json.")
	f.checks = append(f.checks, func() error { return ValidateContentType(c.ContentType) })
}

// CommonOptions are the flags csi-attacher and attachdetach-controller
// share: the API client's (ClientOptions), --version, --metrics-path and
// the leader election switch and timing (AddLeaderFlags).
type CommonOptions struct {
	Client      ClientOptions
	ShowVersion bool
	MetricsPath string
	Leader      LeaderElection
}

// AddCommonFlags registers c's flags with c's values as defaults, the
// leader election ones under leaderPrefix (AddLeaderFlags). A binary's
// own leader flags (the Lease's namespace, name, labels) stay its own:
// upstream names them differently for each.
func (f *Flags) AddCommonFlags(leaderPrefix string, c *CommonOptions) {
	f.AddClientFlags(&c.Client)
	f.BoolVar(&c.ShowVersion, "version", false, "Print the version and exit.")
	f.StringVar(&c.MetricsPath, "metrics-path", c.MetricsPath, "HTTP path of the metrics.")
	f.AddLeaderFlags(leaderPrefix, &c.Leader)
}

// AddLeaderFlags registers the leader election switch and timing under
// prefix ("leader-election" for csi-attacher, as external-attacher names
// them; "leader-elect" for attachdetach-controller, as
// kube-controller-manager does): prefix, prefix-lease-duration,
// prefix-renew-deadline and prefix-retry-period, with le's values as
// defaults. Parse checks that the renew deadline is shorter than the lease
// duration when election is on (client-go's elector refuses it later).
func (f *Flags) AddLeaderFlags(prefix string, le *LeaderElection) {
	f.BoolVar(&le.Enabled, prefix, le.Enabled, "Elect a leader on a Lease before working (run more than one replica for high availability).")
	f.DurationVar(&le.LeaseDuration, prefix+"-lease-duration", le.LeaseDuration, "Duration non-leader candidates wait after observing a leadership renewal before trying to take over.")
	f.DurationVar(&le.RenewDeadline, prefix+"-renew-deadline", le.RenewDeadline, "Duration the leader retries refreshing leadership before giving it up. Must be less than the lease duration.")
	f.DurationVar(&le.RetryPeriod, prefix+"-retry-period", le.RetryPeriod, "Duration candidates wait between tries of actions.")
	f.checks = append(f.checks, func() error {
		if le.Enabled && le.RenewDeadline >= le.LeaseDuration {
			return fmt.Errorf("--%s-renew-deadline (%s) must be less than --%s-lease-duration (%s)", prefix, le.RenewDeadline, prefix, le.LeaseDuration)
		}
		return nil
	})
}

// LabelsValue is a flag.Value of Lease labels that accepts external-attacher's
// form, key:value pairs separated by commas ("app:foo,b:c"), and the
// key=value form latch documented before (both can be mixed; repeating the
// flag adds labels). Keys and values are checked as label keys and values,
// so that a typo fails at start-up, not when the Lease is written.
type LabelsValue map[string]string

// Set adds the labels of one flag value.
func (l LabelsValue) Set(value string) error {
	for _, item := range strings.Split(value, ",") {
		if item == "" {
			continue
		}
		sep := ":"
		if !strings.Contains(item, ":") {
			sep = "="
		}
		parts := strings.Split(item, sep)
		if len(parts) != 2 || strings.ContainsAny(parts[1], ":=") {
			return fmt.Errorf("label %q: want key:value (or key=value)", item)
		}
		key, val := parts[0], parts[1]
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return fmt.Errorf("label %q: key %q: %s", item, key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(val); len(errs) > 0 {
			return fmt.Errorf("label %q: value %q: %s", item, val, strings.Join(errs, "; "))
		}
		l[key] = val
	}
	return nil
}

// String is the labels as key:value pairs, sorted by key.
func (l LabelsValue) String() string {
	pairs := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		pairs = append(pairs, k+":"+l[k])
	}
	return strings.Join(pairs, ",")
}
