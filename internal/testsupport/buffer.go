package testsupport

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers (a child
// process's stdout and stderr, a logger) and readers.
type SyncBuffer struct {
	// Max, when above zero, bounds what is kept to the last Max bytes
	// written (the end of a long-running process's output).
	Max int
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.Max > 0 && b.buf.Len() > b.Max {
		b.buf.Next(b.buf.Len() - b.Max)
	}
	return n, err
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
