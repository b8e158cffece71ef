package interop

import (
	"bytes"
	"io"
	"sync"
)

// prefixed writes each line to w with "name| " in front.
func prefixed(w io.Writer, name string) io.Writer {
	return &prefixWriter{w: w, prefix: []byte(name + "| ")}
}

type prefixWriter struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  []byte
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := append(append([]byte(nil), p.prefix...), p.partial[:i+1]...)
		p.partial = p.partial[i+1:]
		if _, err := p.w.Write(line); err != nil {
			return len(b), err
		}
	}
	return len(b), nil
}
