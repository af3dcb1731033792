package conformance

import (
	"os"
	"path/filepath"
	"testing"
)

// The tail of a cyclonus v0.5.6 log that crashed resetting labels, as
// it was printed in CI (stack abridged).
const cyclonusConflictLog = `finished policy #2
starting test case #3
time="2026-11-29T00:14:58Z" level=info msg="cluster state reset"
time="2026-11-29T00:15:30Z" level=fatal msg="Operation cannot be fulfilled on pods \"a\": the object has been modified; please apply your changes to the latest version and try again\nunable to update pod z/a\ngithub.com/mattfenwick/cyclonus/pkg/kube.(*Kubernetes).SetPodLabels\n\tgithub.com/mattfenwick/cyclonus@v0.5.6/pkg/kube/kubernetes.go:164"
`

func TestCyclonusUpdateConflict(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, log, pod string
		conflict       bool
	}{
		{"the update conflict", cyclonusConflictLog, "z/a", true},
		{"another crash", "time=\"x\" level=fatal msg=\"unable to create namespace y-2: forbidden\"\n", "", false},
		{"a conflict on a namespace", `level=fatal msg="Operation cannot be fulfilled on namespaces \"z\": the object has been modified; please apply your changes to the latest version and try again\nunable to update namespace z"`, "", false},
		{"no log", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "cyclonus.log")
			os.Remove(path)
			if tc.log != "" {
				if err := os.WriteFile(path, []byte(tc.log), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			pod, conflict := cyclonusUpdateConflict(path)
			if pod != tc.pod || conflict != tc.conflict {
				t.Errorf("got (%q, %v), want (%q, %v)", pod, conflict, tc.pod, tc.conflict)
			}
		})
	}
}
