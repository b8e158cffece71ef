package csimock

import (
	"encoding/base64"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tokenPrefix versions the ListVolumes token format.
const tokenPrefix = "lv1."

// A ListVolumes token names the last volume ID of the previous page, not an
// offset: deleting or adding volumes between pages then neither repeats nor
// skips the volumes that stayed, and a token stays valid even when the
// volume it names was deleted meanwhile.
func encodeToken(lastID string) string {
	return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(lastID))
}

func decodeToken(tok string) (string, error) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return "", status.Errorf(codes.Aborted, "invalid starting_token %q", tok)
	}
	id, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(id) == 0 {
		return "", status.Errorf(codes.Aborted, "invalid starting_token %q", tok)
	}
	return string(id), nil
}

type listEntry struct {
	volume *csi.Volume
	nodes  []string
}

type listPage struct {
	entries []listEntry
	next    string
}

// listVolumes returns up to max volumes (0: all) in ID order after token.
func (s *store) listVolumes(token string, max int) (listPage, error) {
	after := ""
	if token != "" {
		var err error
		if after, err = decodeToken(token); err != nil {
			return listPage{}, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sortedIDs == nil {
		s.sortedIDs = make([]string, 0, len(s.volumes))
		for id := range s.volumes {
			s.sortedIDs = append(s.sortedIDs, id)
		}
		sort.Strings(s.sortedIDs)
	}
	ids := s.sortedIDs
	start := 0
	if after != "" {
		start = sort.SearchStrings(ids, after)
		if start < len(ids) && ids[start] == after {
			start++
		}
	}
	end := len(ids)
	if max > 0 && start+max < end {
		end = start + max
	}
	var page listPage
	for _, id := range ids[start:end] {
		v := s.volumes[id]
		page.entries = append(page.entries, listEntry{volume: csiVolume(v), nodes: sortedNodes(v)})
	}
	if end < len(ids) {
		page.next = encodeToken(ids[end-1])
	}
	return page, nil
}

// endlessTokenPrefix starts the tokens a NextToken fault hands out.
const endlessTokenPrefix = "endless."

// endlessListRequest turns a ListVolumes request that carries a token of
// a NextToken fault into a request for the first page (the fault's
// tokens name no position); other requests pass unchanged.
func (d *Driver) endlessListRequest(req any) any {
	r, ok := req.(*csi.ListVolumesRequest)
	if !ok || !strings.HasPrefix(r.GetStartingToken(), endlessTokenPrefix) {
		return req
	}
	return &csi.ListVolumesRequest{MaxEntries: r.GetMaxEntries()}
}

// endlessListReply replaces the next_token of a ListVolumes reply as the
// fault f asks (nothing when f is empty).
func (d *Driver) endlessListReply(resp any, f NextTokenFault) {
	r, ok := resp.(*csi.ListVolumesResponse)
	if !ok {
		return
	}
	switch f {
	case NextTokenFresh:
		r.NextToken = endlessTokenPrefix + strconv.FormatUint(d.endlessTokens.Add(1), 10)
	case NextTokenRepeat:
		r.NextToken = endlessTokenPrefix + "0"
	}
}
