package api

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestAttachmentValidate(t *testing.T) {
	cases := []struct {
		a    Attachment
		want string // substring of the error, "" for valid
	}{
		{Attachment{"c1", "eth0"}, ""},
		{Attachment{"", "eth0"}, "CNI_CONTAINERID"},
		{Attachment{"c1", ""}, "CNI_IFNAME"},
		{Attachment{"c1", "abcdefghijklmnop"}, "15 bytes"},
		{Attachment{"c1", "eth/0"}, "not a valid"},
		{Attachment{"c1", ".."}, "not a valid"},
	}
	for _, c := range cases {
		err := c.a.Validate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: err = %v, want %q", c.a, err, c.want)
		}
	}
	if err := (AddRequest{Attachment: Attachment{"c1", "eth0"}}).Validate(); err == nil || !strings.Contains(err.Error(), "CNI_NETNS") {
		t.Errorf("AddRequest without netns: %v", err)
	}
}

func TestCodeOf(t *testing.T) {
	if got := CodeOf(fmt.Errorf("wrapped: %w", Errorf(CodePoolExhausted, "full", nil))); got != CodePoolExhausted {
		t.Errorf("wrapped *Error: code %d", got)
	}
	if got := CodeOf(unavailable("/x.sock", errors.New("refused"))); got != CodeTryAgainLater {
		t.Errorf("unreachable agent: code %d, want try-again-later", got)
	}
	if got := CodeOf(errors.New("other")); got != CodeIOFailure {
		t.Errorf("plain error: code %d", got)
	}
}
