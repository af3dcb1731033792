package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeListsEveryMissedTarget: every target a committed result
// missed is named, as the result names it, in the README: a figure that
// misses is reported as missed, never left out.
func TestReadmeListsEveryMissedTarget(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	results := 0
	err = filepath.WalkDir("results", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".json" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var r result
		if err := json.Unmarshal(b, &r); err != nil {
			t.Errorf("%s: %v", path, err)
			return nil
		}
		results++
		for _, tg := range r.Targets {
			if !tg.Met && !strings.Contains(string(readme), tg.What) {
				t.Errorf("%s missed %q (want %s, got %.3g) and README.md does not say so", path, tg.What, tg.Want, tg.Got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if results == 0 {
		t.Fatal("no results under bench/results")
	}
}
