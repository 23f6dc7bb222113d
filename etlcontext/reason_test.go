package etlcontext

import (
	"testing"
	"time"
)

func TestHumanDurations(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                     "0s",
		0:                                "0s",
		999 * time.Millisecond:           "0s",
		45 * time.Second:                 "45s",
		12*time.Minute + 5*time.Second:   "12m5s",
		3*time.Hour + 12*time.Minute + 9: "3h12m",
		51*time.Hour + 59*time.Minute:    "2d3h",
	} {
		if got := Human(d); got != want {
			t.Errorf("Human(%v) = %q, want %q", d, got, want)
		}
	}
}
