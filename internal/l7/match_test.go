package l7

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// req parses one request head for a test.
func req(t *testing.T, method, target string, header ...string) *Request {
	t.Helper()
	head := method + " " + target + " HTTP/1.1\r\n"
	if !strings.Contains(strings.ToLower(strings.Join(header, "\n")), "host:") {
		head += "Host: api.example.com\r\n"
	}
	for _, h := range header {
		head += h + "\r\n"
	}
	rs, err := NewParser(Limits{}).Feed([]byte(head + "\r\n"))
	if err != nil || len(rs) != 1 {
		t.Fatalf("parse %q: %d requests, %v", head, len(rs), err)
	}
	return rs[0]
}

func compile(t *testing.T, rules ...Rule) *Matcher {
	t.Helper()
	m, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMatchReadsTheAPI holds each match type to its definition in Gateway
// API's HTTPRouteMatch and HTTPRoute hostnames, example by example.
func TestMatchReadsTheAPI(t *testing.T) {
	prefix := func(v string) Rule { return Rule{Path: &PathMatch{Type: PathPrefix, Value: v}} }
	exact := func(v string) Rule { return Rule{Path: &PathMatch{Type: PathExact, Value: v}} }
	regex := func(v string) Rule { return Rule{Path: &PathMatch{Type: PathRegularExpression, Value: v}} }
	hosts := func(h ...string) Rule { return Rule{Hostnames: h} }
	header := func(typ HeaderMatchType, name, value string) Rule {
		return Rule{Headers: []HeaderMatch{{Type: typ, Name: name, Value: value}}}
	}
	for _, tc := range []struct {
		rule   Rule
		method string
		target string
		header []string
		want   bool
	}{
		// PathPrefix matches by path element; a trailing '/' is ignored.
		{prefix("/abc"), "GET", "/abc", nil, true},
		{prefix("/abc"), "GET", "/abc/", nil, true},
		{prefix("/abc"), "GET", "/abc/def", nil, true},
		{prefix("/abc"), "GET", "/abcd", nil, false},
		{prefix("/abc/"), "GET", "/abc", nil, true},
		{prefix("/abc/"), "GET", "/abcd", nil, false},
		{prefix("/"), "GET", "/anything/at/all", nil, true},
		{prefix("/abc"), "GET", "/ABC", nil, false}, // paths are case-sensitive
		{prefix("/abc"), "GET", "/abc?x=/", nil, true},
		{prefix("/abc"), "GET", "/abc;v=1/d", nil, true}, // parameters cut
		{prefix("/abc"), "OPTIONS", "*", nil, false},
		// Exact is the whole canonical path, query aside.
		{exact("/abc"), "GET", "/abc", nil, true},
		{exact("/abc"), "GET", "/abc/", nil, false},
		{exact("/abc"), "GET", "/abc?q", nil, true},
		{exact("/abc"), "GET", "/abc;v=1", nil, true},
		{exact("/a%20b"), "GET", "/a%20b", nil, true},
		{exact("/a%20b"), "GET", "/a%20B", nil, false}, // %20B is "%20" + 'B'
		// RegularExpression matches the whole path (RE2).
		{regex("/v[0-9]+/.*"), "GET", "/v2/x", nil, true},
		{regex("/v[0-9]+"), "GET", "/v2/x", nil, false},
		{regex("/v[0-9]+"), "GET", "/prefix/v2", nil, false},
		// Method is exact and case-sensitive.
		{Rule{Method: "GET"}, "GET", "/", nil, true},
		{Rule{Method: "GET"}, "get", "/", nil, false},
		{Rule{Method: "GET"}, "HEAD", "/", nil, false},
		// Hostnames: exact, or a wildcard over one label or more, never
		// the bare suffix; case-insensitive, port ignored.
		{hosts("api.example.com"), "GET", "/", []string{"Host: API.Example.com:8443"}, true},
		{hosts("api.example.com"), "GET", "/", []string{"Host: api.example.com."}, true},
		{hosts("*.example.com"), "GET", "/", []string{"Host: a.example.com"}, true},
		{hosts("*.example.com"), "GET", "/", []string{"Host: a.b.example.com"}, true},
		{hosts("*.example.com"), "GET", "/", []string{"Host: example.com"}, false},
		{hosts("*.example.com"), "GET", "/", []string{"Host: aexample.com"}, false},
		{hosts("api.example.com"), "GET", "http://api.example.com/", []string{"Host: api.example.com"}, true},
		{hosts("a.example.com", "b.example.com"), "GET", "/", []string{"Host: b.example.com"}, true},
		// Headers: names case-insensitive, Exact values case-sensitive.
		{header(HeaderExact, "X-Role", "admin"), "GET", "/", []string{"x-role: admin"}, true},
		{header(HeaderExact, "X-Role", "admin"), "GET", "/", []string{"X-Role: Admin"}, false},
		{header(HeaderExact, "X-Role", "admin"), "GET", "/", []string{"X-Role:   admin  "}, true},
		{header(HeaderExact, "X-Role", "admin"), "GET", "/", nil, false},
		{header(HeaderRegularExpression, "X-Tenant", "t-[0-9]+"), "GET", "/", []string{"X-Tenant: t-42"}, true},
		{header(HeaderRegularExpression, "X-Tenant", "t-[0-9]+"), "GET", "/", []string{"X-Tenant: t-42x"}, false},
		{header(HeaderPresent, "Authorization", ""), "GET", "/", []string{"Authorization: Bearer x"}, true},
		{header(HeaderPresent, "Authorization", ""), "GET", "/", []string{"Authorization:"}, true},
		{header(HeaderPresent, "Authorization", ""), "GET", "/", nil, false},
		// Everything set: every part must hold.
		{Rule{Method: "PUT", Path: &PathMatch{Type: PathExact, Value: "/v1/exhaust-port"}}, "PUT", "/v1/exhaust-port", nil, true},
		{Rule{Method: "POST", Path: &PathMatch{Type: PathExact, Value: "/v1/request-landing"}}, "PUT", "/v1/request-landing", nil, false},
		{Rule{}, "DELETE", "/x", nil, true},
	} {
		name := fmt.Sprintf("%+v %s %s %v", tc.rule, tc.method, tc.target, tc.header)
		m := compile(t, tc.rule)
		got, err := m.Match(req(t, tc.method, tc.target, tc.header...))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if (got == 0) != tc.want {
			t.Errorf("%s: match %v, want %v", name, got == 0, tc.want)
		}
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Method: "GE T"}, "not an HTTP method token"},
		{Rule{Path: &PathMatch{Type: PathExact, Value: "abc"}}, "does not start with '/'"},
		{Rule{Path: &PathMatch{Type: PathPrefix, Value: "/a/../b"}}, "dot segment"},
		{Rule{Path: &PathMatch{Type: PathExact, Value: "/%c3%a9"}}, `write it "/%C3%A9"`},
		{Rule{Path: &PathMatch{Type: PathExact, Value: "/%61bc"}}, "sent as it is"},
		{Rule{Path: &PathMatch{Type: PathExact, Value: "/a;b"}}, "path parameters"},
		{Rule{Path: &PathMatch{Type: PathRegularExpression, Value: "/(a"}}, "regular expression"},
		// A pattern that would close the anchoring group around it and
		// match any path: it does not stand alone.
		{Rule{Path: &PathMatch{Type: PathRegularExpression, Value: "/admin)|(.*"}}, "regular expression"},
		{Rule{Headers: []HeaderMatch{{Type: HeaderRegularExpression, Name: "X", Value: ")|("}}}, "regular expression"},
		{Rule{Path: &PathMatch{Type: PathRegularExpression, Value: `\Q/a`}}, "regular expression"},
		{Rule{Path: &PathMatch{Type: "Glob", Value: "/a*"}}, "use Exact, PathPrefix or RegularExpression"},
		{Rule{Hostnames: []string{"api.example.com:80"}}, "without port"},
		{Rule{Hostnames: []string{"*"}}, "hostname"},
		{Rule{Hostnames: []string{"a.*.com"}}, "hostname"},
		{Rule{Headers: []HeaderMatch{{Type: HeaderExact, Name: "X Y", Value: "v"}}}, "not a token"},
		{Rule{Headers: []HeaderMatch{{Type: HeaderPresent, Name: "X", Value: "v"}}}, "Present takes no value"},
		{Rule{Headers: []HeaderMatch{{Type: HeaderExact, Name: "X", Value: "a"}, {Type: HeaderExact, Name: "x", Value: "b"}}}, "matched twice"},
		{Rule{Headers: []HeaderMatch{{Type: "Prefix", Name: "X"}}}, "use Exact, RegularExpression or Present"},
	} {
		_, err := Compile([]Rule{{}, tc.rule})
		if !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "rule 1") {
			t.Errorf("Compile(%+v) = %v, want ErrInvalidRule saying rule 1 and %q", tc.rule, err, tc.want)
		}
	}
}

