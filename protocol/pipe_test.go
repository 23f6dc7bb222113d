package protocol

import (
	"encoding/json"
	"fmt"
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

// A child's arguments are an object, or none (empty or null: {}); any
// other JSON value is refused, in the user's words.
func TestAChildsArgumentsAreAnObject(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]string{
		``:              "",
		`null`:          "",
		`{}`:            "",
		` {"a": 1}`:     "",
		`42`:            "arguments must be a JSON object, not a number",
		`"x"`:           "arguments must be a JSON object, not a string",
		`[1, 2]`:        "arguments must be a JSON object, not an array",
		`true`:          "arguments must be a JSON object, not a boolean",
		"\n[{\"a\":1}]": "arguments must be a JSON object, not an array",
	} {
		err := Child{Kind: "k", Args: json.RawMessage(args)}.Check()
		if got := fmt.Sprint(err); (want == "" && err != nil) || (want != "" && got != want) {
			t.Errorf("args %q: %v, want %q", args, err, want)
		}
	}
}
