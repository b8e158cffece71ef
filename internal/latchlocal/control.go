package latchlocal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// `latch-local start|stop|restart COMPONENT` act on a running `latch-local
// up --upstream` through its API server, with the kubeconfig it wrote: the
// command writes a request into the ConfigMap kube-system/latch-local-control
// and waits for the running latch-local to carry it out and write its
// reply there. So the commands need no port or socket of their own, and
// what runs is visible with kubectl (the ConfigMap's "components" key).

// Where the requests and replies go.
const (
	ControlNamespace = "kube-system"
	ControlConfigMap = "latch-local-control"
)

// The ConfigMap's keys.
const (
	controlRequestKey    = "request"
	controlReplyKey      = "reply"
	controlComponentsKey = "components"
)

type controlRequest struct {
	ID      string   `json:"id"`
	Command []string `json:"command"`
}

type controlReply struct {
	ID      string `json:"id"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

// controlPoll is how often both ends look at the ConfigMap.
const controlPoll = 200 * time.Millisecond

// serveControl creates the ConfigMap and carries out the requests written
// into it until ctx ends.
func (e *Env) serveControl(ctx context.Context) error {
	cm := &v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ControlNamespace, Name: ControlConfigMap},
		Data:       map[string]string{controlComponentsKey: e.components()},
	}
	cms := e.Client.CoreV1().ConfigMaps(ControlNamespace)
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = e.takeOverControl(ctx)
	}
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", ControlNamespace, ControlConfigMap, err)
	}
	done := make(chan struct{})
	e.controlDone = done
	go func() {
		defer close(done)
		logger := klog.FromContext(ctx).WithName("control")
		_ = wait.PollUntilContextCancel(ctx, controlPoll, true, func(ctx context.Context) (bool, error) {
			if err := e.serveRequest(ctx); err != nil && ctx.Err() == nil {
				logger.Error(err, "Serving a latch-local command")
			}
			return false, nil
		})
	}()
	return nil
}

// takeOverControl makes the ConfigMap an earlier latch-local left (with
// --data-dir) this one's: it lists what runs now, and a request still
// pending there is answered with an error, not carried out (whoever sent
// it waited for another process).
func (e *Env) takeOverControl(ctx context.Context) error {
	cms := e.Client.CoreV1().ConfigMaps(ControlNamespace)
	for {
		cm, err := cms.Get(ctx, ControlConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		req, reply, err := decodeControl(cm)
		if err != nil {
			// Not ours to read: start afresh.
			req, cm.Data = controlRequest{}, map[string]string{}
		}
		if req.ID != "" && req.ID != reply.ID {
			data, err := json.Marshal(controlReply{ID: req.ID, Error: fmt.Sprintf("not carried out: the latch-local it was sent to stopped; run latch-local %s again", strings.Join(req.Command, " "))})
			if err != nil {
				return err
			}
			cm.Data[controlReplyKey] = string(data)
		}
		cm.Data[controlComponentsKey] = e.components()
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// serveRequest carries out the pending request, if any, and writes the
// reply.
func (e *Env) serveRequest(ctx context.Context) error {
	cms := e.Client.CoreV1().ConfigMaps(ControlNamespace)
	cm, err := cms.Get(ctx, ControlConfigMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	req, reply, err := decodeControl(cm)
	if err != nil || req.ID == "" || req.ID == reply.ID {
		return err
	}
	klog.FromContext(ctx).Info("latch-local command", "command", req.Command)
	e.mu.Lock()
	msg, herr := e.handle(ctx, req.Command)
	components := e.components()
	e.mu.Unlock()
	reply = controlReply{ID: req.ID, Message: msg}
	if herr != nil {
		reply.Error = herr.Error()
	}
	data, err := json.Marshal(reply)
	if err != nil {
		return err
	}
	for {
		cm.Data[controlReplyKey], cm.Data[controlComponentsKey] = string(data), components
		_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
		if cm, err = cms.Get(ctx, ControlConfigMap, metav1.GetOptions{}); err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
	}
}

func decodeControl(cm *v1.ConfigMap) (req controlRequest, reply controlReply, err error) {
	if s := cm.Data[controlRequestKey]; s != "" {
		if err := json.Unmarshal([]byte(s), &req); err != nil {
			return req, reply, fmt.Errorf("ConfigMap %s/%s: %s: %w", ControlNamespace, ControlConfigMap, controlRequestKey, err)
		}
	}
	if s := cm.Data[controlReplyKey]; s != "" {
		if err := json.Unmarshal([]byte(s), &reply); err != nil {
			return req, reply, fmt.Errorf("ConfigMap %s/%s: %s: %w", ControlNamespace, ControlConfigMap, controlReplyKey, err)
		}
	}
	return req, reply, nil
}

// ControlUsage is the usage of the commands handle carries out.
const ControlUsage = `latch-local start external-attacher|csi-attacher|attachdetach-controller
latch-local stop external-attacher|csi-attacher|attachdetach-controller
latch-local restart kube-controller-manager [--controllers=LIST]`

// handle carries out one command (its verb, component and flags); e.mu
// is held.
func (e *Env) handle(ctx context.Context, command []string) (string, error) {
	if e.up == nil {
		return "", errors.New("this latch-local runs latch's controllers from the start: start, stop and restart act on `latch-local up --upstream`")
	}
	if len(command) < 2 {
		return "", fmt.Errorf("want a command and a component:\n%s", ControlUsage)
	}
	verb, component, args := command[0], command[1], command[2:]
	if component != KubeControllerManager && len(args) > 0 {
		return "", fmt.Errorf("%s %s takes no flags, got %q", verb, component, strings.Join(args, " "))
	}
	switch verb + " " + component {
	case "start " + ExternalAttacher:
		return e.startExternalAttacher(ctx)
	case "stop " + ExternalAttacher:
		return e.stopExternalAttacher()
	case "start " + CSIAttacher:
		return e.startCSIAttacher(ctx)
	case "stop " + CSIAttacher:
		return e.stopCSIAttacher()
	case "start " + AttachDetachController:
		return e.startController(ctx)
	case "stop " + AttachDetachController:
		return e.stopController()
	case "restart " + KubeControllerManager:
		return e.restartKCM(ctx, args)
	}
	return "", fmt.Errorf("unknown command %q:\n%s", strings.Join(command, " "), ControlUsage)
}

// ControlTimeout bounds a command's wait for the running latch-local: a
// kube-controller-manager start may take a minute on a busy machine.
const ControlTimeout = 3 * time.Minute

// Control sends command (a verb, a component, its flags) to the
// latch-local behind client, waits for its reply and writes the reply's
// message to out. It fails with the reply's error, or when no latch-local
// answers.
func Control(ctx context.Context, client kubernetes.Interface, command []string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, ControlTimeout)
	defer cancel()
	cms := client.CoreV1().ConfigMaps(ControlNamespace)
	idBytes := make([]byte, 8)
	_, _ = rand.Read(idBytes)
	id := hex.EncodeToString(idBytes)
	data, err := json.Marshal(controlRequest{ID: id, Command: command})
	if err != nil {
		return err
	}
	// Send it once no other command is pending.
	var last string
	err = wait.PollUntilContextCancel(ctx, controlPoll, true, func(ctx context.Context) (bool, error) {
		cm, err := cms.Get(ctx, ControlConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("no latch-local up --upstream runs behind this kubeconfig (no ConfigMap %s/%s)", ControlNamespace, ControlConfigMap)
		}
		if err != nil {
			last = err.Error()
			return false, nil
		}
		req, reply, err := decodeControl(cm)
		if err != nil {
			return false, err
		}
		if req.ID != reply.ID {
			last = fmt.Sprintf("waiting for the command before it (%s)", strings.Join(req.Command, " "))
			return false, nil
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[controlRequestKey] = string(data)
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			last = err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return controlError(err, last)
	}
	var reply controlReply
	err = wait.PollUntilContextCancel(ctx, controlPoll, false, func(ctx context.Context) (bool, error) {
		cm, err := cms.Get(ctx, ControlConfigMap, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		_, r, err := decodeControl(cm)
		if err != nil {
			return false, err
		}
		last = "no reply from latch-local yet"
		reply = r
		return r.ID == id, nil
	})
	if err != nil {
		return controlError(err, last)
	}
	if reply.Message != "" {
		fmt.Fprintln(out, reply.Message)
	}
	if reply.Error != "" {
		return errors.New(reply.Error)
	}
	return nil
}

func controlError(err error, last string) error {
	if wait.Interrupted(err) && last != "" {
		return fmt.Errorf("no answer from latch-local within %s (%s)", ControlTimeout, last)
	}
	return err
}
