// Package livetest opens the sidecar's admin pages in a real browser and
// checks what a person would see. It holds tests only, in a Go module of
// its own, so that the browser driver (github.com/chromedp/chromedp,
// pinned in go.mod) is no dependency of the sidecar.
//
// The browser is Debian's chromium (/usr/bin/chromium, installed by
// scripts/install-test-tools.sh), headless, driven over the DevTools
// protocol; a missing chromium skips the tests, or fails them with
// CI=true (internal/testtool.Need). The sidecar runs in the test's
// process (app.Run), on free 127.0.0.1 ports, in front of a scripted
// engine on another: nothing leaves 127.0.0.1.
//
// TestLivePageInBrowser: /live loads with no console error or uncaught
// exception; it draws one strip per request the test sent (their count);
// the two stalls the scripted engine makes in one stream appear as the
// strip's stall bands where the record puts them, within a pixel
// tolerance derived from the axis (the axis computed here from the
// records, independently of the page, compared with the bands' rendered
// geometry); a request that finishes later appears without a reload; and
// a screenshot is written. /slo, /probes and the index / render with no
// console error, and every link to the admin port on them answers 200.
//
// TestFirstRunInBrowser: the first run (the built-in simulator, no
// configuration) shows at least 10 strips on /live within 30 s, and every
// page's synthetic banner.
//
// Screenshots go to $TOKENTAP_ARTIFACTS/livetest/ (scripts/test.sh sets
// TOKENTAP_ARTIFACTS to artifacts/ at the repository's root, which CI
// keeps), or to the test's temporary folder when it is unset; each path
// is logged.
package livetest
