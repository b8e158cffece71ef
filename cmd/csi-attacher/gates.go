package main

import (
	"maps"
	"slices"

	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
)

// External-attacher v4.13.0's feature gates. Its --feature-gates is the
// gate set of k8s.io/apiserver, which it links, plus two of its own; an
// image swap keeps the flag, so csi-attacher accepts every one of them
// (test/interop: TestCSIAttacher_acceptsEveryFeatureGateOfUpstreamExternalAttacher
// reads upstream's --help and fails on a gate missing here). AllAlpha and
// AllBeta come with every component-base gate set.
const (
	// ReleaseLeaderElectionOnExit (alpha, off): upstream releases its
	// Lease on SIGTERM/SIGINT after its workers stop. latch always does
	// (after draining, app.RunAsLeader), so =true holds and =false has no
	// effect.
	releaseLeaderElectionOnExit featuregate.Feature = "ReleaseLeaderElectionOnExit"
	// MutableCSINodeAllocatableCount (GA, on; upstream's --help does not
	// list GA gates): upstream sets status.attachError.errorCode from the
	// gRPC code. latch always does, so =true holds and =false has no
	// effect.
	mutableCSINodeAllocatableCount featuregate.Feature = "MutableCSINodeAllocatableCount"
)

// upstreamGates are the gates csi-attacher accepts for compatibility, with
// upstream's defaults and stages.
var upstreamGates = map[featuregate.Feature]featuregate.FeatureSpec{
	releaseLeaderElectionOnExit:    {Default: false, PreRelease: featuregate.Alpha},
	mutableCSINodeAllocatableCount: {Default: true, PreRelease: featuregate.GA},
	// k8s.io/apiserver's gates: they configure an API server, which the
	// sidecar is not; upstream links them but nothing in it reads them.
	"APIResponseCompression":                              {Default: true, PreRelease: featuregate.Beta},
	"APIServerIdentity":                                   {Default: true, PreRelease: featuregate.Beta},
	"APIServerWebhookAuthenticationToken":                 {Default: false, PreRelease: featuregate.Alpha},
	"APIServingWithRoutine":                               {Default: false, PreRelease: featuregate.Alpha},
	"AllowParsingUserUIDFromCertAuth":                     {Default: true, PreRelease: featuregate.Beta},
	"AllowUnsafeMalformedObjectDeletion":                  {Default: true, PreRelease: featuregate.Beta},
	"CBORServingAndStorage":                               {Default: false, PreRelease: featuregate.Alpha},
	"ComponentFlagz":                                      {Default: true, PreRelease: featuregate.Beta},
	"ComponentStatusz":                                    {Default: true, PreRelease: featuregate.Beta},
	"ConcurrentWatchObjectDecode":                         {Default: true, PreRelease: featuregate.Beta},
	"ConsistentListFromCacheSkipTimeoutFallback":          {Default: false, PreRelease: featuregate.Alpha},
	"ConstrainedImpersonation":                            {Default: true, PreRelease: featuregate.Beta},
	"CoordinatedLeaderElection":                           {Default: false, PreRelease: featuregate.Beta},
	"DeclarativeValidationBeta":                           {Default: true, PreRelease: featuregate.Beta},
	"DetectCacheInconsistency":                            {Default: true, PreRelease: featuregate.Beta},
	"EtcdRangeStream":                                     {Default: true, PreRelease: featuregate.Beta},
	"ExcludeAdmissionWebhookVirtualResources":             {Default: true, PreRelease: featuregate.Beta},
	"ListFromCacheSnapshot":                               {Default: true, PreRelease: featuregate.Beta},
	"ManifestBasedAdmissionControlConfig":                 {Default: true, PreRelease: featuregate.Beta},
	"NativeHistograms":                                    {Default: true, PreRelease: featuregate.Beta},
	"OpenAPIEnums":                                        {Default: true, PreRelease: featuregate.Beta},
	"RemoteRequestHeaderUID":                              {Default: true, PreRelease: featuregate.Beta},
	"ShardedListAndWatch":                                 {Default: false, PreRelease: featuregate.Alpha},
	"SizeBasedListCostEstimate":                           {Default: true, PreRelease: featuregate.Beta},
	"StorageVersionAPI":                                   {Default: false, PreRelease: featuregate.Alpha},
	"StorageVersionHash":                                  {Default: true, PreRelease: featuregate.Beta},
	"StructuredAuthenticationConfigurationEgressSelector": {Default: true, PreRelease: featuregate.Beta},
	"StructuredAuthenticationConfigurationJWKSMetrics":    {Default: true, PreRelease: featuregate.Beta},
	"TokenRequestServiceAccountUIDValidation":             {Default: true, PreRelease: featuregate.Beta},
	"UnauthenticatedHTTP2DOSMitigation":                   {Default: true, PreRelease: featuregate.Beta},
	"UnknownVersionInteroperabilityProxy":                 {Default: true, PreRelease: featuregate.Beta},
	"WatchList":                                           {Default: true, PreRelease: featuregate.Beta},
	"WatchListCompression":                                {Default: true, PreRelease: featuregate.Beta},
	"WebhookRoundTripLoadBalancing":                       {Default: true, PreRelease: featuregate.Beta},
}

// latchBehaviour says what latch does about an upstream gate, whatever its
// value.
func latchBehaviour(gate featuregate.Feature) string {
	switch gate {
	case releaseLeaderElectionOnExit:
		return "latch always releases its Lease on exit, after its workers drain"
	case mutableCSINodeAllocatableCount:
		return "latch always sets status.attachError.errorCode from the gRPC code"
	}
	return "an API server gate; csi-attacher serves no API"
}

// noEffectGates are the upstream gates of set (--feature-gates) whose
// value does not change what latch does: every apiserver gate, and
// ReleaseLeaderElectionOnExit or MutableCSINodeAllocatableCount set to
// false (latch behaves as with true), sorted by name.
func noEffectGates(set map[string]bool) []featuregate.Feature {
	var out []featuregate.Feature
	for _, name := range slices.Sorted(maps.Keys(set)) {
		gate := featuregate.Feature(name)
		if _, ok := upstreamGates[gate]; !ok {
			continue
		}
		if (gate == releaseLeaderElectionOnExit || gate == mutableCSINodeAllocatableCount) && set[name] {
			continue
		}
		out = append(out, gate)
	}
	return out
}

// logUpstreamGates logs, once at start-up, each upstream gate
// --feature-gates set that has no effect in latch.
func logUpstreamGates(logger klog.Logger, set map[string]bool) {
	for _, gate := range noEffectGates(set) {
		logger.Info("Feature gate has no effect in latch", "gate", gate, "value", set[string(gate)], "latch", latchBehaviour(gate))
	}
}
