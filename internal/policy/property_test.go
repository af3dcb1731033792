package policy

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestCompiledMatchesEvaluate holds the compiled lookup to the direct
// reading of the policies on many random clusters.
func TestCompiledMatchesEvaluate(t *testing.T) {
	c := NewCompiler()
	seen := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		s := genSnapshot(r, 1+r.IntN(5))
		res := c.Compile(s)
		if len(res.Errors) > 0 {
			t.Fatalf("seed %d: compile errors: %v", seed, res.Errors)
		}
		if err := checkAgainstEvaluate(s, res); err != nil {
			t.Fatalf("seed %d: %v\npolicies: %s", seed, err, dumpPolicies(s))
		}
		countOutcomes(s, seen)
	}
	// The pod's own node is exempt on ingress only: the generator must
	// reach egress to it both allowed by a rule and denied by default.
	for _, want := range []string{"host ingress networkpolicy", "host egress networkpolicy", "host egress networkpolicy-default-deny"} {
		if seen[want] == 0 {
			t.Errorf("no probe reached %q: %v", want, seen)
		}
	}
}

// TestClusterCompiledMatchesEvaluate holds the compiled tiers to the
// direct reading of ClusterNetworkPolicy, NetworkPolicy and their
// precedence order on many random clusters.
func TestClusterCompiledMatchesEvaluate(t *testing.T) {
	c := NewCompiler()
	seen := map[string]int{}
	for seed := uint64(0); seed < 400; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		s := genClusterSnapshot(r, r.IntN(3), 1+r.IntN(4))
		res := c.Compile(s)
		if err := checkAgainstEvaluate(s, res); err != nil {
			t.Fatalf("seed %d: %v\npolicies: %s", seed, err, dumpPolicies(s))
		}
		countOutcomes(s, seen)
	}
	// The generator must reach every stage, verdict and the Log and Pass
	// paths, or agreement would prove little.
	for _, want := range []string{"unenforced", "admin", "networkpolicy", "networkpolicy-default-deny",
		"baseline", "default", "allowed", "denied", "rejected", "logged",
		"host ingress networkpolicy", "host egress admin", "host egress networkpolicy-default-deny",
		"inspected", "inspected networkpolicy", "inspected default", "let on by a conditional rule"} {
		if seen[want] == 0 {
			t.Errorf("no probe reached %q: %v", want, seen)
		}
	}
}

func countOutcomes(s *Snapshot, seen map[string]int) {
	for i := range s.Pods {
		for _, d := range []Direction{Ingress, Egress} {
			for _, peer := range genPeers() {
				o := Evaluate(s, &s.Pods[i], d, peer, ProtoTCP, 80)
				seen[o.Stage.String()]++
				seen[o.Verdict.String()]++
				if o.Log.Name != "" {
					seen["logged"]++
				}
				if o.Inspect {
					seen["inspected"]++
					seen["inspected "+o.Stage.String()]++
					if (o.Stage == StageAdmin || o.Stage == StageBaseline) && o.Rule.Action == ActionPass {
						seen["let on by a conditional rule"]++
					}
				}
				if peer == genHost {
					seen["host "+d.String()+" "+o.Stage.String()]++
				}
			}
		}
	}
}

// TestDiffReachesNext applies each diff to the previous state and expects
// the next state, across a random sequence of snapshots that share one
// compiler (so numbering is reused as it is in the agent).
func TestDiffReachesNext(t *testing.T) {
	c := NewCompiler()
	var prev *Result
	r := rand.New(rand.NewPCG(42, 42))
	for step := 0; step < 200; step++ {
		next := c.Compile(genClusterSnapshot(r, r.IntN(6), r.IntN(3)))
		d := DiffResults(prev, next)
		got := applyDiff(t, prev, d)
		if err := sameState(got, next); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if again := DiffResults(next, next); !again.Empty() {
			t.Fatalf("step %d: diff of a result with itself is not empty: %+v", step, again)
		}
		prev = next
	}
}

// FuzzCompile builds a cluster from the fuzzer's bytes and requires the
// compiler to agree with Evaluate and never fail on valid policies.
func FuzzCompile(f *testing.F) {
	for _, s := range []uint64{0, 1, 99, 12345} {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:], s)
		binary.LittleEndian.PutUint64(b[8:], s*31+3)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b [16]byte
		copy(b[:], data)
		r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(b[:]), binary.LittleEndian.Uint64(b[8:])))
		s := genSnapshot(r, 1+r.IntN(6))
		res := NewCompiler().Compile(s)
		if len(res.Errors) > 0 {
			t.Fatalf("compile errors: %v", res.Errors)
		}
		if err := checkAgainstEvaluate(s, res); err != nil {
			t.Fatalf("%v\npolicies: %s", err, dumpPolicies(s))
		}
	})
}
