// Package testenv gives dama's tests what they run against:
//
//   - a database per test, a copy of a migrated template (Main makes it
//     once per test binary) on the server named by TEST_DATABASE_URL, or
//     a server of the test's own that it may stop, restart, fail over or
//     silence (NewServer);
//   - the binaries, built once per test binary or once per run
//     (DAMA_TEST_BIN_DIR, which scripts/test.sh sets);
//   - the lock-mode matrix (LockModes): a test whose behaviour depends on
//     how a task process holds its lock runs once per mode, in parallel;
//   - the guarantee that every process a test started, directly or
//     through a supervisor, is killed when the test ends;
//   - network faults: TCP connections that go silent without a reset.
package testenv
