package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/weirnet/weir/internal/l7"
)

// l7PeerConfig is the proxy peer's nginx servers: on l7PeerPort1 the
// 1-rule set, on l7PeerPort40 the 40-rule set, each judging a request
// by a map of the rules' regular expressions over "method host path"
// (nginx tries them in order, as a proxy's rule list is walked), 403 for
// a request none matches, the rest forwarded to upstream over keep-alive
// connections, as a per-node proxy (Envoy in Cilium) does.
func l7PeerConfig(addr, upstream string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "  upstream weir_server {\n    server %s;\n    keepalive 256;\n    keepalive_requests 100000000;\n    keepalive_timeout 300s;\n  }\n", upstream)
	for _, set := range []struct {
		port  int
		rules []l7.Rule
	}{{l7PeerPort1, l7GateRules(1)}, {l7PeerPort40, l7GateRules(40)}} {
		fmt.Fprintf(&b, "  map \"$request_method $host $uri\" $weir_allow_%d {\n    default 0;\n", set.port)
		for _, r := range set.rules {
			re, err := nginxRuleRegex(r)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "    \"~%s\" 1;\n", re)
		}
		b.WriteString("  }\n")
		fmt.Fprintf(&b, `  server {
    listen %s:%d reuseport backlog=4096;
    location / {
      if ($weir_allow_%d = 0) { return 403 "denied\n"; }
      proxy_pass http://weir_server;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
`, addr, set.port, set.port)
	}
	return b.String(), nil
}

// nginxRuleRegex is an HTTP rule as a regular expression over nginx's
// "$request_method $host $uri": the method exactly, the host (lowercase,
// without its port) exactly or under a wildcard, the normalised path
// exactly, by prefix on segment boundaries, or by the rule's expression.
func nginxRuleRegex(r l7.Rule) (string, error) {
	if len(r.Headers) > 0 {
		return "", fmt.Errorf("nginx peer: header rules are not translated (%+v)", r)
	}
	method := "[^ ]+"
	if r.Method != "" {
		method = regexp.QuoteMeta(r.Method)
	}
	host := "[^ ]*"
	if len(r.Hostnames) > 0 {
		var alts []string
		for _, h := range r.Hostnames {
			if rest, ok := strings.CutPrefix(h, "*."); ok {
				alts = append(alts, "[^ ]+\\."+regexp.QuoteMeta(strings.ToLower(rest)))
			} else {
				alts = append(alts, regexp.QuoteMeta(strings.ToLower(h)))
			}
		}
		host = "(?:" + strings.Join(alts, "|") + ")"
	}
	path := "/.*"
	if r.Path != nil {
		switch r.Path.Type {
		case l7.PathExact:
			path = regexp.QuoteMeta(r.Path.Value)
		case l7.PathPrefix:
			if p := strings.TrimSuffix(r.Path.Value, "/"); p != "" {
				path = regexp.QuoteMeta(p) + "(?:/.*)?"
			}
		case l7.PathRegularExpression:
			path = "(?:" + r.Path.Value + ")"
		default:
			return "", fmt.Errorf("nginx peer: path type %q", r.Path.Type)
		}
	}
	if strings.Contains(method+host+path, "\"") {
		return "", fmt.Errorf("nginx peer: rule %+v has a double quote", r)
	}
	return "^" + method + " " + host + " " + path + "$", nil
}
