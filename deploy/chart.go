package deploy

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteChart writes the embedded chart into a new directory under dir and
// returns its path, for helm to install from.
func WriteChart(dir string) (string, error) {
	root := filepath.Join(dir, "weir")
	err := fs.WalkDir(Chart, ChartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(ChartDir, path)
		if err != nil {
			return err
		}
		to := filepath.Join(root, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := fs.ReadFile(Chart, path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("write the weir chart into %s: %w", dir, err)
	}
	return root, nil
}
