package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// scaleProc is a component run as a child process whose output lines are
// watched for milestones (cache sync, state rebuilt): the time a line is
// read stands for the time it was logged.
type scaleProc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	out     *milestoneWriter
	log     *os.File
}

// milestone is a substring that marks a step; it only counts after the
// milestone before it in the list was seen.
type milestone struct{ key, substr string }

type milestoneWriter struct {
	mu         sync.Mutex
	file       *os.File
	partial    []byte
	milestones []milestone
	next       int
	seen       map[string]time.Time
	gc         gcTally
}

// gcTally sums the Go runtime's collection trace (GODEBUG=gctrace=1, one
// line per collection on stderr): how many ran, how many of them were
// periodic rather than brought on by the heap's growth, and their CPU
// time. The trace does not say what started a collection; one that began
// with the heap under periodicBelow of its goal was not the heap's growth
// (that starts a collection near the goal) but Go's periodic collection,
// which runs when none has for two minutes, or runtime.GC() ("(forced)").
type gcTally struct {
	Count, Periodic int
	CPUSeconds      float64
}

// periodicBelow is the share of its goal under which a collection's
// starting heap says the collection was periodic.
const periodicBelow = 0.8

// Sub is t minus an earlier tally.
func (t gcTally) Sub(earlier gcTally) gcTally {
	return gcTally{Count: t.Count - earlier.Count, Periodic: t.Periodic - earlier.Periodic, CPUSeconds: t.CPUSeconds - earlier.CPUSeconds}
}

// add counts line when it is a collection trace line (parseGCTrace).
func (t *gcTally) add(line string) {
	g, ok := parseGCTrace(line)
	if !ok {
		return
	}
	t.Count++
	t.CPUSeconds += g.cpuSeconds
	if g.forced || (g.hasHeap && g.hasGoal && float64(g.startMB) < periodicBelow*float64(g.goalMB)) {
		t.Periodic++
	}
}

func (m *milestoneWriter) Write(p []byte) (int, error) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _ = m.file.Write(p)
	m.partial = append(m.partial, p...)
	for {
		i := bytes.IndexByte(m.partial, '\n')
		if i < 0 {
			break
		}
		line := string(m.partial[:i])
		m.partial = m.partial[i+1:]
		m.gc.add(line)
		if m.next < len(m.milestones) && strings.Contains(line, m.milestones[m.next].substr) {
			m.seen[m.milestones[m.next].key] = now
			m.next++
		}
	}
	return len(p), nil
}

// startScaleProc starts binary with env added to its environment, and
// GODEBUG=gctrace=1 so that its collections can be told apart from its
// own work (scaleProc.gc).
func startScaleProc(name, binary, logPath string, env []string, milestones []milestone, args ...string) (*scaleProc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	w := &milestoneWriter{file: f, milestones: milestones, seen: map[string]time.Time{}}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(append(os.Environ(), "GODEBUG=gctrace=1"), env...)
	cmd.Stdout, cmd.Stderr = w, w
	p := &scaleProc{name: name, cmd: cmd, exited: make(chan struct{}), out: w, log: f}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, binary, err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// since returns how long after the start milestone key was seen.
func (p *scaleProc) since(key string) (float64, bool) {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	at, ok := p.out.seen[key]
	if !ok {
		return 0, false
	}
	return at.Sub(p.started).Seconds(), true
}

// gc is the process's collections so far, from its trace lines.
func (p *scaleProc) gc() gcTally {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	return p.out.gc
}

// usage is the process's CPU time and peak RSS so far.
func (p *scaleProc) usage() Usage {
	u, _ := procUsage(p.cmd.Process.Pid)
	return u
}

// rssBytes is the process's resident set now (VmRSS), 0 when unknown.
func (p *scaleProc) rssBytes() uint64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// alive fails once the process exited.
func (p *scaleProc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited early: %v (log %s)", p.name, p.cmd.ProcessState, p.log.Name())
	default:
		return nil
	}
}

// stop sends SIGTERM, SIGKILL after 30 seconds, and waits.
func (p *scaleProc) stop() {
	terminate(p.cmd.Process, p.exited)
	p.log.Close()
}

// waitUntil polls cond every 100ms while the process lives, up to timeout.
func (p *scaleProc) waitUntil(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond(ctx) {
			return nil
		}
		if err := p.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s not within %s", p.name, what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
