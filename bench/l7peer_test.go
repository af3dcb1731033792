package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/l7"
)

// TestPeerRulesAgreeWithWeir: the nginx peer enforces the benchmark's
// rule sets as Weir's matcher reads them, on requests that meet and miss
// each rule by method, host and path (prefix boundaries included), so
// the comparison is of the same policy.
func TestPeerRulesAgreeWithWeir(t *testing.T) {
	extra := []l7.Rule{
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/[a-z0-9/]*"}},
		{Hostnames: []string{"*.example.org"}, Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/v2/"}},
	}
	for _, rules := range [][]l7.Rule{l7GateRules(1), l7GateRules(40), extra} {
		m, err := l7.Compile(rules)
		if err != nil {
			t.Fatal(err)
		}
		var res []*regexp.Regexp
		for _, r := range rules {
			s, err := nginxRuleRegex(r)
			if err != nil {
				t.Fatal(err)
			}
			res = append(res, regexp.MustCompile(s))
		}
		methods := []string{"GET", "POST", "PUT", "DELETE"}
		hosts := []string{"10.244.0.5", "svc3.example.com", "svc7.example.com", "a.example.org", "example.org"}
		paths := []string{"/", "/api/v1", "/api/v1/", "/api/v10", "/api/v1/orders/0", "/api/v1/orders/4", "/api/v1/orders/40", "/v2", "/v2/x", "/v2x", "/UP", "/item/7"}
		for _, method := range methods {
			for _, host := range hosts {
				for _, path := range paths {
					want, err := m.Match(&l7.Request{Method: method, Host: host, Path: path, Proto: "HTTP/1.1"})
					if err != nil {
						t.Fatal(err)
					}
					key := fmt.Sprintf("%s %s %s", method, host, path)
					got := -1
					for i, re := range res {
						if re.MatchString(key) {
							got = i
							break
						}
					}
					if (got >= 0) != (want >= 0) {
						t.Errorf("%d rules, %q: nginx allows %v (rule %d), Weir %v (rule %d)", len(rules), key, got >= 0, got, want >= 0, want)
					}
				}
			}
		}
	}
}

// TestPeerConfigNamesEveryRule: the proxy's configuration has one map
// entry per rule of each set, and forwards on keep-alive connections.
func TestPeerConfigNamesEveryRule(t *testing.T) {
	conf, err := l7PeerConfig("10.244.0.9", "10.244.0.5:8080")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(conf, "\" 1;\n"); got != 41 {
		t.Errorf("%d map entries, want 41 (1 + 40 rules)", got)
	}
	for _, want := range []string{"server 10.244.0.5:8080;", "keepalive 256;", "listen 10.244.0.9:8080", "listen 10.244.0.9:8081", `proxy_set_header Connection "";`} {
		if !strings.Contains(conf, want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
}
