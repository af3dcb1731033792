package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// TestDecodeL7EventMatchesLayout holds decodeL7Event's offsets to the
// type bpf2go generated from struct l7_request_event.
func TestDecodeL7EventMatchesLayout(t *testing.T) {
	raw := l7L7RequestEvent{
		TsNs: 1000, Cookie: 0x1122334455667788,
		Client: binary.NativeEndian.Uint32([]byte{10, 244, 2, 9}), Server: binary.NativeEndian.Uint32([]byte{10, 244, 1, 7}),
		ClientPort: 40000, ServerPort: 80, Sets: [3]uint32{101, 102, 103}, Set: 102, Count: 9,
		Verdict: uint8(L7Denied), Rule: 63, Error: 5, Flags: l7evAnswered | l7evClosed | l7evLineCut,
		LineLen: 128, HostLen: 64, Dir: l7DirEgress,
		Status: 503, Replies: 2, LatencyNs: 7_000_000, LatencyMaxNs: 4_000_000,
	}
	for i := range raw.Line {
		raw.Line[i] = 'a' + byte(i%26)
	}
	for i := range raw.Host {
		raw.Host[i] = 'A' + byte(i%26)
	}
	var b bytes.Buffer
	if err := binary.Write(&b, binary.NativeEndian, raw); err != nil {
		t.Fatal(err)
	}
	ev, err := decodeL7Event(b.Bytes(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Time.UnixNano() != 1000 || ev.Cookie != raw.Cookie ||
		ev.Client != netip.MustParseAddrPort("10.244.2.9:40000") || ev.Server != netip.MustParseAddrPort("10.244.1.7:80") ||
		ev.Sets != raw.Sets || ev.Set != 102 || ev.Count != 9 || ev.Verdict != L7Denied || ev.Rule != 63 || ev.Error != 5 ||
		ev.Repeat || !ev.Answered || !ev.Closed || !ev.LineCut || !ev.Egress ||
		ev.Status != 503 || ev.Replies != 2 || ev.Latency != 7*time.Millisecond || ev.LatencyMax != 4*time.Millisecond ||
		!bytes.Equal(ev.Line, raw.Line[:]) || ev.Host != string(raw.Host[:]) {
		t.Fatalf("decoded %+v", ev)
	}
	if ev.Reason() == "" {
		t.Fatal("error 5 has no reason")
	}
	if _, err := decodeL7Event(b.Bytes()[:100], 0); err == nil {
		t.Fatal("a short record decoded")
	}
	// A record of the version before answers were read, as the programs
	// of sockets that joined before an upgrade still write it: the same
	// members up to dir, then the text.
	full := b.Bytes()
	older := append(append([]byte(nil), full[:56]...), full[56+l7ReplyFieldsSize:]...)
	ev, err = decodeL7Event(older, 0)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Verdict != L7Denied || ev.Cookie != raw.Cookie || ev.Status != 0 || !bytes.Equal(ev.Line, raw.Line[:]) || ev.Host != string(raw.Host[:]) {
		t.Fatalf("older record decoded as %+v", ev)
	}
	raw.LineLen = 129
	b.Reset()
	binary.Write(&b, binary.NativeEndian, raw)
	if _, err := decodeL7Event(b.Bytes(), 0); err == nil {
		t.Fatal("a record claiming more text than it holds decoded")
	}
}

// TestTieredHandOffReason: a flow handed over because its sets are a
// cluster tier's says so, not that regular expressions may match.
func TestTieredHandOffReason(t *testing.T) {
	ev := L7Event{Verdict: L7Punted, UserRules: true, Handed: true, Sets: [3]uint32{0, L7SetTiered | 7}}
	if got := ev.Reason(); got != "cluster rules with HTTP rules decide it in the precedence order, which the kernel does not walk" {
		t.Fatalf("tiered hand-off: %q", got)
	}
	ev.Sets = [3]uint32{7}
	if got := ev.Reason(); got != "only rules with conditions the kernel does not judge (regular expressions) may match it" {
		t.Fatalf("hand-off for a regular expression: %q", got)
	}
}
