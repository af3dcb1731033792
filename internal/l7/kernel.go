package l7

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// MaxKernelRules is the most rules one set may hold in the kernel: a
// rule is a bit of a 64-bit mask.
const MaxKernelRules = 64

// MaxKernelHeaders is the most header names one set's rules may match
// on in the kernel (bpf/lib/l7match.h L7_SET_HEADERS).
const MaxKernelHeaders = 8

// MaxWatchedHeaders is the most header names a node's reader watches
// across all its sets (bpf/lib/http.h HTTP_MAX_HEADERS).
const MaxWatchedHeaders = 16

// ErrTooManyRules is a rule set over MaxKernelRules or MaxKernelHeaders.
var ErrTooManyRules = errors.New("more HTTP rules than one port's set holds")

// KernelKeyKind is what a kernel lookup key hashes.
type KernelKeyKind uint8

// The kernel lookups a request makes, each at most once per hash it has.
const (
	KeyMethod      KernelKeyKind = iota + 1 // the method
	KeyPathExact                            // the whole canonical path
	KeyPathPrefix                           // a PathPrefix value, without its trailing '/'
	KeyHostExact                            // every label of the host
	KeyHostSuffix                           // the labels after a "*."
	KeyHeaderExact                          // a header's name and value (HeaderKey)
)

// KernelKey is one lookup of a set's rules.
type KernelKey struct {
	Kind KernelKeyKind
	Hash uint64
}

// KernelRules is a rule set as the kernel matches it: each condition a
// hash lookup that yields the rules it satisfies, one bit per rule, so a
// request costs the same few lookups at 1 rule as at 64.
type KernelRules struct {
	// Any* are the rules without that condition; AnyPath also holds the
	// rules whose path condition every path meets (PathPrefix "/") or the
	// kernel leaves to user space (a regular expression its automaton
	// could not hold).
	AnyMethod, AnyPath, AnyHost uint64
	// NeedsPath are the rules with a path condition: none matches a
	// request without a path (OPTIONS *).
	NeedsPath uint64
	// UserSpace are the rules with a condition the kernel cannot judge
	// (a header's regular expression, a path's its automaton could not
	// hold): a request only they may match is judged in user space.
	UserSpace uint64
	// PathDFA judges the path regular expressions of the rules in its
	// Rules mask, one byte of the canonical path at a time; nil when
	// the set has none it could hold.
	PathDFA *DFA
	// HeaderRules are the rules with a header condition, and Headers the
	// names they match on, in the order first named.
	HeaderRules uint64
	Headers     []KernelHeader
	// Entries maps each lookup to the rules it satisfies.
	Entries map[KernelKey]uint64
	// Key is the hash key the entries were computed under: the reader's.
	Key HashKey
}

// KernelHeader is one header name a set's rules match on.
type KernelHeader struct {
	Name string // lowercase
	Hash uint64 // HeaderNameHash
	// Need are the rules with a condition on it, Any those any value
	// meets (Present, and RegularExpression, whose value user space
	// judges); an Exact value is an entry of KeyHeaderExact.
	Need, Any uint64
}

// MethodHash is a method's lookup hash.
func MethodHash(k HashKey, method string) uint64 { return sipString(k, method) }

// HostHash folds host label hashes (HostLabelHashes) into one lookup
// hash, from the right, so the labels after any dot fold alike whatever
// comes before them. The labels' hashes are keyed; the fold need not be.
func HostHash(labels []uint64) uint64 {
	h := uint64(fnvOffset)
	for i := len(labels) - 1; i >= 0; i-- {
		h = (h ^ labels[i]) * fnvPrime
	}
	return h
}

// CompileKernel puts rules in the kernel's form, hashed under key (the
// reader's). Their validity is Compile's to check; this takes rules
// Compile accepted.
func CompileKernel(rules []Rule, key HashKey) (*KernelRules, error) {
	if len(rules) > MaxKernelRules {
		return nil, fmt.Errorf("%w: %d rules, at most %d", ErrTooManyRules, len(rules), MaxKernelRules)
	}
	k := &KernelRules{Entries: map[KernelKey]uint64{}, Key: key}
	var regexes []PathRegex
	for i, r := range rules {
		bit := uint64(1) << i
		if r.Method == "" {
			k.AnyMethod |= bit
		} else {
			k.Entries[KernelKey{KeyMethod, MethodHash(key, r.Method)}] |= bit
		}
		if r.Path != nil {
			k.NeedsPath |= bit
		}
		switch {
		case r.Path == nil:
			k.AnyPath |= bit
		case r.Path.Type == PathExact:
			k.Entries[KernelKey{KeyPathExact, PathHash(key, r.Path.Value)}] |= bit
		case r.Path.Type == PathPrefix:
			prefix := strings.TrimSuffix(r.Path.Value, "/")
			if prefix == "" {
				k.AnyPath |= bit // "/" is every path
			} else {
				k.Entries[KernelKey{KeyPathPrefix, PathHash(key, prefix)}] |= bit
			}
		default:
			regexes = append(regexes, PathRegex{Rule: i, Pattern: r.Path.Value})
		}
		if len(r.Hostnames) == 0 {
			k.AnyHost |= bit
		}
		for _, h := range r.Hostnames {
			name, wild := strings.CutPrefix(lower(h), "*.")
			hk := KernelKey{KeyHostExact, HostHash(HostLabelHashes(key, name))}
			if wild {
				hk.Kind = KeyHostSuffix
			}
			k.Entries[hk] |= bit
		}
		for _, h := range r.Headers {
			if err := k.addHeader(h, bit); err != nil {
				return nil, err
			}
		}
	}
	if len(regexes) > 0 {
		var refused map[int]error
		k.PathDFA, refused = CompilePathDFA(regexes, DefaultDFALimits)
		// What the automaton could not hold is left to user space.
		for i := range refused {
			k.AnyPath |= 1 << i
			k.UserSpace |= 1 << i
		}
	}
	return k, nil
}

