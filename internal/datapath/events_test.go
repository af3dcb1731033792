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
	for _, size := range []int{verdictEventSize - 1, verdictEventSizeNoService - 1, verdictEventSize + 1} {
		if _, err := rawVerdictEvent(make([]byte, size)); err == nil {
			t.Fatalf("an event of %d bytes decoded without error", size)
		}
	}
	// The previous programs' events, without the Service, still decode.
	old := make([]byte, verdictEventSizeNoService)
	old[32] = 17
	if ev, err := rawVerdictEvent(old); err != nil || ev.Proto != 17 || ev.SvcAddr != 0 {
		t.Fatalf("previous layout: %+v, %v", ev, err)
	}
}
