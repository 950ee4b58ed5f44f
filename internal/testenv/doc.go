// Package testenv is test support shared by every package's tests: it finds
// a Consul binary and runs real Consul agents bound to 127.0.0.1 only, on
// free ports, owned by the test that started them; it also finds the
// HAProxy 3.0 build the end-to-end tests run beside Debian's 2.6.
//
// Tests never skip for want of Consul or HAProxy: without a binary they
// fail and say how to get one (`make test`, `scripts/ensure-consul.sh` or
// `scripts/ensure-haproxy3.sh`).
package testenv
