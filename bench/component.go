package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/stack"
)

// Usage is what a component cost so far.
type Usage struct {
	// CPUSeconds is user+system CPU time; PeakRSSBytes the high-water mark
	// of the resident set. Both are zero (unknown) for a component running
	// inside the harness.
	CPUSeconds   float64
	PeakRSSBytes uint64
	// LiveHeapBytes is the Go heap marked live by the last garbage
	// collection (from GODEBUG=gctrace=1), zero when unknown.
	LiveHeapBytes uint64
}

// Component is a running csi-attacher or attachdetach-controller.
type Component interface {
	// Usage reports the cost so far; after Stop, the final figures.
	Usage() Usage
	// Stop ends the component and waits for it.
	Stop() error
}

// Launcher starts the components a scenario needs, with their default
// flags apart from the connection settings.
type Launcher interface {
	StartAttacher(ctx context.Context, csiAddress string) (Component, error)
	StartController(ctx context.Context) (Component, error)
	// Measured reports whether Usage has CPU and memory figures.
	Measured() bool
}

// InProcess runs the components as goroutines of the harness, the way
// their binaries do (same defaults). Cheap to start, but their CPU and
// memory cannot be told apart from the harness's: use it for correctness
// runs and for profiles, where the goroutines carry a "component" pprof
// label (go tool pprof -tagfocus component=csi-attacher).
type InProcess struct {
	RESTConfig *rest.Config
}

var _ Launcher = (*InProcess)(nil)

// Measured is false: in-process components share the harness's usage.
func (*InProcess) Measured() bool { return false }

// StartAttacher runs attacher.RunSidecar with cmd/csi-attacher's defaults
// (stack.AttacherConfig).
func (l *InProcess) StartAttacher(ctx context.Context, csiAddress string) (Component, error) {
	return goroutine{stack.Attacher(ctx, "csi-attacher", stack.AttacherConfig(l.RESTConfig, csiAddress))}, nil
}

// StartController runs controller.Serve with cmd/attachdetach-controller's
// defaults, without leader election and HTTP endpoint
// (stack.ControllerConfig).
func (l *InProcess) StartController(ctx context.Context) (Component, error) {
	return goroutine{stack.Controller(ctx, "attachdetach-controller", stack.ControllerConfig(l.RESTConfig))}, nil
}

// goroutine is a component of the harness's own process: its usage is
// the harness's.
type goroutine struct{ *stack.Component }

func (goroutine) Usage() Usage { return Usage{} }

// Processes runs the components as child processes, so their CPU time and
// peak RSS are their own. AttacherBinary can be any
// external-attacher-compatible binary: it gets --csi-address and
// --kubeconfig, plus AttacherArgs.
type Processes struct {
	AttacherBinary   string
	ControllerBinary string
	Kubeconfig       string
	// AttacherArgs are extra flags for the attacher (e.g. to compare
	// --worker-threads or --kube-api-qps settings).
	AttacherArgs []string
	// ControllerArgs are extra flags for the attachdetach-controller (e.g.
	// --concurrent-attach-detach-syncs).
	ControllerArgs []string
	// LogDir receives each child's stderr (one file per start).
	LogDir string
	seq    atomic.Int32
}

var _ Launcher = (*Processes)(nil)

// Measured is true: children have their own rusage.
func (*Processes) Measured() bool { return true }

// StartAttacher starts AttacherBinary against the driver at csiAddress.
func (p *Processes) StartAttacher(ctx context.Context, csiAddress string) (Component, error) {
	args := append([]string{"--csi-address=" + csiAddress, "--kubeconfig=" + p.Kubeconfig}, p.AttacherArgs...)
	return p.start(ctx, "csi-attacher", p.AttacherBinary, args...)
}

// StartController starts ControllerBinary with controllerArgs.
func (p *Processes) StartController(ctx context.Context) (Component, error) {
	return p.start(ctx, "attachdetach-controller", p.ControllerBinary, controllerArgs(p.Kubeconfig, p.ControllerArgs)...)
}

// controllerArgs are the flags the harnesses run attachdetach-controller
// with: kubeconfig, leader election and the HTTP endpoint off (nothing
// else differs from its defaults), then extra.
func controllerArgs(kubeconfig string, extra []string) []string {
	return append([]string{"--kubeconfig=" + kubeconfig, "--leader-elect=false", "--http-endpoint="}, extra...)
}

func (p *Processes) start(ctx context.Context, name, binary string, args ...string) (Component, error) {
	if binary == "" {
		return nil, fmt.Errorf("no %s binary", name)
	}
	logPath := filepath.Join(p.LogDir, fmt.Sprintf("%02d-%s.log", p.seq.Add(1), name))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	cmd.Stdout = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	c := &childComponent{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		c.readStderr(stderr, logFile)
		_ = cmd.Wait()
		logFile.Close()
		close(c.exited)
	}()
	klog.FromContext(ctx).V(2).Info("Started", "component", name, "pid", cmd.Process.Pid, "log", logPath)
	return c, nil
}

type childComponent struct {
	name     string
	cmd      *exec.Cmd
	exited   chan struct{}
	liveHeap atomic.Uint64
	mu       sync.Mutex
	final    *Usage
	stopOnce sync.Once
	stopErr  error
}

func (c *childComponent) readStderr(r io.Reader, log io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if g, ok := parseGCTrace(line); ok && g.hasHeap {
			c.liveHeap.Store(g.liveMB << 20)
		}
		fmt.Fprintln(log, line)
	}
}

func (c *childComponent) Usage() Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.final != nil {
		return *c.final
	}
	u, _ := procUsage(c.cmd.Process.Pid)
	u.LiveHeapBytes = c.liveHeap.Load()
	return u
}

func (c *childComponent) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *childComponent) stop() error {
	var early error
	select {
	case <-c.exited:
		early = fmt.Errorf("%s exited early: %v", c.name, c.cmd.ProcessState)
	default:
	}
	// The resident-set peak comes from /proc while the process lives:
	// rusage's ru_maxrss would include the forked harness's pages from
	// before exec.
	live, _ := procUsage(c.cmd.Process.Pid)
	terminate(c.cmd.Process, c.exited)
	u := Usage{LiveHeapBytes: c.liveHeap.Load(), PeakRSSBytes: live.PeakRSSBytes, CPUSeconds: live.CPUSeconds}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		u.CPUSeconds = tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
	}
	c.mu.Lock()
	c.final = &u
	c.mu.Unlock()
	return early
}

// terminate sends p SIGTERM, SIGKILL if it has not exited 30 seconds
// later, and waits until exited (closed once p's Wait returned) is closed.
func terminate(p *os.Process, exited <-chan struct{}) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = p.Kill()
		<-exited
	}
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

// clockTicks is USER_HZ, which Linux fixes at 100 for /proc/<pid>/stat.
const clockTicks = 100

// procUsage reads a live process's CPU time and VmHWM from /proc.
func procUsage(pid int) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the command name (which may contain spaces) start at
	// field 3; utime and stime are fields 14 and 15.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) > 12 {
		ut, _ := strconv.ParseUint(fields[11], 10, 64)
		st, _ := strconv.ParseUint(fields[12], 10, 64)
		u.CPUSeconds = float64(ut+st) / clockTicks
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			u.PeakRSSBytes = kb << 10
		}
	}
	return u, nil
}
