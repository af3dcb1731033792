package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHTTPRateCountsAnswers: a constant-rate run sends its schedule's
// requests, counts each answer under its status (the intended 403s apart
// from the 200s), counts calls that got no answer as errors, and reports
// ordered latency quantiles.
func TestHTTPRateCountsAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut || strings.HasPrefix(r.URL.Path, "/deny") {
			http.Error(w, "denied", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		code         int
	}{{"GET", "/", 200}, {"GET", "/deny", 403}, {"PUT", "/", 403}} {
		r, err := runHTTPRate(httpRateOptions{URL: srv.URL + tc.path, Method: tc.method, QPS: 200, Conns: 4, D: time.Second})
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		if r.N < 150 || r.N > 210 || r.Codes[tc.code] != r.N || len(r.Codes) != 1 || r.Errors != 0 {
			t.Errorf("%s %s: %+v, want about 200 requests, all answered %d", tc.method, tc.path, r, tc.code)
		}
		if !(0 < r.P50Ms && r.P50Ms <= r.P90Ms && r.P90Ms <= r.P99Ms && r.P99Ms <= r.P999Ms) {
			t.Errorf("%s %s: quantiles %v %v %v %v, want 0 < p50 <= p90 <= p99 <= p99.9", tc.method, tc.path, r.P50Ms, r.P90Ms, r.P99Ms, r.P999Ms)
		}
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	r, err := runHTTPRate(httpRateOptions{URL: url + "/", Method: "GET", QPS: 50, Conns: 2, D: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.N == 0 || r.Errors != r.N || len(r.Codes) != 0 {
		t.Errorf("a closed server: %+v, want every call counted as an error", r)
	}
}

func TestHTTPRateRefusesBadOptions(t *testing.T) {
	ok := httpRateOptions{URL: "http://127.0.0.1:1/", Method: "GET", QPS: 10, Conns: 1, D: time.Second}
	for _, tc := range []struct {
		edit func(*httpRateOptions)
		want string
	}{
		{func(o *httpRateOptions) { o.QPS = 0 }, "requests per second"},
		{func(o *httpRateOptions) { o.Conns = 0 }, "at least 1"},
		{func(o *httpRateOptions) { o.D = 0 }, "duration"},
		{func(o *httpRateOptions) { o.URL = "127.0.0.1:80" }, "http://host:port/path"},
	} {
		o := ok
		tc.edit(&o)
		if _, err := runHTTPRate(o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", o, err, tc.want)
		}
	}
}

// TestL7GateRate: a repetition's constant-rate runs ask each setup for
// half the plain port's requests/s of that repetition, in a rotating
// order, count every call without a 200, and the report holds the p99
// ratio to the bound and the calls without a 200 to none.
func TestL7GateRate(t *testing.T) {
	res := &result{Scenario: "l7-gate", Reps: 2}
	setups := []l7GateSetup{{name: l7GatePlain, port: 1}, {name: l7GateHTTP1, port: 2}, {name: l7GateHTTP40, port: 3}, {name: l7GateUser, port: 4}}
	if err := runL7GateRate(context.Background(), res, 0, setups, nil, io.Discard); err == nil {
		t.Fatal("a repetition without the plain port's requests/s was run")
	}
	p99 := map[string]float64{l7GatePlain: 1, l7GateHTTP1: 1.5, l7GateHTTP40: 2.5, l7GateUser: 9}
	for rep, rps := range []float64{1000, 3000} {
		res.Samples = append(res.Samples, sample{Setup: l7GatePlain, Path: l7GatePath, Metric: "rps", Rep: rep, Value: rps})
		var order []string
		err := runL7GateRate(context.Background(), res, rep, setups, func(s l7GateSetup, rate float64) (httpRateResult, error) {
			if rate != rps/2 {
				t.Errorf("rep %d: %s asked for %v req/s, want %v", rep, s.name, rate, rps/2)
			}
			order = append(order, s.name)
			r := httpRateResult{ActualQPS: rate, N: 100, Codes: map[int]int64{200: 100}, P50Ms: 0.1, P90Ms: 0.2, P99Ms: p99[s.name], P999Ms: 10}
			if s.name == l7GateUser {
				r.Codes = map[int]int64{200: 97, 403: 1}
				r.Errors = 2
			}
			return r, nil
		}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if len(order) != 4 || order[0] != l7GateRateSetups[rep] {
			t.Errorf("rep %d: order %v, want the four setups starting at %q", rep, order, l7GateRateSetups[rep])
		}
	}
	res.summarise()
	md := res.markdown()
	for _, want := range []string{"## At a constant rate", "| rate asked (req/s) | 1000 | 1000 | 1000 | 1000 |", "| calls without a 200 (per run) | 0 | 0 | 0 | 3 |",
		"p99 latency at half no policy's requests/s, kernel HTTP, 1 rule / no policy | <= 2.00 | 1.500", "p99 latency at half no policy's requests/s, kernel HTTP, 40 rules / no policy | <= 2.00 | 2.500"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	met := map[string]bool{}
	for _, tg := range res.Targets {
		met[tg.What] = tg.Met
	}
	if !met["p99 latency at half no policy's requests/s, kernel HTTP, 1 rule / no policy"] ||
		met["p99 latency at half no policy's requests/s, kernel HTTP, 40 rules / no policy"] ||
		met["calls without a 200 at the constant rate, user-space HTTP, 1 header regex rule (median per run)"] {
		t.Errorf("targets %+v: want 1 rule met, 40 rules missed, the user-space errors missed", res.Targets)
	}
}
