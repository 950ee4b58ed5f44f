// Package browser renders hastate's status page in a real headless
// Chromium (Debian's chromium, driven with chromedp) against a running
// hastate and a real Consul: the states look different, the Consul banner
// comes when Consul stops, nothing fails to load, and the screenshots are
// kept as artifacts. It is its own module so that chromedp stays out of
// the service's go.mod.
package browser
