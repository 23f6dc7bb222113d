package etlcontext_test

import (
	"encoding/json"
	"testing"

	"github.com/dama-etl/dama/etlcontext"
)

func TestParseProgress(t *testing.T) {
	cases := []struct {
		payload  string
		ok       bool
		fraction float64
		label    string
	}{
		{`{"step": 3, "of": 10}`, true, 0.3, "3/10"},
		{`{"of": 4, "step": 4, "table": "x"}`, true, 1, "4/4"},
		{`{"percent": 30}`, true, 0.3, "30%"},
		{`{"percent": 12.5}`, true, 0.125, "12.5%"},
		{`{"step": 12, "of": 10}`, true, 1, "12/10"},
		{`{"percent": -5}`, true, 0, "-5%"},
		{`{"step": 3, "of": 0}`, false, 0, ""},
		{`{"step": 3}`, false, 0, ""},
		{`{"pct": 100}`, false, 0, ""},
		{`{"percent": "30"}`, false, 0, ""},
		{`42`, false, 0, ""},
		{`[1, 2]`, false, 0, ""},
		{``, false, 0, ""},
	}
	for _, c := range cases {
		p, ok := etlcontext.ParseProgress(json.RawMessage(c.payload))
		if ok != c.ok || p.Fraction != c.fraction || p.Label != c.label {
			t.Errorf("ParseProgress(%s) = %+v, %v: want {%v %q}, %v", c.payload, p, ok, c.fraction, c.label, c.ok)
		}
	}
}
