package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// A run limited to some setups has no pair for most targets: they are
// left out, and the result still encodes (JSON has no NaN).
func TestPartialRunDropsTargetsWithoutAPair(t *testing.T) {
	r := &result{Scenario: "datapath", Samples: []sample{
		{Setup: setupWeir, Path: "intra", Metric: "crr_per_s", Rep: 0, Value: 100},
		{Setup: setupWeirNoFlows, Path: "intra", Metric: "crr_per_s", Rep: 0, Value: 100},
		{Setup: setupWeir, Path: "intra", Metric: "tcp_gbps", Rep: 0, Value: 10},
		{Setup: setupWeirNoFlows, Path: "intra", Metric: "tcp_gbps", Rep: 0, Value: 10},
	}}
	r.summarise()
	if _, err := json.Marshal(r); err != nil {
		t.Fatalf("encode: %v", err)
	}
	found := false
	for _, tg := range r.Targets {
		found = found || tg.What == "flow cost: intra crr_per_s, flows on / off"
	}
	if !found {
		t.Fatalf("the flow cost target with a pair is missing: %+v", r.Targets)
	}
}

// TestCommandLineSpellsOutEveryFlag: the recorded command names every
// flag with the value it had, defaults included, quoted for a shell.
func TestCommandLineSpellsOutEveryFlag(t *testing.T) {
	dp, _, err := newRoot().Find([]string{"datapath"})
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.ParseFlags([]string{"--reps", "3", "--setups", "weir vxlan,weir vxlan (flows off)"}); err != nil {
		t.Fatal(err)
	}
	got := commandLine(dp)
	for _, want := range []string{"sudo go run ./bench datapath ", "--reps=3", "--duration=4s", "--pods=200", "--tests=", "'--setups=weir vxlan,weir vxlan (flows off)'"} {
		if !strings.Contains(got, want) {
			t.Errorf("command %q lacks %q", got, want)
		}
	}
}
