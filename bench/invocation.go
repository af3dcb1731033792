package main

import (
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/weirnet/weir/internal/lab"
)

// invocation is the command line that reruns the scenario being run:
// every flag spelled out with the value it had, defaults included, so a
// recorded command still reproduces its run after a default changes.
var invocation string

// commandLine renders cmd's flags as one shell command.
func commandLine(cmd *cobra.Command) string {
	parts := []string{"sudo", "go", "run", "./bench", cmd.Name()}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		parts = append(parts, shellQuote("--"+f.Name+"="+v))
	})
	return strings.Join(parts, " ")
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./=:,+@%-]*$`)

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// sourceCommit is the commit the benchmark ran, "-dirty" appended when
// the code has uncommitted changes (results written by earlier scenarios
// are none); empty outside a git checkout.
func sourceCommit() string { return lab.GitCommit(".", "bench/results") }
