package main

import "testing"

func TestOnlyAVerifiedOrAddressedServerIsSurelyTheDatabase(t *testing.T) {
	for url, want := range map[string]bool{
		"postgres://etl@db.example/etl?sslmode=disable":                  false,
		"postgres://etl@db.example/etl?sslmode=require":                  false,
		"postgres://etl@db.example/etl?sslmode=prefer":                   false,
		"postgres://etl@db.example/etl":                                  false,
		"postgres://etl@db.example/etl?sslmode=verify-full":              true,
		"postgres://etl@10.0.0.7:5432/etl?sslmode=disable":               true,
		"postgres://etl@[fd00::7]:5432/etl":                              true,
		"postgres://etl@10.0.0.7,db.example/etl?sslmode=disable":         false,
		"host=/var/run/postgresql dbname=etl":                            true,
		"host=db.example dbname=etl sslmode=verify-full":                 true,
		"postgres://etl@db.example/etl?sslmode=verify-full&sslrootcert=": true,
	} {
		if got := surelyTheServer(url); got != want {
			t.Errorf("%s: %t, want %t", url, got, want)
		}
	}
}
