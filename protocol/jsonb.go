package protocol

// JSON is measured here as PostgreSQL's jsonb gives it back: what a task
// reads back of what it reported (a checkpoint in DAMA_CHECKPOINT, its
// arguments in DAMA_ARGS) is jsonb's text, not the JSON it wrote. Both
// sides of the events pipe measure with it, so that what a task's program
// accepts the task process stores.

import (
	"math"
	"strconv"
	"strings"
)

// The limits of PostgreSQL's numeric, which jsonb numbers are:
// NUMERIC_WEIGHT_MAX base-10000 digits before the point, NUMERIC_DSCALE_MAX
// decimal digits after it.
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
)

// JSONNumberEnd returns the index after the number starting at data[i].
func JSONNumberEnd(data []byte, i int) int {
	for i < len(data) {
		switch c := data[i]; {
		case '0' <= c && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			i++
		default:
			return i
		}
	}
	return i
}

// JSONBNumericText reports whether PostgreSQL's numeric can hold the JSON
// number num, and how long jsonb prints it.
func JSONBNumericText(num []byte) (printed int, ok bool) {
	s := string(num)
	sign := 0
	if strings.HasPrefix(s, "-") {
		s, sign = s[1:], 1
	}
	mant, expText, hasExp := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	exp := 0
	if hasExp {
		e, err := strconv.Atoi(expText)
		// numeric refuses such an exponent before looking at the digits.
		if err != nil || e >= math.MaxInt32/2 || e <= -math.MaxInt32/2 {
			return 0, false
		}
		exp = e
	}
	// Digits after the point as numeric counts them (its display scale).
	scale := max(len(frac)-exp, 0)
	if scale > numericMaxFracDigits {
		return 0, false
	}
	// Digits before the point, from the first non-zero digit wherever it
	// is: 0.5e200000 has 200,000 of them.
	digits := intPart + frac
	whole := 0
	if first := strings.IndexFunc(digits, func(r rune) bool { return r != '0' }); first >= 0 {
		whole = max(len(intPart)-first+exp, 0)
	}
	if whole > numericMaxIntDigits {
		return 0, false
	}
	printed = sign + max(whole, 1)
	if scale > 0 {
		printed += 1 + scale
	}
	return printed, true
}

// JSONBTextLen returns how long jsonb prints data, a JSON value (as
// etlcontext.CleanJSON returns it): what a task reads back of what it reported (a checkpoint, in
// DAMA_CHECKPOINT). jsonb adds a space after every ':' and ',' and prints
// numbers in full; its strings are never longer than their JSON.
func JSONBTextLen(data []byte) int {
	n := 0
	for i := 0; i < len(data); {
		switch c := data[i]; {
		case c == '"':
			end := i + 1
			for end < len(data) && data[end] != '"' {
				if data[end] == '\\' {
					end++
				}
				end++
			}
			n += end + 1 - i
			i = end + 1
		case c == ':' || c == ',':
			n += 2
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '-' || ('0' <= c && c <= '9'):
			end := JSONNumberEnd(data, i)
			printed, ok := JSONBNumericText(data[i:end])
			if !ok {
				printed = end - i
			}
			n += printed
			i = end
		default:
			n++
			i++
		}
	}
	return n
}
