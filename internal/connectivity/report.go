package connectivity

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report as a table, a check per line, and a
// summary.
func (r *Report) WriteTable(out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESULT\tPHASE\tCHECK\tFROM\tTO\tWANT\tGOT\tRULE (FROM FLOWS)\tDETAIL")
	for _, c := range r.Checks {
		result, got := "FAIL", c.Got
		switch {
		case c.Skipped != "":
			result, got = "skip", "-"
		case c.Pass:
			result = "ok"
		}
		if c.Tries > 1 {
			got += fmt.Sprintf(" (try %d)", c.Tries)
		}
		detail := c.Detail
		if c.Skipped != "" {
			detail = c.Skipped
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", result, c.Phase, c.Name, c.From, c.To, c.Want, got,
			orDash(oneLine(c.Rule)), orDash(oneLine(detail)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d passed, %d failed, %d skipped on nodes %s (namespace %s, image %s)\n",
		r.Passed, r.Failed, r.Skipped, strings.Join(r.Nodes, ", "), r.Namespace, r.Image)
	if r.Cleanup != "" {
		fmt.Fprintf(out, "cleanup FAILED: %s\n", r.Cleanup)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
