package cni

import (
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/weirnet/weir/internal/api"
)

func TestParseConf(t *testing.T) {
	cases := []struct {
		name, in string
		code     uint // 0: valid
	}{
		{"minimal", `{"cniVersion":"1.1.0","name":"weir","type":"weir-cni"}`, 0},
		{"socket", `{"cniVersion":"1.1.0","name":"weir","type":"weir-cni","agentSocket":"/run/x.sock"}`, 0},
		{"extra fields from the runtime", `{"cniVersion":"1.1.0","name":"weir","type":"weir-cni","runtimeConfig":{"x":1}}`, 0},
		{"not json", `{`, types.ErrDecodingFailure},
		{"no name", `{"cniVersion":"1.1.0","type":"weir-cni"}`, types.ErrInvalidNetworkConfig},
		{"relative socket", `{"name":"weir","agentSocket":"x.sock"}`, types.ErrInvalidNetworkConfig},
		{"ipam", `{"name":"weir","ipam":{"type":"host-local"}}`, types.ErrInvalidNetworkConfig},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := parseConf([]byte(c.in))
			if c.code == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if conf.AgentSocket == "" {
					t.Fatal("no socket")
				}
				return
			}
			var e *types.Error
			if !errors.As(err, &e) || e.Code != c.code || e.Details == "" {
				t.Fatalf("err = %#v, want code %d with details", err, c.code)
			}
		})
	}
	conf, _ := parseConf([]byte(`{"name":"weir"}`))
	if conf.AgentSocket != api.DefaultSocket {
		t.Fatalf("default socket %q", conf.AgentSocket)
	}
}

func TestCNIErrorKeepsAgentCode(t *testing.T) {
	err := cniError(api.Errorf(api.CodePoolExhausted, "no free pod address", errors.New("10.0.0.0/29 full")))
	var e *types.Error
	if !errors.As(err, &e) || e.Code != api.CodePoolExhausted || e.Details != "10.0.0.0/29 full" {
		t.Fatalf("%#v", err)
	}
	if cniError(nil) != nil {
		t.Fatal("nil error converted to non-nil")
	}
}
