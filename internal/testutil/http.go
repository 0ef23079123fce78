package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// Reply is a decoded JSON reply.
type Reply struct {
	Status int
	Body   map[string]any
	Raw    string
}

// Str returns a string field of the body.
func (r Reply) Str(key string) string {
	s, _ := r.Body[key].(string)
	return s
}

// Uint returns a numeric field of the body.
func (r Reply) Uint(key string) uint64 {
	f, _ := r.Body[key].(float64)
	return uint64(f)
}

// Code returns error.code of the body.
func (r Reply) Code() string {
	if e, ok := r.Body["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

// Call sends a JSON request (following 307 redirects with the body) and
// decodes the JSON reply. A transport error gives Status 0.
func Call(ctx context.Context, method, url string, body any) Reply {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Reply{Raw: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return Reply{Raw: err.Error()}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := Reply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// Post is Call with POST and a background context.
func Post(url string, body any) Reply { return Call(context.Background(), http.MethodPost, url, body) }

// Get is Call with GET.
func Get(url string) Reply { return Call(context.Background(), http.MethodGet, url, nil) }
