package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/weirnet/weir/internal/version"
)

// DefaultSocket is where weir-agent listens unless told otherwise.
const DefaultSocket = "/run/weir/agent.sock"

// Client talks to one agent over its unix socket, or over any stream
// that reaches it (NewDialClient).
type Client struct {
	socket string // where the agent is, as errors name it
	http   *http.Client
}

// NewClient returns a client for the agent at socket.
func NewClient(socket string) *Client {
	return NewDialClient(socket, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	})
}

// NewDialClient returns a client that opens a new stream to the agent
// with dial for every request; where names it in errors. A stream relayed
// through the Kubernetes API into an agent pod (cli's agent pods) is one.
func NewDialClient(where string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableKeepAlives: true,
	}
	return &Client{socket: where, http: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// Add attaches a pod interface.
func (c *Client) Add(ctx context.Context, req AddRequest) (*AddResponse, error) {
	var resp AddResponse
	return &resp, c.do(ctx, http.MethodPost, PathEndpoints, req, &resp)
}

// Del detaches a pod interface. Detaching an unknown one succeeds.
func (c *Client) Del(ctx context.Context, req DelRequest) error {
	return c.do(ctx, http.MethodDelete, PathEndpoints, req, nil)
}

// Check verifies an attachment.
func (c *Client) Check(ctx context.Context, req CheckRequest) error {
	return c.do(ctx, http.MethodPut, PathEndpoints+"/check", req, nil)
}

// GC releases every attachment not listed in req.
func (c *Client) GC(ctx context.Context, req GCRequest) (*GCResponse, error) {
	var resp GCResponse
	return &resp, c.do(ctx, http.MethodPost, PathGC, req, &resp)
}

// Health returns nil when the agent is up and its datapath ready.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, PathHealth, nil, nil)
}

// Status returns the agent's view of its node.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.do(ctx, http.MethodGet, PathStatus, nil, &s)
}

// Services returns what the node translates each Service address to.
func (c *Client) Services(ctx context.Context) (*ServiceList, error) {
	var l ServiceList
	return &l, c.do(ctx, http.MethodGet, PathServices, nil, &l)
}

// Version returns which build the agent is.
func (c *Client) Version(ctx context.Context) (*version.Info, error) {
	var v version.Info
	return &v, c.do(ctx, http.MethodGet, PathVersion, nil, &v)
}

// SetPeers replaces the agent's peers.
func (c *Client) SetPeers(ctx context.Context, peers []Peer) error {
	return c.do(ctx, http.MethodPut, PathPeers, PeersRequest{Peers: peers}, nil)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://weir-agent"+path, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return unavailable(c.socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return unavailable(c.socket, err)
	}
	if resp.StatusCode >= 300 {
		var e Error
		if json.Unmarshal(b, &e) != nil || e.Code == 0 {
			return &Error{Code: CodeIOFailure, Msg: fmt.Sprintf("agent answered %s", resp.Status), Details: string(b)}
		}
		return &e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode agent response: %w", err)
		}
	}
	return nil
}

// PathMetrics is where an agent serves its Prometheus metrics.
const PathMetrics = "/metrics"

// Metrics returns the agent's Prometheus metrics in the text format.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://weir-agent"+PathMetrics, nil)
	if err != nil {
		return "", fmt.Errorf("build request: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", unavailable(c.socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", unavailable(c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", &Error{Code: CodeIOFailure, Msg: fmt.Sprintf("agent answered %s for its metrics", resp.Status), Details: string(b)}
	}
	return string(b), nil
}

// Flows streams the flows q selects from the agent's whole store to fn,
// oldest first; with q.Follow it goes on with new matching flows until
// ctx ends or fn fails.
func (c *Client) Flows(ctx context.Context, q FlowsQuery, fn func(Flow) error) error {
	path := PathFlows
	if v := q.Values(); len(v) > 0 {
		path += "?" + v.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://weir-agent"+path, nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	// No overall timeout: a followed stream lasts as long as ctx.
	resp, err := (&http.Client{Transport: c.http.Transport}).Do(req)
	if err != nil {
		return unavailable(c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		return &Error{Code: CodeIOFailure, Msg: fmt.Sprintf("agent answered %s", resp.Status), Details: string(b)}
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var f Flow
		if err := dec.Decode(&f); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("decode flow: %w", err)
		}
		if err := fn(f); err != nil {
			return err
		}
	}
}

// Trace asks the agent to explain a flow and confirm it in the datapath.
func (c *Client) Trace(ctx context.Context, q TraceQuery) (*Trace, error) {
	var t Trace
	return &t, c.do(ctx, http.MethodGet, PathTrace+"?"+q.Values().Encode(), nil, &t)
}
