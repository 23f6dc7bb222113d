package etlcontext

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dama-etl/dama/protocol"
)

// Replaced counts what CleanJSON or CleanText replaced so that PostgreSQL
// accepts a value. Each replaced character or sequence becomes U+FFFD; a
// number becomes a string of its digits.
type Replaced struct {
	// NUL counts NUL characters: text and jsonb cannot hold them.
	NUL int
	// InvalidUTF8 counts runs of bytes that are not UTF-8.
	InvalidUTF8 int
	// Surrogates counts \u escapes of unpaired UTF-16 surrogates, which
	// jsonb refuses.
	Surrogates int
	// Numbers counts numbers outside numeric's range (more than 131,072
	// digits before the decimal point or 16,383 after it).
	Numbers int
	// Huge counts numbers numeric holds but jsonb would print more than
	// maxNumberGrowth characters longer than they are written (1e131071
	// is 8 bytes, and 131,072 digits read back).
	Huge int
}

// Any reports whether anything was replaced.
func (r Replaced) Any() bool { return r != Replaced{} }

// Add returns the sum of r and o.
func (r Replaced) Add(o Replaced) Replaced {
	return Replaced{NUL: r.NUL + o.NUL, InvalidUTF8: r.InvalidUTF8 + o.InvalidUTF8, Surrogates: r.Surrogates + o.Surrogates, Numbers: r.Numbers + o.Numbers, Huge: r.Huge + o.Huge}
}

// Refused reports whether the database would refuse what was replaced
// (every replacement but Huge's).
func (r Replaced) Refused() bool {
	return r.NUL+r.InvalidUTF8+r.Surrogates+r.Numbers > 0
}

// String says what was replaced, e.g. "2 NUL characters, 1 invalid UTF-8
// sequence".
func (r Replaced) String() string {
	var parts []string
	add := func(n int, one, many string) {
		switch {
		case n == 1:
			parts = append(parts, "1 "+one)
		case n > 1:
			parts = append(parts, strconv.Itoa(n)+" "+many)
		}
	}
	add(r.NUL, "NUL character", "NUL characters")
	add(r.InvalidUTF8, "invalid UTF-8 sequence", "invalid UTF-8 sequences")
	add(r.Surrogates, "unpaired UTF-16 surrogate", "unpaired UTF-16 surrogates")
	add(r.Numbers, "number out of numeric's range (stored as a string)", "numbers out of numeric's range (stored as strings)")
	add(r.Huge, "number that would read back far longer than written (stored as a string)", "numbers that would read back far longer than written (stored as strings)")
	return cmp.Or(strings.Join(parts, ", "), "nothing")
}

// ErrNotJSON reports input to CleanJSON that is not one JSON value.
var ErrNotJSON = errors.New("not a JSON value")

const replacementEscape = `\ufffd`

// maxNumberGrowth bounds how much longer than written a number may read
// back from jsonb, which prints numbers in full.
const maxNumberGrowth = 64

// CleanJSON returns data, a JSON value, with whatever jsonb would refuse
// replaced: NUL characters, invalid UTF-8 and unpaired surrogates in
// strings and keys become U+FFFD, and numbers outside numeric's range
// become strings. It returns data itself when nothing needed replacing,
// and ErrNotJSON when data is not one JSON value. Everything else is kept
// byte for byte: a cleaned value means what the original meant wherever
// jsonb could have stored it.
func CleanJSON(data []byte) ([]byte, Replaced, error) {
	var r Replaced
	if !json.Valid(data) {
		return nil, r, ErrNotJSON
	}
	var out []byte // nil until something is replaced
	copied := 0    // data[:copied] is in out
	replace := func(from, to int, with string) {
		if out == nil {
			out = make([]byte, 0, len(data)+16)
		}
		out = append(out, data[copied:from]...)
		out = append(out, with...)
		copied = to
	}
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '"':
			i = cleanString(data, i+1, &r, replace)
		case c == '-' || ('0' <= c && c <= '9'):
			end := protocol.JSONNumberEnd(data, i)
			if printed, ok := protocol.JSONBNumericText(data[i:end]); !ok || printed > end-i+maxNumberGrowth {
				if ok {
					r.Huge++
				} else {
					r.Numbers++
				}
				replace(i, end, `"`+string(data[i:end])+`"`)
			}
			i = end
		default:
			i++
		}
	}
	if out == nil {
		return data, r, nil
	}
	return append(out, data[copied:]...), r, nil
}

// cleanString cleans the string whose contents start at data[i] and
// returns the index after its closing quote. data is valid JSON.
func cleanString(data []byte, i int, r *Replaced, replace func(from, to int, with string)) int {
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			return i + 1
		case c == '\\':
			if data[i+1] != 'u' {
				i += 2
				continue
			}
			cp := hex4(data[i+2 : i+6])
			switch {
			case cp == 0:
				r.NUL++
				replace(i, i+6, replacementEscape)
			case 0xD800 <= cp && cp < 0xE000:
				// A high surrogate followed by a low one is a pair.
				if cp < 0xDC00 && i+12 <= len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
					if lo := hex4(data[i+8 : i+12]); 0xDC00 <= lo && lo < 0xE000 {
						i += 12
						continue
					}
				}
				r.Surrogates++
				replace(i, i+6, replacementEscape)
			}
			i += 6
		case c < utf8.RuneSelf:
			i++
		default:
			ru, size := utf8.DecodeRune(data[i:])
			if ru != utf8.RuneError || size > 1 {
				i += size
				continue
			}
			// One replacement for a run of bad bytes.
			end := i + 1
			for end < len(data) && data[end] >= utf8.RuneSelf {
				if ru, size := utf8.DecodeRune(data[end:]); ru != utf8.RuneError || size > 1 {
					break
				}
				end++
			}
			r.InvalidUTF8++
			replace(i, end, replacementEscape)
			i = end
		}
	}
	return i
}

func hex4(b []byte) rune {
	v, err := strconv.ParseUint(string(b), 16, 32)
	if err != nil {
		return -1
	}
	return rune(v)
}

// CleanText returns s with NUL characters and invalid UTF-8 replaced by
// U+FFFD, for text PostgreSQL must accept (a log tail, a reason).
func CleanText(s string) (string, Replaced) {
	var r Replaced
	if !strings.ContainsRune(s, 0) && utf8.ValidString(s) {
		return s, r
	}
	// Each run of invalid bytes becomes one NUL, then every NUL U+FFFD.
	r.NUL = strings.Count(s, "\x00")
	s = strings.ToValidUTF8(s, "\x00")
	r.InvalidUTF8 = strings.Count(s, "\x00") - r.NUL
	return strings.ReplaceAll(s, "\x00", string(utf8.RuneError)), r
}

// cleanPayload encodes v as JSON that jsonb accepts; nil for nil or an
// empty json.RawMessage.
func cleanPayload(v any) ([]byte, error) {
	var raw []byte
	switch v := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(v) == 0 {
			return nil, nil
		}
		raw = v
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	clean, _, err := CleanJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %.64q", err, raw)
	}
	return clean, nil
}
