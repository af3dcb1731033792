package l7

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
)

// TestKernelJudgeAgreesWithMatcher holds the kernel's algorithm to the
// matcher over random rules and requests: what it allows the matcher
// matches, what it denies the matcher does not, and it leaves to user
// space only what has a rule it cannot judge.
func TestKernelJudgeAgreesWithMatcher(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	pick := func(xs ...string) string { return xs[rng.Intn(len(xs))] }
	randRule := func() Rule {
		var r Rule
		if rng.Intn(2) == 0 {
			r.Method = pick("GET", "POST", "PUT", "OPTIONS")
		}
		switch rng.Intn(6) {
		case 0:
			r.Path = &PathMatch{Type: PathExact, Value: pick("/", "/a", "/a/", "/a/b", "/v1/request-landing", "/%C3%A9")}
		case 1:
			r.Path = &PathMatch{Type: PathPrefix, Value: pick("/", "/a", "/a/", "/a/b", "/v1", "/%C3%A9")}
		case 2:
			r.Path = &PathMatch{Type: PathRegularExpression, Value: pick("/a.*", "/v[0-9]+/.*", "(?i)/A/b", "/a|/ab", "/%C3%A9(/.*)?", "/[^/]+")}
		}
		if rng.Intn(3) == 0 {
			r.Hostnames = []string{pick("api.example.com", "*.example.com", "example.com", "*.b.example.com")}
		}
		if rng.Intn(3) == 0 {
			r.Headers = randHeaders(rng)
		}
		return r
	}
	targets := []string{"/", "/a", "/a/", "/a/b", "/ab", "/a/b/c", "/v1/request-landing", "/v2/x", "/%c3%a9/x", "*"}
	hosts := []string{"api.example.com", "a.b.example.com", "example.com", "other.org", "API.Example.COM.", "[::1]:80"}
	counts := map[KernelVerdict]int{}
	for iter := 0; iter < 20000; iter++ {
		rules := make([]Rule, 1+rng.Intn(4))
		for i := range rules {
			rules[i] = randRule()
		}
		m, err := Compile(rules)
		if err != nil {
			t.Fatal(err)
		}
		k, err := CompileKernel(rules, HashKey{rng.Uint64(), rng.Uint64()})
		if err != nil {
			t.Fatal(err)
		}
		method := pick("GET", "POST", "PUT", "OPTIONS")
		target := targets[rng.Intn(len(targets))]
		if target == "*" {
			method = "OPTIONS"
		}
		head := method + " " + target + " HTTP/1.1\r\nHost: " + hosts[rng.Intn(len(hosts))] + "\r\n" + randHeaderLines(rng) + "\r\n"
		reqs, err := NewParser(Limits{}).Feed([]byte(head))
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		got := k.Judge(reqs[0])
		i, matchErr := m.Match(reqs[0])
		counts[got]++
		switch {
		case (got == KernelRefuse) != errors.Is(matchErr, ErrAmbiguousHeader):
			t.Fatalf("rules %+v, %q: kernel %v, matcher %v", rules, head, got, matchErr)
		case got == KernelRefuse:
		case got == KernelAllow && i < 0:
			t.Fatalf("kernel allows %q, no rule of %+v matches", head, rules)
		case got == KernelDeny && i >= 0:
			t.Fatalf("kernel denies %q, rule %d of %+v matches", head, i, rules)
		case got == KernelUserSpace && k.UserSpace == 0:
			t.Fatalf("kernel sends %q to user space with no rule it cannot judge", head)
		case k.UserSpace&^headerRegexRules(rules) != 0:
			t.Fatalf("rules %+v: path expressions %b left to user space", rules, k.UserSpace)
		}
	}
	t.Logf("verdicts: %v", counts)
	for _, v := range []KernelVerdict{KernelAllow, KernelDeny, KernelUserSpace, KernelRefuse} {
		// Only header expressions go to user space now.
		if counts[v] < 300 {
			t.Errorf("only %d %v verdicts", counts[v], v)
		}
	}
}

// headerRegexRules is the mask of the rules with a header regular
// expression: the only rules the kernel may leave to user space when
// their path expressions fit its automaton.
func headerRegexRules(rules []Rule) uint64 {
	var m uint64
	for i, r := range rules {
		for _, h := range r.Headers {
			if h.Type == HeaderRegularExpression {
				m |= 1 << i
			}
		}
	}
	return m
}

func TestCompileKernelRefusesTooManyRules(t *testing.T) {
	if _, err := CompileKernel(make([]Rule, MaxKernelRules+1), HashKey{}); !errors.Is(err, ErrTooManyRules) || !strings.Contains(err.Error(), "65 rules") {
		t.Fatalf("CompileKernel(65 rules) = %v, want ErrTooManyRules naming the count", err)
	}
}

// randHeaders are a rule's header conditions: one to three names, each
// once, of every type, their values among those randHeaderLines sends.
func randHeaders(rng *rand.Rand) []HeaderMatch {
	var out []HeaderMatch
	for _, name := range rng.Perm(3)[:1+rng.Intn(3)] {
		h := HeaderMatch{Name: []string{"X-K", "x-user", "Accept"}[name]}
		switch rng.Intn(4) {
		case 0:
			h.Type = HeaderPresent
		case 1:
			h.Type, h.Value = HeaderRegularExpression, "[a-z]+"
		default:
			h.Type, h.Value = HeaderExact, []string{"1", "2", "a b", "A"}[rng.Intn(4)]
		}
		out = append(out, h)
	}
	return out
}

// randHeaderLines are a head's header fields: the names randHeaders
// matches on, in any case, absent, once or (rarely) twice, with values
// that differ by case and by inner whitespace, padded with OWS.
func randHeaderLines(rng *rand.Rand) string {
	var b strings.Builder
	for _, name := range []string{"X-K", "X-User", "accept", "Other"} {
		n := []int{0, 1, 1, 1, 2}[rng.Intn(5)]
		if rng.Intn(5) != 0 && n == 2 {
			n = 1
		}
		for i := 0; i < n; i++ {
			if rng.Intn(2) == 0 {
				name = strings.ToUpper(name)
			}
			pad := []string{"", " ", "\t ", "  "}
			b.WriteString(name + ":" + pad[rng.Intn(4)] + []string{"1", "2", "a b", "a  b", "A", "a"}[rng.Intn(6)] + pad[rng.Intn(4)] + "\r\n")
		}
	}
	return b.String()
}
