package protocol

import (
	"regexp"
	"strings"
	"testing"
)

func TestValidSuffixIsItsDefinition(t *testing.T) {
	def := regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,62}$`)
	cases := []string{
		"", "A", "PROGRESS", "ROWS_2", "_A", "1A", "a", "Ab", "A-B", "A B", "A\n", "É", "AÉ",
		strings.Repeat("A", 63), strings.Repeat("A", 64), "A" + strings.Repeat("_", 62), "A\x00",
	}
	// Every byte in every position of a short suffix.
	for c := range 256 {
		cases = append(cases, string([]byte{byte(c)}), "A"+string([]byte{byte(c)}), string([]byte{byte(c)})+"A")
	}
	for _, s := range cases {
		if got, want := ValidSuffix(s), def.MatchString(s); got != want {
			t.Errorf("ValidSuffix(%q) = %v, want %v", s, got, want)
		}
	}
}
