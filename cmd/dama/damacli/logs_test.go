package damacli

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestControlCharactersAreShown(t *testing.T) {
	t.Parallel()
	in := "a\x1b]52;c;aGk=\x07b\tc\r\n\xc2\x9b31m\xc2\xa9\x7f\u202eevil\u200b\x9bz é\U000e0041"
	want := "a^[]52;c;aGk=^Gb\tc\r\n\uFFFD31m©^?\uFFFDevil\uFFFD\uFFFDz é\uFFFD"
	for split := range len(in) + 1 {
		var out strings.Builder
		c := &controlShown{w: &out}
		if _, err := c.Write([]byte(in[:split])); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(in[split:])); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("written in two at %d: %q, want %q", split, out.String(), want)
		}
	}
	// A character cut at the end is shown, not left out.
	var out strings.Builder
	c := &controlShown{w: &out}
	_, _ = c.Write([]byte("a\xe2\x80"))
	_ = c.Close()
	if out.String() != "a\uFFFD" {
		t.Errorf("a cut character at the end: %q, want %q", out.String(), "a\uFFFD")
	}
}

// JSON keeps its meaning, with what a terminal acts on escaped.
func TestJSONIsShownEscaped(t *testing.T) {
	var out strings.Builder
	in := map[string]string{"m": "\x1b]0;t\x07 \u009b31m \u202eevil \U000e0041 é"}
	if err := json.NewEncoder(jsonShown{&out}).Encode(in); err != nil {
		t.Fatal(err)
	}
	var back map[string]string
	if err := json.Unmarshal([]byte(out.String()), &back); err != nil || back["m"] != in["m"] {
		t.Errorf("read back: %q, %v; want %q", back["m"], err, in["m"])
	}
	if want := `{"m":"\u001b]0;t\u0007 \u009b31m \u202eevil \udb40\udc41 é"}` + "\n"; out.String() != want {
		t.Errorf("jsonShown: %s, want %s", out.String(), want)
	}
	// A byte that is not UTF-8, as a database of another encoding may
	// give: escaped too.
	out.Reset()
	if _, err := (jsonShown{&out}).Write([]byte("\"a\x9bb\"")); err != nil || out.String() != `"a\ufffdb"` {
		t.Errorf("jsonShown of a byte that is not UTF-8: %s, %v; want %s", out.String(), err, `"a\ufffdb"`)
	}
}
