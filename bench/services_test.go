package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// servicesSamples is a two-repetition run at 4 and 1,000 Services where
// Weir's ClusterIP connection rate halves at 1,000 while its pod-IP rate
// holds, and kube-proxy iptables runs at a quarter of Weir's rate.
func servicesSamples() []sample {
	var out []sample
	add := func(setup, path, metric string, rep int, v float64) {
		out = append(out, sample{Setup: setup, Path: path, Metric: metric, Rep: rep, Value: v})
	}
	for rep := range 2 {
		drift := 1 + 0.1*float64(rep)
		for _, path := range []string{"intra", "inter"} {
			add(svSetup("weir", 4), path, "crr_per_s", rep, 1000*drift)
			add(svSetup("weir", 4), path+" pod IP", "crr_per_s", rep, 1000*drift)
			add(svSetup("weir", 1000), path, "crr_per_s", rep, 500*drift)
			add(svSetup("weir", 1000), path+" pod IP", "crr_per_s", rep, 1000*drift)
			add(svSetup("kube-proxy iptables", 1000), path, "crr_per_s", rep, 250*drift)
			add(svSetup("weir", 1000), path, "rr_avg_us", rep, 20)
			add(svSetup("weir", 1000), path+" pod IP", "rr_avg_us", rep, 20)
		}
		add(svSetup("weir", 1000), "nodeport", "crr_per_s", rep, 900)
		add(svSetup("kube-proxy iptables", 1000), "nodeport", "crr_per_s", rep, 1000)
		add(svSetup("weir", 1000), "change", "change_ms", rep, 40+float64(rep))
		add(svSetup("weir", 1000), "cost", "agent_rss_mib", rep, 60+float64(rep))
	}
	return out
}

func TestServicesTargets(t *testing.T) {
	r := &result{Scenario: "services", Samples: servicesSamples()}
	r.summarise()
	if _, err := json.Marshal(r); err != nil {
		t.Fatalf("encode: %v", err)
	}
	got := map[string]target{}
	for _, tg := range r.Targets {
		got[tg.What] = tg
	}
	for what, want := range map[string]struct {
		v   float64
		met bool
	}{
		"intra new connections/s through a ClusterIP, weir at 1000 / at 4 Services (levels measured minutes apart)": {0.5, false},
		"(same, each figure divided by the pod IP's measured beside it) inter, 1000 / 4 Services":                   {0.5, false},
		"intra new connections/s at 1000 Services, weir / kube-proxy iptables":                                      {2, true},
		"nodeport new connections/s at 1000 Services, weir / kube-proxy iptables":                                   {0.9, false},
		"inter request/response at 1000 Services, weir ClusterIP / pod IP":                                          {1, true},
		"Service change to traffic at 1000 Services, weir, p99 (ms)":                                                {40.99, true},
		"largest agent RSS at 1000 Services, weir (MiB)":                                                            {61, true},
	} {
		tg, ok := got[what]
		if !ok {
			t.Errorf("no target %q in %v", what, r.Targets)
			continue
		}
		if math.Abs(tg.Got-want.v) > 1e-9 || tg.Met != want.met {
			t.Errorf("%q: got %.4f met %v, want %.4f met %v", what, tg.Got, tg.Met, want.v, want.met)
		}
	}
	md := r.servicesMarkdown()
	for _, want := range []string{"## 4 Services", "## 1000 Services", "| intra new conn/s through ClusterIP | 525 | – | 262 (2.00) |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// With size pairs, the size target is judged on them: here the pairs
// show no cost of the Service count (the levels' halving was drift), and
// the report shows them with the programs' time per run.
func TestServicesSizePairsDecide(t *testing.T) {
	samples := servicesSamples()
	for rep := range 6 {
		drift := 1 + 0.05*float64(rep)
		for _, level := range []int{4, 1000} {
			for _, path := range []string{"intra", "inter"} {
				samples = append(samples,
					sample{Setup: svSetup("weir", level), Path: sizePath(path), Metric: "crr_per_s", Rep: rep, Value: 800 * drift},
					sample{Setup: svSetup("weir", level), Path: sizePath(path + " pod IP"), Metric: "crr_per_s", Rep: rep, Value: 1000 * drift},
					sample{Setup: svSetup("weir", level), Path: sizePath(path), Metric: "bpf_ns_per_run/sock4_connect", Rep: rep, Value: 300})
			}
		}
	}
	r := &result{Scenario: "services", Samples: samples}
	r.summarise()
	got := map[string]target{}
	for _, tg := range r.Targets {
		got[tg.What] = tg
	}
	for _, what := range []string{
		"intra new connections/s through a ClusterIP, weir at 1000 / at 4 Services (size pairs, the Service count changed between halves)",
		"(same, each figure divided by the pod IP's measured beside it) inter, 1000 / 4 Services",
	} {
		tg, ok := got[what]
		if !ok || math.Abs(tg.Got-1) > 1e-9 || !tg.Met || tg.Undecided {
			t.Errorf("%q: got %+v (present %v), want 1, met, decided", what, tg, ok)
		}
	}
	for what := range got {
		if strings.Contains(what, "levels measured minutes apart") {
			t.Errorf("the levels judged the size target despite size pairs: %q", what)
		}
	}
	md := r.servicesMarkdown()
	for _, want := range []string{
		"## Size pairs: weir alone at 4 and 1000 Services in turn",
		"| intra new conn/s through ClusterIP | 900 | 900 | 1.000 (1.000 to 1.000) |",
		"| inter via ClusterIP: sock4_connect, ns per run | 300 | 300 | 1.000 (1.000 to 1.000) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestServiceCountsMustGrow(t *testing.T) {
	for _, bad := range [][]int{nil, {3}, {100, 4}, {4, 4}} {
		if err := checkLevels(bad); err == nil {
			t.Errorf("--services %v accepted", bad)
		}
	}
	if err := checkLevels([]int{4, 100, 1000, 5000}); err != nil {
		t.Errorf("the default counts: %v", err)
	}
}
