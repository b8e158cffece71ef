package diagnose

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	storagev1 "k8s.io/api/storage/v1"
)

// AttachmentState is the one-word state of a VolumeAttachment.
type AttachmentState string

const (
	StateAttached  AttachmentState = "attached"
	StatePending   AttachmentState = "pending"
	StateFailing   AttachmentState = "failing"
	StateDetaching AttachmentState = "detaching"
)

// Row is one VolumeAttachment in `latchctl status`.
type Row struct {
	Name             string          `json:"name"`
	Driver           string          `json:"driver"`
	Node             string          `json:"node"`
	PersistentVolume string          `json:"persistentVolume,omitempty"`
	State            AttachmentState `json:"state"`
	Created          time.Time       `json:"created"`
	// AgeSeconds is the time since creation (pending, attached) or since
	// deletion was requested (detaching).
	AgeSeconds int64 `json:"ageSeconds"`
	// Error is attachError or detachError, whichever applies.
	Error string `json:"error,omitempty"`
	// ErrorAgeSeconds is the age of Error.
	ErrorAgeSeconds int64 `json:"errorAgeSeconds,omitempty"`
}

// Age returns AgeSeconds as a duration.
func (r Row) Age() time.Duration { return time.Duration(r.AgeSeconds) * time.Second }

// SortKey orders status rows.
type SortKey string

const (
	SortDriver SortKey = "driver" // driver, node, name: groups a driver's nodes together
	SortNode   SortKey = "node"   // node, driver, name
	SortAge    SortKey = "age"    // oldest first, like kubectl --sort-by=.metadata.creationTimestamp
	SortName   SortKey = "name"
)

// SortKeys lists the valid sort keys for flag validation and help.
func SortKeys() []SortKey { return []SortKey{SortDriver, SortNode, SortAge, SortName} }

// StatusOptions select and order rows.
type StatusOptions struct {
	// Driver keeps only VolumeAttachments of this driver when not empty.
	Driver string
	SortBy SortKey
}

// Attachments summarises VolumeAttachments, one Row each, for `latchctl status`.
func Attachments(now time.Time, vas []*storagev1.VolumeAttachment, opts StatusOptions) ([]Row, error) {
	if opts.SortBy == "" {
		opts.SortBy = SortDriver
	}
	if !slices.Contains(SortKeys(), opts.SortBy) {
		return nil, fmt.Errorf("unknown sort key %q (want one of %v)", opts.SortBy, SortKeys())
	}
	rows := []Row{}
	for _, va := range vas {
		if opts.Driver != "" && va.Spec.Attacher != opts.Driver {
			continue
		}
		rows = append(rows, rowOf(now, va))
	}
	slices.SortFunc(rows, func(a, b Row) int {
		switch opts.SortBy {
		case SortNode:
			return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Driver, b.Driver), strings.Compare(a.Name, b.Name))
		case SortAge:
			return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Name, b.Name))
		case SortName:
			return strings.Compare(a.Name, b.Name)
		}
		return cmp.Or(strings.Compare(a.Driver, b.Driver), strings.Compare(a.Node, b.Node), strings.Compare(a.Name, b.Name))
	})
	return rows, nil
}

func rowOf(now time.Time, va *storagev1.VolumeAttachment) Row {
	r := Row{
		Name:    va.Name,
		Driver:  va.Spec.Attacher,
		Node:    va.Spec.NodeName,
		State:   AttachmentState(vaState(va)),
		Created: va.CreationTimestamp.UTC(),
	}
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		r.PersistentVolume = *pv
	}
	since := va.CreationTimestamp.Time
	e := va.Status.AttachError
	if va.DeletionTimestamp != nil {
		since = va.DeletionTimestamp.Time
		e = va.Status.DetachError
	} else if va.Status.Attached {
		e = nil
	}
	r.AgeSeconds = seconds(now.Sub(since))
	if e != nil {
		r.Error = e.Message
		r.ErrorAgeSeconds = seconds(now.Sub(e.Time.Time))
	}
	return r
}

func seconds(d time.Duration) int64 { return int64(max(d, 0) / time.Second) }

// Failing reports whether any row has an error: `latchctl status` exits 1
// then, like `explain` does on a problem.
func Failing(rows []Row) bool {
	return slices.ContainsFunc(rows, func(r Row) bool { return r.Error != "" })
}
