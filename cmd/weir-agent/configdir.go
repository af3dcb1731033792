package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/pflag"
)

// applyConfigDir sets each flag not given on the command line from the
// file of its name in dir: a ConfigMap mounted as a directory, one key a
// flag. $(NAME) in a value is the environment variable NAME, as in a
// container's args (the chart's paths carry $(NODE_NAME)). Names starting with a dot are the kubelet's own (..data and the
// timestamped directory behind the keys' links). A file naming no flag is
// returned as a warning, not an error: during an upgrade an agent of the
// older version may restart with the newer ConfigMap (the chart's schema
// catches typos at install time). A value a flag refuses is an error.
func applyConfigDir(fl *pflag.FlagSet, dir string) (warnings []string, _ error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--config-dir: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		if st, err := os.Stat(path); err != nil || st.IsDir() {
			continue // the kubelet's directories; a dangling link mid-update
		}
		f := fl.Lookup(name)
		if f == nil || name == "config-dir" {
			warnings = append(warnings, fmt.Sprintf("--config-dir %s: %q is no flag of this weir-agent (a newer version's? see weir-agent --help): ignored", dir, name))
			continue
		}
		if f.Changed {
			continue // the command line wins
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return warnings, fmt.Errorf("--config-dir: %w", err)
		}
		if err := fl.Set(name, expandEnv(strings.TrimSpace(string(b)))); err != nil {
			return warnings, fmt.Errorf("--config-dir %s: %s: %w", dir, name, err)
		}
	}
	return warnings, nil
}

// envRef is a reference to an environment variable, as Kubernetes expands
// them in a container's command and args.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv replaces each $(NAME) whose variable is set with its value,
// and leaves the others as they are, as Kubernetes does.
func expandEnv(s string) string {
	return envRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := os.LookupEnv(ref[2 : len(ref)-1]); ok {
			return v
		}
		return ref
	})
}