func TestMatchRefusesRepeatedRuleHeader(t *testing.T) {
	m := compile(t, Rule{Headers: []HeaderMatch{{Type: HeaderExact, Name: "X-Role", Value: "admin"}}})
	_, err := m.Match(req(t, "GET", "/", "X-Role: admin", "X-Role: user"))
	if !errors.Is(err, ErrAmbiguousHeader) {
		t.Fatalf("Match: %v, want ErrAmbiguousHeader", err)
	}
	if got, err := m.Match(req(t, "GET", "/", "Accept: a", "Accept: b", "X-Role: admin")); err != nil || got != 0 {
		t.Fatalf("a repeated header no rule names: match %d, %v", got, err)
	}
}

// TestMatchProperties checks, over random rules and requests, what must
// hold whatever the rules are:
//   - Match returns the first rule that matches on its own;
//   - an Exact path that matches implies its PathPrefix matches;
//   - adding a condition to a rule never makes it match more;
//   - a "*." hostname never matches its bare suffix.
func TestMatchProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	segs := []string{"a", "b", "api", "v1", "x-y", "%C3%A9"}
	randPath := func() string {
		var b strings.Builder
		for n := rng.Intn(4); n >= 0; n-- {
			b.WriteString("/" + segs[rng.Intn(len(segs))])
		}
		if rng.Intn(4) == 0 {
			b.WriteString("/")
		}
		return b.String()
	}
	methods := []string{"GET", "POST", "PUT"}
	hostNames := []string{"a.example.com", "example.com", "b.a.example.com", "other.org"}
	randRule := func() Rule {
		var r Rule
		if rng.Intn(2) == 0 {
			r.Method = methods[rng.Intn(len(methods))]
		}
		if rng.Intn(3) > 0 {
			typ := []PathMatchType{PathExact, PathPrefix}[rng.Intn(2)]
			r.Path = &PathMatch{Type: typ, Value: randPath()}
		}
		if rng.Intn(3) == 0 {
			h := hostNames[rng.Intn(len(hostNames))]
			if rng.Intn(2) == 0 {
				h = "*." + h
			}
			r.Hostnames = []string{h}
		}
		if rng.Intn(3) == 0 {
			r.Headers = []HeaderMatch{{Type: HeaderExact, Name: "X-K", Value: []string{"1", "2"}[rng.Intn(2)]}}
		}
		return r
	}
	for iter := 0; iter < 3000; iter++ {
		rules := []Rule{randRule(), randRule(), randRule()}
		r := req(t, methods[rng.Intn(len(methods))], randPath(),
			"Host: "+hostNames[rng.Intn(len(hostNames))], "X-K: "+[]string{"1", "2"}[rng.Intn(2)])
		want := -1
		for i, rule := range rules {
			if got, _ := compile(t, rule).Match(r); got == 0 {
				want = i
				break
			}
		}
		if got, _ := compile(t, rules...).Match(r); got != want {
			t.Fatalf("rules %+v on %s %s: match %d, first matching alone %d", rules, r.Method, r.Path, got, want)
		}
		rule := rules[0]
		alone, _ := compile(t, rule).Match(r)
		if rule.Path != nil && rule.Path.Type == PathExact && alone == 0 {
			asPrefix := rule
			asPrefix.Path = &PathMatch{Type: PathPrefix, Value: rule.Path.Value}
			if got, _ := compile(t, asPrefix).Match(r); got != 0 {
				t.Fatalf("Exact %s matches %s but PathPrefix does not", rule.Path.Value, r.Path)
			}
		}
		narrower := rule
		if narrower.Method == "" {
			narrower.Method = methods[rng.Intn(len(methods))]
		}
		if got, _ := compile(t, narrower).Match(r); got == 0 && alone != 0 {
			t.Fatalf("adding method %s to %+v made it match %s %s", narrower.Method, rule, r.Method, r.Path)
		}
	}
	for _, h := range hostNames {
		m := compile(t, Rule{Hostnames: []string{"*." + h}})
		if got, _ := m.Match(req(t, "GET", "/", "Host: "+h)); got == 0 {
			t.Errorf("*.%s matches %s", h, h)
		}
	}
}

// FuzzCanonicalPath: a canonical path is its own canonical form, and
// none stays accepted with an unreserved character of it sent encoded.
func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/a%2fb", "/~user/x;y", "/a/./b", "/%C3%A9/", "/a;%41", "/;/", "/a/;"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := CanonicalPath(p)
		if err != nil {
			return
		}
		again, err := CanonicalPath(c)
		if err != nil || again != c {
			t.Fatalf("CanonicalPath(%q) = %q, and of that %q, %v", p, c, again, err)
		}
		var enc strings.Builder
		for i := 0; i < len(c); i++ {
			if c[i] == '%' {
				enc.WriteString(c[i : i+3])
				i += 2
			} else if isUnreserved(c[i]) {
				fmt.Fprintf(&enc, "%%%02x", c[i])
			} else {
				enc.WriteByte(c[i])
			}
		}
		if e, err := CanonicalPath(enc.String()); enc.String() != c && err == nil {
			t.Fatalf("CanonicalPath(%q) = %q, want it refused (an unreserved character sent encoded)", enc.String(), e)
		}
	})
}
