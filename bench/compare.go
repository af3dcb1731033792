package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// agreement is one paired-ratio target as two runs of one command saw it.
type agreement struct {
	What     string
	A, B     target
	Agree    bool // each run's median lies inside the other's interval
	HalfA    float64
	HalfB    float64
	Compared bool // both runs have the target with an interval
}

// compareRuns reads two results of the same scenario and checks, target
// by target, that the runs agree within their intervals.
func compareRuns(pathA, pathB string) (a, b *result, rows []agreement, err error) {
	if a, err = readResult(pathA); err != nil {
		return nil, nil, nil, err
	}
	if b, err = readResult(pathB); err != nil {
		return nil, nil, nil, err
	}
	// The intervals of the ratios to raw come from the samples.
	for _, r := range []*result{a, b} {
		r.Summary, r.Targets = nil, nil
		r.summarise()
	}
	if a.Scenario != b.Scenario {
		return nil, nil, nil, fmt.Errorf("%s is a %s run and %s a %s run: compare runs of one command", pathA, a.Scenario, pathB, b.Scenario)
	}
	byWhat := map[string]target{}
	for _, t := range b.pairedFigures() {
		byWhat[t.What] = t
	}
	for _, ta := range a.pairedFigures() {
		tb, ok := byWhat[ta.What]
		row := agreement{What: ta.What, A: ta, B: tb}
		if ok && hasInterval(ta) && hasInterval(tb) {
			row.Compared = true
			row.Agree = within(ta.Got, tb) && within(tb.Got, ta)
			row.HalfA, row.HalfB = halfWidth(ta), halfWidth(tb)
		}
		rows = append(rows, row)
	}
	return a, b, rows, nil
}

func readResult(path string) (*result, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r result
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func hasInterval(t target) bool { return t.CILow != 0 || t.CIHigh != 0 }

func within(v float64, t target) bool { return v >= t.CILow && v <= t.CIHigh }

// halfWidth is t's interval half-width relative to its median.
func halfWidth(t target) float64 { return (t.CIHigh - t.CILow) / 2 / math.Abs(t.Got) }

// writeComparison prints the agreement table as Markdown and returns how
// many compared targets disagree.
func writeComparison(w io.Writer, pathA, pathB string, a, b *result, rows []agreement) int {
	fmt.Fprintf(w, "Run A: `%s` (%s, commit %s, %d reps)  \nRun B: `%s` (%s, commit %s, %d reps)\n\n", pathA, a.Started, a.Commit, a.Reps, pathB, b.Started, b.Commit, b.Reps)
	if a.Command != b.Command {
		fmt.Fprintf(w, "**The commands differ**:\n\n    %s\n    %s\n\n", a.Command, b.Command)
	} else {
		fmt.Fprintf(w, "Both ran `%s`.\n\n", a.Command)
	}
	fmt.Fprintln(w, "| paired ratio | run A (95% interval) | run B (95% interval) | agree |")
	fmt.Fprintln(w, "|---|---|---|---|")
	disagree := 0
	for _, r := range rows {
		if !r.Compared {
			continue
		}
		verdict := "yes"
		if !r.Agree {
			verdict, disagree = "**no**", disagree+1
		}
		fmt.Fprintf(w, "| %s | %.3f (%.3f–%.3f, ±%.1f%%) | %.3f (%.3f–%.3f, ±%.1f%%) | %s |\n", r.What,
			r.A.Got, r.A.CILow, r.A.CIHigh, 100*r.HalfA, r.B.Got, r.B.CILow, r.B.CIHigh, 100*r.HalfB, verdict)
	}
	var others []string
	for _, r := range rows {
		if !r.Compared {
			others = append(others, r.What)
		}
	}
	if len(others) > 0 {
		fmt.Fprintf(w, "\nNot compared (no paired-ratio interval): %s.\n", strings.Join(others, "; "))
	}
	fmt.Fprintf(w, "\n%d of the compared ratios disagree: a run's median outside the other's interval.\n", disagree)
	return disagree
}
