package l7

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
)

// PathMatchType is how a rule's path value is compared; the names are
// Gateway API's HTTPPathMatch types.
type PathMatchType string

// The path match types.
const (
	PathExact             PathMatchType = "Exact"
	PathPrefix            PathMatchType = "PathPrefix"
	PathRegularExpression PathMatchType = "RegularExpression"
)

// HeaderMatchType is how a rule's header value is compared: Gateway API's
// HTTPHeaderMatch types plus Present.
type HeaderMatchType string

// The header match types.
const (
	HeaderExact             HeaderMatchType = "Exact"
	HeaderRegularExpression HeaderMatchType = "RegularExpression"
	// HeaderPresent matches a request that has the header, any value.
	HeaderPresent HeaderMatchType = "Present"
)

// Rule is one HTTP rule: a request matches when it matches every part
// the rule sets. A rule with nothing set matches every request.
type Rule struct {
	// Method, when set, is compared exactly (methods are case-sensitive).
	Method string
	Path   *PathMatch
	// Hostnames, when set, match a request whose host is one of them:
	// "api.example.com" exactly, "*.example.com" any name under it (one
	// label or more, as HTTPRoute's hostnames), case-insensitively.
	Hostnames []string
	// Headers all must match; names are case-insensitive and may not
	// repeat within a rule.
	Headers []HeaderMatch
}

// PathMatch compares the request's canonical path.
type PathMatch struct {
	Type  PathMatchType
	Value string
}

// HeaderMatch compares one header's value.
type HeaderMatch struct {
	Type  HeaderMatchType
	Name  string
	Value string
}

// ErrInvalidRule is a rule Compile refuses; the error says what to fix.
var ErrInvalidRule = errors.New("invalid HTTP rule")

// Matcher judges requests against compiled rules.
type Matcher struct {
	rules   []compiledRule
	headers []string // every header name a rule matches on
}

type compiledRule struct {
	method    string
	pathType  PathMatchType
	path      string // canonical; for PathPrefix without its trailing '/'
	pathRE    *regexp.Regexp
	exactHost map[string]bool
	wildHosts []string // ".example.com" for "*.example.com"
	anyHost   bool
	headers   []compiledHeader
}

type compiledHeader struct {
	typ   HeaderMatchType
	name  string
	value string
	re    *regexp.Regexp
}

// Compile checks rules and prepares them for matching. Regular
// expressions are RE2 (Go's regexp) and must match the whole path or
// value.
func Compile(rules []Rule) (*Matcher, error) {
	m := &Matcher{}
	names := map[string]bool{}
	for i, r := range rules {
		cr, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("%w: rule %d: %v", ErrInvalidRule, i, err)
		}
		for _, h := range cr.headers {
			if !names[h.name] {
				names[h.name] = true
				m.headers = append(m.headers, h.name)
			}
		}
		m.rules = append(m.rules, cr)
	}
	return m, nil
}

func compileRule(r Rule) (compiledRule, error) {
	cr := compiledRule{method: r.Method, anyHost: len(r.Hostnames) == 0}
	if r.Method != "" && !isToken([]byte(r.Method)) {
		return cr, fmt.Errorf("method %q is not an HTTP method token", r.Method)
	}
	if err := cr.compilePath(r.Path); err != nil {
		return cr, err
	}
	if err := cr.compileHosts(r.Hostnames); err != nil {
		return cr, err
	}
	seen := map[string]bool{}
	for _, h := range r.Headers {
		ch, err := compileHeader(h)
		if err != nil {
			return cr, err
		}
		if seen[ch.name] {
			return cr, fmt.Errorf("header %s matched twice in one rule: put both conditions in one regular expression", h.Name)
		}
		seen[ch.name] = true
		cr.headers = append(cr.headers, ch)
	}
	return cr, nil
}

func (cr *compiledRule) compilePath(p *PathMatch) error {
	if p == nil {
		return nil
	}
	cr.pathType = p.Type
	switch p.Type {
	case PathExact, PathPrefix:
		if strings.Contains(p.Value, ";") {
			return fmt.Errorf("path %q: path parameters (';') are cut off before matching; leave them out", p.Value)
		}
		canon, err := CanonicalPath(p.Value)
		if err != nil {
			return fmt.Errorf("path %q: %v", p.Value, err)
		}
		if canon != p.Value {
			return fmt.Errorf("path %q matches requests in canonical form; write it %q", p.Value, canon)
		}
		cr.path = canon
		if p.Type == PathPrefix {
			cr.path = strings.TrimSuffix(canon, "/")
		}
	case PathRegularExpression:
		re, err := compileWhole(p.Value)
		if err != nil {
			return fmt.Errorf("path regular expression %q: %v", p.Value, err)
		}
		cr.pathRE = re
	default:
		return fmt.Errorf("path match type %q: use Exact, PathPrefix or RegularExpression", p.Type)
	}
	return nil
}

