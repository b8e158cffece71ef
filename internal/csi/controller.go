package csi

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
)

// PublishRequest is the input of ControllerPublish.
type PublishRequest struct {
	VolumeID string
	NodeID   string
	// Capability comes from VolumeCapability / VolumeCapabilityFromPVSpec.
	Capability *csipb.VolumeCapability
	// ReadOnly must already account for PUBLISH_READONLY (PublishReadOnly).
	ReadOnly      bool
	VolumeContext map[string]string
	// Secrets from spec.csi.controllerPublishSecretRef; never logged.
	Secrets map[string]string
}

// ControllerPublish calls ControllerPublishVolume.
func (c *GRPCClient) ControllerPublish(ctx context.Context, req PublishRequest) (map[string]string, error) {
	pbReq := &csipb.ControllerPublishVolumeRequest{
		VolumeId:         req.VolumeID,
		NodeId:           req.NodeID,
		VolumeCapability: req.Capability,
		Readonly:         req.ReadOnly,
		Secrets:          req.Secrets,
		VolumeContext:    req.VolumeContext,
	}
	rsp, err := call(ctx, c, "ControllerPublishVolume", pbReq, c.controller.ControllerPublishVolume)
	if err != nil {
		return nil, fmt.Errorf("ControllerPublishVolume volume %q on node %q: %w", req.VolumeID, req.NodeID, err)
	}
	return rsp.GetPublishContext(), nil
}

// ControllerUnpublish calls ControllerUnpublishVolume.
func (c *GRPCClient) ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error {
	pbReq := &csipb.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: nodeID, Secrets: secrets}
	_, err := call(ctx, c, "ControllerUnpublishVolume", pbReq, c.controller.ControllerUnpublishVolume)
	if err != nil {
		return fmt.Errorf("ControllerUnpublishVolume volume %q from node %q: %w", volumeID, nodeID, err)
	}
	return nil
}

// DefaultListVolumesMaxPages is the page budget of one ListVolumes
// listing when Options.ListVolumesMaxPages is 0: a million volumes at 100
// a page. A driver whose next_token never ends the listing (a fresh
// token every page) would otherwise be paged without bound.
const DefaultListVolumesMaxPages = 10000

// Why a ListVolumes listing was given up (ListVolumesAbortedError.Reason).
const (
	ListAbortedPageBudget    = "page_budget"
	ListAbortedRepeatedToken = "repeated_token"
)

// ListVolumesAbortedError says that a listing was given up before the
// driver ended it: after Pages pages, because the page budget was spent
// (ListAbortedPageBudget) or because the driver handed back a token it
// had given before (ListAbortedRepeatedToken), which would page in a
// circle.
type ListVolumesAbortedError struct {
	Pages  int
	Reason string
}

func (e *ListVolumesAbortedError) Error() string {
	if e.Reason == ListAbortedRepeatedToken {
		return fmt.Sprintf("ListVolumes given up after %d pages: the driver returned a next_token it had returned before, the listing would never end", e.Pages)
	}
	return fmt.Sprintf("ListVolumes given up after %d pages, the page budget: the driver returned a next_token on every page", e.Pages)
}

// ListVolumes pages through ListVolumes (maxEntries per page, 0 lets the
// driver choose) and returns volume ID → published node IDs (each node
// once). The per-call timeout applies to each page, not to the whole
// listing. The listing is bounded: at most the page budget
// (Options.ListVolumesMaxPages) of pages, and a token the driver returned
// before ends it (a loop); both are a *ListVolumesAbortedError. What it
// keeps between pages is bounded too: the result, and a digest of each
// token.
func (c *GRPCClient) ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error) {
	published := map[string][]string{}
	seen := map[[sha256.Size]byte]bool{}
	token := ""
	for page := 1; ; page++ {
		if page > c.listMaxPages {
			return nil, &ListVolumesAbortedError{Pages: c.listMaxPages, Reason: ListAbortedPageBudget}
		}
		rsp, err := c.listVolumesPage(ctx, maxEntries, token)
		if err != nil {
			return nil, fmt.Errorf("ListVolumes page %d (starting token %q): %w", page, token, err)
		}
		for _, entry := range rsp.GetEntries() {
			id := entry.GetVolume().GetVolumeId()
			if id == "" {
				continue
			}
			nodes, listed := published[id]
			for _, n := range entry.GetStatus().GetPublishedNodeIds() {
				if !slices.Contains(nodes, n) {
					nodes = append(nodes, n)
				}
			}
			if !listed || len(nodes) > 0 {
				published[id] = nodes
			}
		}
		next := rsp.GetNextToken()
		if next == "" {
			return published, nil
		}
		digest := sha256.Sum256([]byte(next))
		if seen[digest] {
			return nil, &ListVolumesAbortedError{Pages: page, Reason: ListAbortedRepeatedToken}
		}
		seen[digest] = true
		token = next
	}
}

func (c *GRPCClient) listVolumesPage(ctx context.Context, maxEntries int32, token string) (*csipb.ListVolumesResponse, error) {
	req := &csipb.ListVolumesRequest{MaxEntries: maxEntries, StartingToken: token}
	return call(ctx, c, "ListVolumes", req, c.controller.ListVolumes)
}

// WithMigrated marks the calls made with the returned context as made for
// a volume translated from an in-tree plugin (CSI migration), for the
// migrated label of csi_sidecar_operations_seconds.
func WithMigrated(ctx context.Context, migrated bool) context.Context {
	if !migrated {
		return ctx
	}
	return context.WithValue(ctx, connection.AdditionalInfoKey, connection.AdditionalInfo{Migrated: "true"})
}
