package l7

import (
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// dfaPatterns exercise what RE2 syntax offers a path rule: literals,
// classes, folds, repetition, alternation, and the empty assertions in
// the middle of a pattern, where only exact context handling answers as
// regexp does. Each comes with paths it matches, so the comparison below
// meets matches as well as misses.
var dfaPatterns = []struct {
	pattern string
	matches []string
}{
	{`/[a-z0-9/]*`, []string{"/", "/a/b9/"}},
	{`/items/[0-9]+`, []string{"/items/42"}},
	{`/v1/(users|groups)/[0-9]{1,4}`, []string{"/v1/users/7", "/v1/groups/1234"}},
	{`(?i)/API/v[0-9]+`, []string{"/api/V2", "/Api/v10"}},
	{`/[^/]+/x`, []string{"/ab/x", "/%20/x"}},
	{`.*`, []string{"", "/anything"}},
	{`(?s).*`, []string{"\n", "/a\nb"}},
	{``, []string{""}},
	{`/a|/b`, []string{"/a", "/b"}},
	{`x*`, []string{"", "xxx"}},
	{`[[:alpha:]]+`, []string{"abcXYZ"}},
	{`\d+\.\d+`, []string{"1.25"}},
	{`(/a)?/b`, []string{"/b", "/a/b"}},
	{`/\x41%2F`, []string{"/A%2F"}},
	{`(?U)/a+?`, []string{"/a", "/aaa"}},
	{`[^\n]*`, []string{"", "/a b"}},
	{`^`, []string{""}},
	{`$`, []string{""}},
	{`\A/x\z`, []string{"/x"}},
	{`a^b`, nil},
	{`/x$|/y`, []string{"/x", "/y"}},
	{`(?m)/x$\n^/y`, []string{"/x\n/y"}},
	{`(?m)^$`, []string{""}},
	{`\b/x`, nil},
	{`x\b`, []string{"x"}},
	{`/\bword\b.*`, []string{"/word", "/word-1"}},
	{`/\Bx.*`, nil},
	{`a\Bb`, []string{"ab"}},
	{`[a-z]+\b/[0-9]+`, []string{"ab/12"}},
	{`(?i)k+`, []string{"kK"}},
	{`/café`, nil},
	{`/\pL+`, []string{"/abc"}},
	{`/\PL+`, []string{"/123"}},
	{`/a{2,3}`, []string{"/aa", "/aaa"}},
	{`/(a|ab)(c|bcd)(d*)`, []string{"/abcd", "/abcdd"}},
	{`/[%A-F0-9]{3}`, []string{"/%2F", "/A0B"}},
	{`[\s\S]{0,3}`, []string{"", "ab\n"}},
	{`/(?:[a-z]+/)*[a-z]+\.(?:js|css)`, []string{"/static/app.js", "/x/y/z.css"}},
}

// dfaAlphabet is what random inputs are drawn from: the bytes the
// patterns care about and some they do not, newline and space included
// (canonical paths never hold those, but the automaton must still answer
// as regexp does for any ASCII).
const dfaAlphabet = "/aAbBcdxXyYkK0129_-.%~ \n\t:;wordjsFz"

func randomPath(r *rand.Rand, max int) string {
	var b strings.Builder
	for range r.IntN(max + 1) {
		b.WriteByte(dfaAlphabet[r.IntN(len(dfaAlphabet))])
	}
	return b.String()
}

// mutations of s: each byte dropped, doubled and replaced, to probe the
// edges of a match.
func mutations(r *rand.Rand, s string) []string {
	out := []string{s}
	for i := range len(s) {
		out = append(out, s[:i]+s[i+1:], s[:i+1]+s[i:], s[:i]+string(dfaAlphabet[r.IntN(len(dfaAlphabet))])+s[i+1:])
	}
	return out
}

func anchored(t *testing.T, pattern string) *regexp.Regexp {
	t.Helper()
	return regexp.MustCompile(`^(?:` + pattern + `)$`)
}

// TestPathDFAMatchesRegexp: each pattern's automaton, alone, answers as
// regexp's whole-string match for the paths it is meant to match, their
// mutations, and thousands of random paths.
func TestPathDFAMatchesRegexp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, p := range dfaPatterns {
		d, refused := CompilePathDFA([]PathRegex{{Rule: 5, Pattern: p.pattern}}, DefaultDFALimits)
		if len(refused) != 0 || d == nil {
			t.Fatalf("%q refused: %v", p.pattern, refused)
		}
		if d.Rules != 1<<5 {
			t.Fatalf("%q: rules %b, want rule 5", p.pattern, d.Rules)
		}
		re := anchored(t, p.pattern)
		inputs := []string{""}
		for _, m := range p.matches {
			if !re.MatchString(m) {
				t.Fatalf("test table: %q does not match %q", m, p.pattern)
			}
			inputs = append(inputs, mutations(r, m)...)
		}
		for range 3000 {
			inputs = append(inputs, randomPath(r, 12))
		}
		matched := 0
		for _, in := range inputs {
			mask, ok := d.Match(in)
			if !ok {
				t.Fatalf("%q: input %q unreadable", p.pattern, in)
			}
			if want := re.MatchString(in); (mask == 1<<5) != want || mask&^(1<<5) != 0 {
				t.Fatalf("%q on %q: automaton says %b, regexp %v", p.pattern, in, mask, want)
			}
			if mask != 0 {
				matched++
			}
		}
		if matched < len(p.matches) {
			t.Fatalf("%q matched %d inputs, fewer than its %d examples", p.pattern, matched, len(p.matches))
		}
	}
}

