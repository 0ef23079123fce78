//go:build unix

package main

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// httpClient is every plain HTTP call of the demo: to fencestore, and to
// the servers' health endpoints while they start.
var httpClient = &http.Client{Timeout: 10 * time.Second}

// objectURL is fencestore's URL of object key.
func objectURL(base, key string) string {
	return strings.TrimRight(base, "/") + "/v1/objects/" + url.PathEscape(key)
}

// readBody reads at most 64 KiB of a reply's body.
func readBody(resp *http.Response) (string, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return string(b), err
}
