// Package diagnose explains where a volume stands in the attach pipeline
// (Pod → PVC → PV → CSIDriver → VolumeAttachment → csi-attacher → Node) and
// what to do when it is stuck. It is what latchctl runs.
//
// The package is pure: it never talks to the API server. A Snapshot holds the
// objects somebody fetched; Explain walks them and returns Findings;
// Status summarises VolumeAttachments. Which objects to fetch is decided here
// too (Needs), by the same walk that uses them, so that fetching (package
// diagnose/fetch) cannot drift from diagnosing. Rendering lives in
// diagnose/render.
package diagnose
