package datapath

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestRawVerdictEventMatchesLayout decodes random bytes both by the
// hand-written offsets and by reflection over the bpf2go type: a change to
// struct verdict_event that the offsets miss fails here.
func TestRawVerdictEventMatchesLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100; i++ {
		b := make([]byte, verdictEventSize)
		for j := range b {
			b[j] = byte(r.IntN(256))
		}
		var want lxcVerdictEvent
		if err := binary.Read(bytes.NewReader(b), binary.NativeEndian, &want); err != nil {
			t.Fatal(err)
		}
		got, err := rawVerdictEvent(b)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("offsets decode %+v, the generated layout %+v", got, want)
		}
	}
	if _, err := rawVerdictEvent(make([]byte, verdictEventSize-1)); err == nil {
		t.Fatal("a short event decoded without error")
	}
}
