package datapath

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/weirnet/weir/internal/testutil"
)

// TestL7AnswerFacts pins down what an sk_skb verdict can do with a
// request it refuses on this kernel, the facts the L7 design rests on
// (docs/l7.md), with bpf/tests/l7_answer.c on an echo server's sockets:
//
//   - rewritten in place into a response of the same length and
//     redirected to the socket's own egress, the skb reaches the client
//     and never the server, and the connection goes on: the next bytes
//     are echoed;
//   - dropped, the skb is gone and the connection goes on;
//   - grown before the redirect, the response reaches the client but the
//     socket's receive side stops: nothing sent after it reaches the
//     server. So an answer must be exactly as long as the skb it replaces.
//
// If a kernel changes any of these, this test fails and docs/l7.md must
// change with it.
func TestL7AnswerFacts(t *testing.T) {
	testutil.RequireRoot(t)
	cg := l7TestCgroup(t)
	spec, err := loadL7answer()
	if err != nil {
		t.Fatal(err)
	}
	const port = 18595
	if err := spec.Variables["PORT"].Set(uint16(port)); err != nil {
		t.Fatal(err)
	}
	var objs l7answerObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load: %+v", err)
	}
	defer objs.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: objs.AnswerHash.FD(), Program: objs.AnswerVerdict, Attach: ebpf.AttachSkSKBVerdict}); err != nil {
		t.Fatal(err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: objs.AnswerSockops})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startL7Helper(t, cg, addr)

	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	exchange := func(send string, want int) string {
		t.Helper()
		if _, err := c.Write([]byte(send)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		got := make([]byte, want)
		n, err := io.ReadFull(r, got)
		if err != nil {
			return fmt.Sprintf("error after %d bytes: %v", n, err)
		}
		return string(got)
	}
	settle := func() { time.Sleep(20 * time.Millisecond) } // one skb per write

	if got := exchange("hello", 5); got != "hello" {
		t.Fatalf("plain echo: %q", got)
	}
	settle()
	request := "A" + strings.Repeat("x", 99)
	got := exchange(request, len(request))
	if !strings.HasPrefix(got, "HTTP/1.1 403 Forbidden") || !strings.HasSuffix(got, "\r\nContent-Length: 0\r\n\r\n") {
		t.Fatalf("a same-length answer: the client read %q, want the 403 in its place", got)
	}
	settle()
	if got := exchange("after-answer", 12); got != "after-answer" {
		t.Fatalf("after a same-length answer the connection broke: %q", got)
	}
	settle()
	if _, err := c.Write([]byte("Z" + strings.Repeat("z", 2999))); err != nil {
		t.Fatal(err)
	}
	settle()
	if got := exchange("after-drop", 10); got != "after-drop" {
		t.Fatalf("after a drop the connection broke: %q (or the dropped bytes were echoed)", got)
	}
	settle()
	got = exchange("G"+strings.Repeat("g", 49), 200)
	if !strings.HasPrefix(got, "HTTP/1.1 403") {
		t.Fatalf("a grown answer: the client read %q", got)
	}
	settle()
	if got := exchange("after-grow", 10); !strings.HasPrefix(got, "error") {
		t.Fatalf("after a grown answer the server echoed %q: growing no longer breaks the stream, docs/l7.md can allow it", got)
	}
	var rest bytes.Buffer
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	io.Copy(&rest, r)
}
