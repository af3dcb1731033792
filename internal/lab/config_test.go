package lab

import (
	"strings"
	"testing"
)

// TestConfigValidateCNI: a lab without a CNI is only a Kubernetes lab
// whose agents the chart installs, and every refusal says what to change.
func TestConfigValidateCNI(t *testing.T) {
	bin := t.TempDir() // holds no binaries: an accepted config fails only on those
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when the CNI choice is accepted
	}{
		{"kubernetes without a CNI", Config{Kubernetes: true, CNI: CNINone}, ""},
		{"bare lab without a CNI", Config{CNI: CNINone}, "only a Kubernetes lab"},
		{"host agents without a CNI", Config{Kubernetes: true, CNI: CNINone, AgentMode: AgentHost}, "agent mode daemonset"},
		{"release without a CNI", Config{Kubernetes: true, CNI: CNINone, Release: "abc"}, "no --release"},
		{"bridge on Kubernetes", Config{Kubernetes: true, CNI: CNIBridge}, "a Kubernetes lab runs Weir"},
		{"unknown", Config{CNI: "flannel"}, "want weir, bridge or none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Name, cfg.Nodes, cfg.Mode, cfg.BinDir = "t", 2, "vxlan", bin
			err := cfg.Validate()
			if tc.want == "" {
				// Accepted: the first complaint is about the missing binaries.
				if err == nil || !strings.Contains(err.Error(), "not found in") {
					t.Fatalf("Validate() = %v, want only the binaries missing", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to say %q", err, tc.want)
			}
		})
	}
}
