package controller

import (
	"sync"

	v1 "k8s.io/api/core/v1"
)

// keyLocks serializes the work on one key (a volume, a Pod) and lets the
// work on other keys run. Entries live only while someone holds or waits
// for them.
type keyLocks[K comparable] struct {
	mu sync.Mutex
	m  map[K]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int
}

// lock locks key and returns its unlock.
func (l *keyLocks[K]) lock(key K) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[K]*keyLock{}
	}
	kl := l.m[key]
	if kl == nil {
		kl = &keyLock{}
		l.m[key] = kl
	}
	kl.users++
	l.mu.Unlock()
	kl.Lock()
	return func() {
		kl.Unlock()
		l.mu.Lock()
		if kl.users--; kl.users == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}

// volumeLocks serializes the passes of keys that share a volume, and the
// adoption of a VolumeAttachment with them.
type volumeLocks = keyLocks[v1.UniqueVolumeName]

// podLocks serializes the recording of one Pod: its informer handler and
// a Pod queue pass may record it at the same time.
type podLocks = keyLocks[string]
