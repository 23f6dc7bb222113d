package config_test

import (
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
)

func FuzzParseSchedule(f *testing.F) {
	at := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC).UnixNano()
	day := int64(24 * time.Hour)
	for _, s := range []struct {
		spec, zone string
		at, span   int64
	}{
		{"30 2 * * *", "Europe/Paris", at, 3 * day},
		{"*/15 * * * *", "America/New_York", at, day},
		{"*/5 * * * * *", "", at, 60e9},
		{"0 30 2 * * *", "Europe/Paris", time.Date(2026, 3, 28, 0, 0, 0, 0, time.UTC).UnixNano(), 2 * day},
		{"30 2 * * *", "Europe/Paris", time.Date(2026, 10, 24, 0, 0, 0, 0, time.UTC).UnixNano(), 2 * day},
		{"0 0 * * *", "America/Sao_Paulo", time.Date(2018, 11, 3, 0, 0, 0, 0, time.UTC).UnixNano(), 2 * day},
		{"0 0 * * *", "Asia/Kolkata", time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), day},
		{"0 0 29 2 *", "UTC", time.Date(2096, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), 9 * 365 * day},
		// No February 29 in 2100: a tick, then none for eight years.
		{"0 0 29 2 *", "UTC", time.Date(2096, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), 2 * 365 * day},
		{"0 0 29 2 */2", "UTC", time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), 2 * 365 * day},
		{"0 0 30 2 *", "UTC", at, day},
		{"@hourly", "Australia/Lord_Howe", at, day},
		{"@daily", "Pacific/Chatham", at, 400 * day},
		{"@weekly", "UTC", at, 10 * day},
		{"@monthly", "UTC", at, 100 * day},
		{"@yearly", "Asia/Tehran", at, 1000 * day},
		{"0 0 1 1 1", "UTC", at, 30 * day},
		{"1-5/2 0-23/6 1,15 JAN-DEC/3 MON-FRI", "UTC", at, 90 * day},
		{"0 0 ? * SUN", "UTC", at, 8 * day},
		{"@every 1h", "UTC", at, day},
		{"TZ=Europe/Paris 0 * * * *", "", at, day},
		{"CRON_TZ=x", "", at, day},
		{"0 0 * * *", "Local", at, day},
		{"0 0 * * *", "Mars/Olympus", at, day},
		{"0 0 * * *", "../../etc/passwd", at, day},
		{"60 * * * *", "UTC", at, day},
		{"*/0 * * * *", "UTC", at, day},
		{"5-1 * * * *", "UTC", at, day},
		{"* * * * * * *", "UTC", at, day},
		{"@", "UTC", at, day},
		{"", "UTC", at, day},
	} {
		f.Add(s.spec, s.zone, s.at, s.span)
	}
	f.Fuzz(func(t *testing.T, spec, zone string, atNanos, spanNanos int64) {
		s, err := config.ParseSchedule(spec, zone)
		if _, errAgain := config.ParseSchedule(spec, zone); (err == nil) != (errAgain == nil) {
			t.Fatalf("parsed twice: %v, then %v", err, errAgain)
		}
		if err != nil {
			if s != nil || err.Error() == "" {
				t.Fatalf("ParseSchedule = %+v, %q: want nil and a message", s, err)
			}
			return
		}
		wantZone := zone
		if zone == "" {
			wantZone = "UTC"
		}
		if s.Spec != spec || s.Zone != wantZone {
			t.Fatalf("ParseSchedule(%q, %q) = %q in %q", spec, zone, s.Spec, s.Zone)
		}
		// Supervisors on hosts in different zones agree on the ticks.
		if loc, err := time.LoadLocation(s.Zone); err != nil || loc == time.Local {
			t.Fatalf("ParseSchedule(%q, %q): the zone is the host's, or none: %v", spec, zone, err)
		}
		// Ticks are asked for around the database's clock: the years the
		// int64 nanoseconds cover from 1973 to 2262 are plenty. Before
		// 1973 some zones' offsets had seconds (Asia/Kolkata's +05:21:10
		// in 1900), which the cron library's minute arithmetic does not
		// keep: "0 * 1 1 0" there skipped a tick in 1900, a time no
		// supervisor asks about.
		from := time.Unix(0, atNanos).UTC()
		if from.Year() < 1973 {
			return
		}
		next := s.Next(from)
		if !next.IsZero() {
			if !next.After(from) {
				t.Fatalf("%q in %s: Next(%v) = %v, not after", spec, s.Zone, from, next)
			}
			if next.Year() > from.Year()+6 {
				t.Fatalf("%q in %s: Next(%v) = %v, past the five years searched", spec, s.Zone, from, next)
			}
			// No tick is skipped: from anywhere before it, the next tick is
			// this one.
			if mid := from.Add(next.Sub(from) / 2); !s.Next(mid).Equal(next) {
				t.Fatalf("%q in %s: Next(%v) = %v, but Next(%v) = %v", spec, s.Zone, from, next, mid, s.Next(mid))
			}
		}
		// Latest over a gap of up to ten years (the supervisors were down).
		span := time.Duration(spanNanos % int64(10*366*24*time.Hour))
		if span < 0 {
			span = -span
		}
		now := from.Add(span)
		latest := s.Latest(from, now)
		missed := !next.IsZero() && !next.After(now)
		switch {
		case latest.IsZero() && missed:
			t.Fatalf("%q in %s: Latest(%v, %v) = none, but %v is a tick in between", spec, s.Zone, from, now, next)
		case latest.IsZero():
		case !missed:
			t.Fatalf("%q in %s: Latest(%v, %v) = %v, but the first tick after %v is %v", spec, s.Zone, from, now, latest, from, next)
		case !latest.After(from) || latest.After(now):
			t.Fatalf("%q in %s: Latest(%v, %v) = %v, outside", spec, s.Zone, from, now, latest)
		default:
			if n := s.Next(latest); !n.IsZero() && !n.After(now) {
				t.Fatalf("%q in %s: Latest(%v, %v) = %v, but %v is a later tick", spec, s.Zone, from, now, latest, n)
			}
		}
	})
}
