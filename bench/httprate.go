package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"fortio.org/fortio/fhttp"
	"fortio.org/fortio/periodic"
	"fortio.org/log"
	"github.com/spf13/cobra"
)

// httpRatePercentiles are the latency quantiles a constant-rate run
// reports: the spectrum the L7 issue asks for.
var httpRatePercentiles = []float64{50, 90, 99, 99.9}

// httpRateOptions is one constant-rate run: requests of method to url at
// qps in total over conns keep-alive connections, for d.
type httpRateOptions struct {
	URL    string
	Method string
	QPS    float64
	Conns  int
	D      time.Duration
}

// httpRateResult is what a constant-rate run gave. Latencies are
// fortio's: from each request's start to its answer's end; a run that
// falls behind its schedule catches up without sleeping, so its achieved
// rate (ActualQPS) says when the server could not keep up.
type httpRateResult struct {
	QPS       float64 `json:"qps"`
	ActualQPS float64 `json:"actual_qps"`
	N         int64   `json:"n"`
	// Codes counts the answers by HTTP status; Errors the requests that
	// got none (fortio's status -1: a refused, reset or timed-out call).
	Codes  map[int]int64 `json:"codes"`
	Errors int64         `json:"errors"`
	P50Ms  float64       `json:"p50_ms"`
	P90Ms  float64       `json:"p90_ms"`
	P99Ms  float64       `json:"p99_ms"`
	P999Ms float64       `json:"p999_ms"`
}

// runHTTPRate runs o in this process with fortio's periodic runner.
func runHTTPRate(o httpRateOptions) (httpRateResult, error) {
	switch {
	case o.QPS <= 0:
		return httpRateResult{}, fmt.Errorf("rate %v: want requests per second above 0", o.QPS)
	case o.Conns < 1:
		return httpRateResult{}, fmt.Errorf("%d connections: want at least 1", o.Conns)
	case o.D <= 0:
		return httpRateResult{}, fmt.Errorf("duration %v: want above 0", o.D)
	case !strings.HasPrefix(o.URL, "http://"):
		return httpRateResult{}, fmt.Errorf("url %q: want http://host:port/path", o.URL)
	}
	// Calls that fail are counted (Errors); fortio need not log each.
	log.SetLogLevelQuiet(log.Critical)
	ro := fhttp.HTTPRunnerOptions{}
	ro.RunnerOptions = periodic.RunnerOptions{QPS: o.QPS, Duration: o.D, NumThreads: o.Conns,
		Percentiles: httpRatePercentiles, Out: io.Discard}
	ro.HTTPOptions.URL = o.URL
	ro.HTTPOptions.MethodOverride = o.Method
	ro.HTTPOptions.HTTPReqTimeOut = 5 * time.Second
	// The intended 403s of a denied request are answers, not a reason
	// to stop: each connection's first request may be one.
	ro.AllowInitialErrors = true
	res, err := fhttp.RunHTTPTest(&ro)
	if err != nil {
		return httpRateResult{}, fmt.Errorf("fortio: %w", err)
	}
	out := httpRateResult{QPS: o.QPS, ActualQPS: res.ActualQPS, Codes: map[int]int64{}}
	for code, n := range res.RetCodes {
		out.N += n
		if code < 0 {
			out.Errors += n
			continue
		}
		out.Codes[code] = n
	}
	if res.DurationHistogram == nil {
		return out, errors.New("fortio: no latency histogram")
	}
	for _, p := range res.DurationHistogram.Percentiles {
		ms := p.Value * 1000
		switch p.Percentile {
		case 50:
			out.P50Ms = ms
		case 90:
			out.P90Ms = ms
		case 99:
			out.P99Ms = ms
		case 99.9:
			out.P999Ms = ms
		}
	}
	return out, nil
}

// httpRate runs the http-rate-client subcommand from the namespace at
// nsPath, pinned to the client CPU, and reads its summary.
func httpRate(ctx context.Context, nsPath string, o httpRateOptions) (httpRateResult, error) {
	var r httpRateResult
	return r, runJSONClient(ctx, nsPath, o.D, &r, "http-rate-client", "--url", o.URL, "--method", o.Method,
		"--qps", fmt.Sprint(o.QPS), "--connections", fmt.Sprint(o.Conns), "--duration", o.D.String())
}

// newHTTPRateClientCommand sends HTTP requests at a constant rate
// (fortio's periodic runner, as wrk2 would; wrk2 is not packaged) and
// prints the answers by status, the calls that got none, and the latency
// quantiles as JSON.
func newHTTPRateClientCommand() *cobra.Command {
	o := httpRateOptions{Method: "GET", Conns: 10, D: 10 * time.Second}
	cmd := &cobra.Command{
		Use:    "http-rate-client",
		Short:  "Send HTTP requests at a constant rate and print the latency quantiles (bench l7's load)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := runHTTPRate(o)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
		},
	}
	cmd.Flags().StringVar(&o.URL, "url", "", "http://host:port/path to request")
	cmd.Flags().StringVar(&o.Method, "method", o.Method, "HTTP method")
	cmd.Flags().Float64Var(&o.QPS, "qps", 0, "requests per second, in total")
	cmd.Flags().IntVar(&o.Conns, "connections", o.Conns, "keep-alive connections the rate is spread over")
	cmd.Flags().DurationVar(&o.D, "duration", o.D, "how long to send")
	return cmd
}
