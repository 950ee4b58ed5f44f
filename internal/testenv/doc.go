// Package testenv is test support shared by every package's tests: it finds
// a Consul binary and runs real Consul agents bound to 127.0.0.1 only, on
// free ports, owned by the test that started them.
//
// Tests never skip for want of Consul: without a binary they fail and say
// how to get one (`make test` or `scripts/ensure-consul.sh`).
package testenv
