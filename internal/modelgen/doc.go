// Package modelgen builds large synthetic models for benchmarks and load
// tests: many endpoints, each splitting traffic over its own backends.
package modelgen
