package controller

import (
	"sync"

	v1 "k8s.io/api/core/v1"
)

// volumeLocks serializes the passes of keys that share a volume. Entries
// live only while a pass holds or waits for them.
type volumeLocks struct {
	mu sync.Mutex
	m  map[v1.UniqueVolumeName]*volumeLock
}

type volumeLock struct {
	sync.Mutex
	users int
}

// lock locks volume and returns its unlock.
func (l *volumeLocks) lock(volume v1.UniqueVolumeName) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[v1.UniqueVolumeName]*volumeLock{}
	}
	vl := l.m[volume]
	if vl == nil {
		vl = &volumeLock{}
		l.m[volume] = vl
	}
	vl.users++
	l.mu.Unlock()
	vl.Lock()
	return func() {
		vl.Unlock()
		l.mu.Lock()
		if vl.users--; vl.users == 0 {
			delete(l.m, volume)
		}
		l.mu.Unlock()
	}
}
