package k8s

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
)

// Exec is a cluster reached from outside with a kubeconfig, as kubectl
// reaches it: its clients, and commands run in pods through the API
// server (pods/exec) over WebSockets, falling back to SPDY for API
// servers without them.
type Exec struct {
	cfg     *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// NewExec connects with a kubeconfig file (empty: the default loading
// rules, $KUBECONFIG then ~/.kube/config) and its context (empty: the
// current one).
func NewExec(kubeconfig, kubeContext string) (*Exec, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return &Exec{cfg: cfg, Kube: kube, Dynamic: dyn}, nil
}

// PodRef names a container of a pod.
type PodRef struct {
	Namespace, Pod, Container string
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Pod }

func (e *Exec) executor(p PodRef, command []string, stdin bool) (remotecommand.Executor, error) {
	req := e.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: p.Container, Command: command, Stdin: stdin, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", p, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(e.cfg, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("exec in %s: %w", p, err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// Run runs command in the pod's container and returns its standard
// output; a failure carries its standard error.
func (e *Exec) Run(ctx context.Context, p PodRef, command ...string) ([]byte, error) {
	ex, err := e.executor(p, command, false)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return stdout.Bytes(), execError(p, command, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func execError(p PodRef, command []string, err error, stderr string) error {
	if s := strings.TrimSpace(stderr); s != "" {
		return fmt.Errorf("%s in %s: %w: %s", strings.Join(command, " "), p, err, s)
	}
	return fmt.Errorf("%s in %s: %w", strings.Join(command, " "), p, err)
}

// Dial runs command in the pod's container and returns its standard
// input and output as a connection: what the command relays (weir-agent
// relay: the agent's socket) is reached as if dialled. Closing the
// connection ends standard input and the stream.
func (e *Exec) Dial(ctx context.Context, p PodRef, command ...string) (net.Conn, error) {
	ex, err := e.executor(p, command, true)
	if err != nil {
		return nil, err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &execConn{in: inW, out: outR, cancel: cancel, where: p.String()}
	go func() {
		var stderr lockedBuffer
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: &stderr})
		if err != nil && sctx.Err() == nil {
			err = execError(p, command, err, stderr.String())
			outW.CloseWithError(err)
			inR.CloseWithError(err) // a pending write learns why, too
			return
		}
		outW.Close()
		inR.Close()
	}()
	return c, nil
}

// execConn is a stream's standard input and output as a net.Conn.
// Deadlines are not kept: the HTTP client over it ends a request by
// closing the connection.
type execConn struct {
	in     *io.PipeWriter
	out    *io.PipeReader
	cancel context.CancelFunc
	where  string
	once   sync.Once
}

func (c *execConn) Read(b []byte) (int, error)  { return c.out.Read(b) }
func (c *execConn) Write(b []byte) (int, error) { return c.in.Write(b) }

// Close ends standard input and lets the stream finish on its own (the
// relay exits once the agent has answered), reading and dropping what
// still comes; a stream that has not finished within ten seconds is cut.
// Cutting it at once would make client-go log the copies it interrupted.
func (c *execConn) Close() error {
	c.once.Do(func() {
		c.in.Close()
		go func() {
			timer := time.AfterFunc(10*time.Second, c.cancel)
			defer timer.Stop()
			io.Copy(io.Discard, c.out)
			c.cancel()
		}()
	})
	return nil
}

func (c *execConn) LocalAddr() net.Addr              { return execAddr("weir") }
func (c *execConn) RemoteAddr() net.Addr             { return execAddr(c.where) }
func (c *execConn) SetDeadline(time.Time) error      { return nil }
func (c *execConn) SetReadDeadline(time.Time) error  { return nil }
func (c *execConn) SetWriteDeadline(time.Time) error { return nil }

// execAddr names an end of an exec stream.
type execAddr string

func (execAddr) Network() string  { return "pods/exec" }
func (a execAddr) String() string { return string(a) }

// lockedBuffer is a buffer the stream writes while the caller may read;
// it keeps the first 64 KiB (an error's explanation) and drops the rest.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 64<<10 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
