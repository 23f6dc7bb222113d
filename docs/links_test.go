// Package docs_test checks that the README and the pages of docs/ link
// only to files and sections that exist, so that moving a section breaks
// a test rather than a reader's link.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	heading = regexp.MustCompile(`^#+ (.*)$`)
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// notInAnchor is what GitHub drops from a heading to make its anchor.
	notInAnchor = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// isFence reports a line that opens or closes a code block.
func isFence(line string) bool {
	return strings.HasPrefix(line, "```") || strings.HasPrefix(line, "~~~")
}

// anchors are the anchors GitHub gives the headings of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	fence := false
	for _, line := range strings.Split(string(body), "\n") {
		if isFence(line) {
			fence = !fence
		}
		if m := heading.FindStringSubmatch(line); m != nil && !fence {
			a := notInAnchor.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), "")
			out[strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	return out
}

func TestLinksLeadSomewhere(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join("..", "README.md"))
	checked := 0
	for _, page := range pages {
		body, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		fence := false
		for n, line := range strings.Split(string(body), "\n") {
			if isFence(line) {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
				}
				checked++
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d links to %s, which does not exist", page, n+1, target)
					continue
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
					t.Errorf("%s:%d links to %s, whose section does not exist", page, n+1, target)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no link checked: the pattern misses them")
	}
}

// sectionRef is how code, SQL and scripts point at a page's section:
// docs/<page>.md "<heading>", the heading perhaps split across comment
// lines.
var sectionRef = regexp.MustCompile(`docs/([a-z]+\.md) "([^"]+)"`)

// commentBreak is a line break inside a comment, with the next line's
// comment marker.
var commentBreak = regexp.MustCompile(`\s*\n\s*(//|--|#)?\s*`)

// TestSectionsNamedInTheCodeExist: every docs/<page>.md "<heading>" in
// the repository's code, SQL and scripts names a heading of that page.
func TestSectionsNamedInTheCodeExist(t *testing.T) {
	var files []string
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		switch filepath.Ext(path) {
		case ".go", ".sql", ".sh", ".md", ".service":
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range sectionRef.FindAllStringSubmatch(string(body), -1) {
			title := commentBreak.ReplaceAllString(m[2], " ")
			// Code quotes a heading by its text: GitHub's anchor of it.
			a := strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
			checked++
			if !anchors(t, m[1])[a] {
				t.Errorf("%s names the section %q of docs/%s, which has no such heading", f, title, m[1])
			}
		}
	}
	if checked == 0 {
		t.Fatal("no section reference found: the pattern misses them")
	}
}

// TestExamplesAreInTheDocs checks that every file of docs/examples, which
// the end-to-end tests run (cmd/dama), is shown whole in a code block of
// docs/tasks.md: what a reader copies is what runs.
func TestExamplesAreInTheDocs(t *testing.T) {
	doc, err := os.ReadFile("tasks.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var block []string
	fence := false
	for _, line := range strings.Split(string(doc), "\n") {
		if isFence(line) {
			if fence {
				blocks = append(blocks, strings.Join(block, "\n")+"\n")
			}
			fence, block = !fence, nil
			continue
		}
		if fence {
			block = append(block, line)
		}
	}
	examples, err := filepath.Glob(filepath.Join("examples", "*"))
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples (%v)", err)
	}
	for _, path := range examples {
		body, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		shown := false
		for _, b := range blocks {
			shown = shown || b == string(body)
		}
		if !shown {
			t.Errorf("%s is not shown whole in a code block of docs/tasks.md", path)
		}
	}
}