// addHeader adds rule bit's condition on a header.
func (k *KernelRules) addHeader(h HeaderMatch, bit uint64) error {
	name := lower(h.Name)
	i := slices.IndexFunc(k.Headers, func(kh KernelHeader) bool { return kh.Name == name })
	if i < 0 {
		if len(k.Headers) == MaxKernelHeaders {
			return fmt.Errorf("%w: rules match on more than %d header names", ErrTooManyRules, MaxKernelHeaders)
		}
		k.Headers = append(k.Headers, KernelHeader{Name: name, Hash: HeaderNameHash(k.Key, name)})
		i = len(k.Headers) - 1
	}
	kh := &k.Headers[i]
	k.HeaderRules |= bit
	kh.Need |= bit
	switch h.Type {
	case HeaderExact:
		k.Entries[KernelKey{KeyHeaderExact, HeaderKey(kh.Hash, HeaderValueHash(k.Key, h.Value))}] |= bit
	case HeaderRegularExpression:
		kh.Any |= bit
		k.UserSpace |= bit
	default: // Present
		kh.Any |= bit
	}
	return nil
}

// KernelVerdict is what the kernel decides of a request.
type KernelVerdict uint8

// The kernel's verdicts.
const (
	KernelDeny      KernelVerdict = iota // no rule can match
	KernelAllow                          // a rule the kernel judged whole matches
	KernelUserSpace                      // only rules with conditions it cannot judge may match
	KernelRefuse                         // the request repeats a header the rules name (400)
)

// Judge is the kernel's algorithm (bpf/lib/l7match.h) in Go, over the
// hashes the in-kernel reader keeps of r.
func (k *KernelRules) Judge(r *Request) KernelVerdict {
	v, _ := k.JudgeRule(r)
	return v
}

// JudgeRule is Judge, and for KernelAllow the index of the rule the
// kernel names as allowing: the first rule it judges whole that matches.
func (k *KernelRules) JudgeRule(r *Request) (KernelVerdict, int) {
	candidates, userSpace, refuse := k.Candidates(r)
	switch {
	case refuse:
		return KernelRefuse, -1
	case candidates&^userSpace != 0:
		return KernelAllow, bits.TrailingZeros64(candidates &^ userSpace)
	case candidates != 0:
		return KernelUserSpace, -1
	}
	return KernelDeny, -1
}

// headerMisses are the rules whose header conditions r does not meet;
// refuse when r repeats a header the rules name (l7_header_misses).
func (k *KernelRules) headerMisses(r *Request) (miss uint64, refuse bool) {
	for _, kh := range k.Headers {
		vs := r.Values(kh.Name)
		switch {
		case len(vs) == 0:
			miss |= kh.Need
			continue
		case len(vs) > 1:
			return 0, true
		}
		met := kh.Any | k.Entries[KernelKey{KeyHeaderExact, HeaderKey(kh.Hash, HeaderValueHash(k.Key, vs[0]))}]
		miss |= kh.Need &^ met
	}
	return miss, false
}

// The in-kernel reader's bounds (bpf/lib/http.h): a head past them is
// punted, never judged there.
const (
	kernelMaxMethod   = 16
	kernelMaxPrefixes = 16
	kernelMaxLabels   = 8
	kernelMaxLabel    = 255
)

// KernelReads says whether the in-kernel reader judges r itself, and if
// not why: it punts an absolute-form or authority-form target,
// a method over 16 bytes, a path of more than 16 elements and a host of
// more than 8 labels or with one over 255 bytes
// (TestHTTPReaderMatchesParser holds this to the kernel's punts).
func KernelReads(r *Request) (bool, string) {
	switch {
	case len(r.Method) > kernelMaxMethod:
		return false, "a method over 16 bytes"
	case !strings.HasPrefix(r.Target, "/") && r.Target != "*":
		return false, "a target in absolute or authority form"
	case strings.Count(r.Path[min(1, len(r.Path)):], "/") > kernelMaxPrefixes:
		return false, "a path of more than 16 elements"
	}
	if !strings.HasPrefix(r.Host, "[") {
		labels := strings.Split(r.Host, ".")
		if len(labels) > kernelMaxLabels {
			return false, "a host of more than 8 labels"
		}
		for _, l := range labels {
			if len(l) > kernelMaxLabel {
				return false, "a host label over 255 bytes"
			}
		}
	}
	return true, ""
}
