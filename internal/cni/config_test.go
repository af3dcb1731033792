package cni

import (
	"errors"
	"reflect"
	"strings"
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

func TestParseConfPortMappings(t *testing.T) {
	conf, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"weir","type":"weir-cni",
		"runtimeConfig":{"portMappings":[{"hostPort":30080,"containerPort":80,"protocol":"TCP"},{"hostPort":30053,"containerPort":53,"protocol":"udp","hostIP":"10.99.0.11"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []api.PortMapping{{HostPort: 30080, ContainerPort: 80, Protocol: "tcp"}, {HostPort: 30053, ContainerPort: 53, Protocol: "udp", HostIP: "10.99.0.11"}}
	if !reflect.DeepEqual(conf.RuntimeConfig.PortMappings, want) {
		t.Errorf("port mappings %+v, want %+v", conf.RuntimeConfig.PortMappings, want)
	}
	for _, bad := range []string{
		`{"hostPort":30080,"containerPort":80,"protocol":"sctp"}`,
		`{"hostPort":0,"containerPort":80,"protocol":"tcp"}`,
		`{"hostPort":30080,"containerPort":80,"protocol":"tcp","hostIP":"fd00::1"}`,
	} {
		_, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"weir","type":"weir-cni","runtimeConfig":{"portMappings":[` + bad + `]}}`))
		var e *types.Error
		if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig {
			t.Errorf("mapping %s: %v, want an invalid-config error", bad, err)
		}
	}
}

func TestConfListDeclaresPortMappings(t *testing.T) {
	if !strings.Contains(string(ConfList("/run/weir/agent.sock", true)), `"capabilities":{"portMappings":true}`) {
		t.Error("with hostPorts the conflist does not declare the portMappings capability")
	}
	if strings.Contains(string(ConfList("/run/weir/agent.sock", false)), "capabilities") {
		t.Error("without hostPorts the conflist declares a capability")
	}
}