// TestPathDFAProduct: one automaton for a set's expressions answers, bit
// for bit, which of them match; bits name their rules.
func TestPathDFAProduct(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 40 {
		var (
			regexes []PathRegex
			res     []*regexp.Regexp
			inputs  []string
		)
		for i, j := range r.Perm(len(dfaPatterns))[:2+r.IntN(6)] {
			p := dfaPatterns[j]
			regexes = append(regexes, PathRegex{Rule: 10 + i, Pattern: p.pattern})
			res = append(res, anchored(t, p.pattern))
			for _, m := range p.matches {
				inputs = append(inputs, mutations(r, m)...)
			}
		}
		d, refused := CompilePathDFA(regexes, DefaultDFALimits)
		if len(refused) != 0 {
			t.Fatalf("trial %d: refused %v", trial, refused)
		}
		if want := uint64(1)<<(10+len(regexes)) - 1<<10; d.Rules != want {
			t.Fatalf("trial %d: rules %b, want %b", trial, d.Rules, want)
		}
		for range 2000 {
			inputs = append(inputs, randomPath(r, 10))
		}
		for _, in := range inputs {
			mask, _ := d.Match(in)
			var want uint64
			for i, re := range res {
				if re.MatchString(in) {
					want |= 1 << (10 + i)
				}
			}
			if mask != want {
				t.Fatalf("trial %d, %v on %q: mask %b, want %b", trial, regexes, in, mask, want)
			}
		}
	}
}

// TestPathDFAIsMinimal: states no path tells apart are one; a path that
// can never match ends in the dead state 0, which stays there.
func TestPathDFAIsMinimal(t *testing.T) {
	for pattern, states := range map[string]int{
		`/[a-z0-9/]*`:   3, // dead, before the '/', in the path
		`/items/[0-9]+`: 10,
		`a^b`:           1, // nothing matches: the start is dead
		`.*`:            2,
		`/a|/a`:         4,
	} {
		d, _ := CompilePathDFA([]PathRegex{{Pattern: pattern}}, DefaultDFALimits)
		if len(d.Next) != states {
			t.Errorf("%q: %d states, want %d", pattern, len(d.Next), states)
		}
		for c := range DFAColumns {
			if d.Next[0][c] != 0 || d.Accept[0] != 0 {
				t.Fatalf("%q: the dead state goes somewhere or accepts", pattern)
			}
		}
	}
	if d, _ := CompilePathDFA([]PathRegex{{Pattern: `a^b`}}, DefaultDFALimits); d.Start != 0 {
		t.Fatalf("an expression nothing matches starts in state %d, want the dead state", d.Start)
	}
}