func (cr *compiledRule) compileHosts(hosts []string) error {
	cr.exactHost = map[string]bool{}
	for _, h := range hosts {
		name, wild := strings.CutPrefix(h, "*.")
		canon, err := canonicalHost(name)
		if err != nil || canon == "" || canon != lower(name) || strings.ContainsAny(name, ":[") {
			return fmt.Errorf("hostname %q: use a name such as api.example.com or *.example.com, without port", h)
		}
		if wild {
			cr.wildHosts = append(cr.wildHosts, "."+canon)
		} else {
			cr.exactHost[canon] = true
		}
	}
	return nil
}

func compileHeader(h HeaderMatch) (compiledHeader, error) {
	ch := compiledHeader{typ: h.Type, name: lower(h.Name), value: h.Value}
	if !isToken([]byte(h.Name)) {
		return ch, fmt.Errorf("header name %q is not a token", h.Name)
	}
	switch h.Type {
	case HeaderExact:
	case HeaderPresent:
		if h.Value != "" {
			return ch, fmt.Errorf("header %s: Present takes no value", h.Name)
		}
	case HeaderRegularExpression:
		re, err := compileWhole(h.Value)
		if err != nil {
			return ch, fmt.Errorf("header %s regular expression %q: %v", h.Name, h.Value, err)
		}
		ch.re = re
	default:
		return ch, fmt.Errorf("header %s match type %q: use Exact, RegularExpression or Present", h.Name, h.Type)
	}
	return ch, nil
}

// HeaderNames are the (lowercase) header names the rules match on: the
// names a request may carry only once (Parser.RefuseRepeated).
func (m *Matcher) HeaderNames() []string { return m.headers }

// Len is the number of rules.
func (m *Matcher) Len() int { return len(m.rules) }

// Match returns the index of the first rule the request matches, or -1.
// It returns ErrAmbiguousHeader for a request that carries a header a
// rule names more than once (a parser told RefuseRepeated never passes
// one on).
func (m *Matcher) Match(r *Request) (int, error) {
	for _, name := range m.headers {
		if len(r.Values(name)) > 1 {
			return -1, fmt.Errorf("%w: %s", ErrAmbiguousHeader, name)
		}
	}
	for i := range m.rules {
		if m.rules[i].matches(r) {
			return i, nil
		}
	}
	return -1, nil
}

func (cr *compiledRule) matches(r *Request) bool {
	if cr.method != "" && cr.method != r.Method {
		return false
	}
	if !cr.matchesPath(r.Path) || !cr.matchesHost(r.Host) {
		return false
	}
	for _, h := range cr.headers {
		if !h.matches(r) {
			return false
		}
	}
	return true
}

func (cr *compiledRule) matchesPath(path string) bool {
	switch cr.pathType {
	case "":
		return true
	case PathExact:
		return path == cr.path
	case PathPrefix:
		// Element-wise: "/api" matches "/api", "/api/" and "/api/x",
		// never "/apix"; "/" matches every path.
		if path == "" {
			return false
		}
		return path == cr.path || strings.HasPrefix(path, cr.path+"/")
	}
	return path != "" && cr.pathRE.MatchString(path)
}

func (cr *compiledRule) matchesHost(host string) bool {
	if cr.anyHost || cr.exactHost[host] {
		return true
	}
	for _, suffix := range cr.wildHosts {
		if len(host) > len(suffix) && strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

func (h *compiledHeader) matches(r *Request) bool {
	vs := r.Values(h.name)
	if len(vs) == 0 {
		return false
	}
	switch h.typ {
	case HeaderPresent:
		return true
	case HeaderExact:
		return vs[0] == h.value
	}
	return h.re.MatchString(vs[0])
}

// compileWhole compiles a rule's regular expression to match a whole
// string. The pattern must stand on its own: wrapped unchecked in
// ^(?:...)$, a pattern such as ")|(" would close the group and match
// any string with an empty prefix. A pattern that parses alone has its
// groups balanced, so the wrapping anchors exactly it (one that quotes
// to its end, \Q, swallows the wrapping's ")$" and does not compile).
func compileWhole(pattern string) (*regexp.Regexp, error) {
	if _, err := syntax.Parse(pattern, syntax.Perl); err != nil {
		return nil, err
	}
	return regexp.Compile(`^(?:` + pattern + `)$`)
}