// TestPathDFABounds: an expression whose automaton would be too large is
// left to user space, and the set's others are still built.
func TestPathDFABounds(t *testing.T) {
	regexes := []PathRegex{
		{Rule: 0, Pattern: `/items/[0-9]+`},
		{Rule: 1, Pattern: `/(a|b)*a(a|b){12}`},     // 2^12 states at least
		{Rule: 2, Pattern: `/x{1000}y{1000}z{100}`}, // over 2,048 instructions
		{Rule: 3, Pattern: `/v[0-9]+/.*`},
		{Rule: 4, Pattern: `/(`},
	}
	d, refused := CompilePathDFA(regexes, DefaultDFALimits)
	for _, rule := range []int{1, 2} {
		if !errors.Is(refused[rule], ErrDFATooLarge) {
			t.Errorf("rule %d: %v, want ErrDFATooLarge", rule, refused[rule])
		}
	}
	if refused[4] == nil || errors.Is(refused[4], ErrDFATooLarge) {
		t.Errorf("a pattern that does not parse: %v", refused[4])
	}
	if len(refused) != 3 || d.Rules != 0b1001 {
		t.Fatalf("refused %v, built %b: want rules 0 and 3 built", refused, d.Rules)
	}
	if m, _ := d.Match("/v2/z"); m != 0b1000 {
		t.Fatalf("/v2/z: mask %b, want rule 3's bit", m)
	}
	// Rules have 64 bits.
	var many []PathRegex
	for i := range 70 {
		many = append(many, PathRegex{Rule: i, Pattern: `/p` + strings.Repeat("q", i)})
	}
	d, refused = CompilePathDFA(many, DefaultDFALimits)
	if d.Rules != ^uint64(0) || len(refused) != 6 || !errors.Is(refused[69], ErrDFATooLarge) {
		t.Fatalf("70 expressions: %b built, refused %v", d.Rules, refused)
	}
	if _, ok := d.Match("/p\xc3\xa9"); ok {
		t.Fatal("a byte over 127 was read")
	}
	// A budget spent leaves the rest to user space: no policy holds up
	// the agent building automata.
	lim := DefaultDFALimits
	lim.Work = 300
	d, refused = CompilePathDFA([]PathRegex{{Rule: 0, Pattern: `/a`}, {Rule: 1, Pattern: `/v[0-9]+/[a-z]+/.*`}}, lim)
	if d == nil || d.Rules != 1 || !errors.Is(refused[1], ErrDFATooLarge) {
		t.Fatalf("with a small budget: built %v, refused %v; want the first only", d, refused)
	}
}

// FuzzPathDFA: for any pattern regexp accepts and the automaton can hold,
// and any ASCII path, they agree.
func FuzzPathDFA(f *testing.F) {
	for _, p := range dfaPatterns {
		f.Add(p.pattern, strings.Join(p.matches, ""))
	}
	f.Fuzz(func(t *testing.T, pattern, path string) {
		re, err := compileWhole(pattern)
		if err != nil {
			return
		}
		d, refused := CompilePathDFA([]PathRegex{{Pattern: pattern}}, DFALimits{States: 256, Insts: 256})
		if d == nil {
			if !errors.Is(refused[0], ErrDFATooLarge) {
				t.Fatalf("%q: regexp compiles it, the automaton refuses: %v", pattern, refused[0])
			}
			return
		}
		mask, ok := d.Match(path)
		if !ok {
			for i := range len(path) {
				if path[i] >= DFAColumns {
					return
				}
			}
			t.Fatalf("%q: ASCII path %q unreadable", pattern, path)
		}
		if (mask == 1) != re.MatchString(path) || mask > 1 {
			t.Fatalf("%q on %q: automaton %b, regexp %v", pattern, path, mask, re.MatchString(path))
		}
	})
}
