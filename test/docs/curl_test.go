// Package docs checks the examples in the repository's Markdown files.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// curlCommand is one curl example and where it is.
type curlCommand struct {
	where string // file:line
	args  []string
}

// curlExamples finds the curl commands of a Markdown text: in fenced code
// blocks (a line ending in \ continues on the next) and in inline code.
func curlExamples(file, text string) []curlCommand {
	var out []curlCommand
	add := func(line int, cmd string) {
		for _, seg := range regexp.MustCompile(`(?:^|[|;&(]\s*|\$\(\s*)curl\s`).FindAllStringIndex(cmd, -1) {
			start := strings.Index(cmd[seg[0]:seg[1]], "curl") + seg[0]
			out = append(out, curlCommand{where: file + ":" + strconv.Itoa(line), args: shellWords(cmd[start:])})
		}
	}
	lines := strings.Split(text, "\n")
	inFence := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			start := i
			for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
				i++
				l = strings.TrimSuffix(l, `\`) + " " + lines[i]
			}
			add(start+1, l)
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(l, -1) {
			add(i+1, m[1])
		}
	}
	return out
}

// shellWords splits a command line as sh would (quotes, no expansion); it
// stops at the end of the command (|, ;, &&, a comment).
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				j = len(s) - i - 1
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				cur.WriteByte(s[j])
			}
			i = j
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case (c == '|' || c == ';' || c == '&' || c == '#' || c == ')') && !inWord:
			return words
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// parseCurl reads what matters here from curl's arguments: whether it
// sends a body, the Content-Type it gives, and the URL.
func parseCurl(args []string) (body bool, contentType, url string) {
	for i := 1; i < len(args); i++ {
		a := args[i]
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		header := ""
		switch {
		case a == "--json" || strings.HasPrefix(a, "--json="):
			body, header = true, "Content-Type: application/json"
			if a == "--json" {
				next()
			}
		case a == "-d" || a == "--data" || a == "--data-raw" || a == "--data-binary" || a == "--data-urlencode" ||
			a == "-F" || a == "--form" || a == "-T" || a == "--upload-file":
			body = true
			next()
		case strings.HasPrefix(a, "-d") || strings.HasPrefix(a, "--data") || strings.HasPrefix(a, "-F") || strings.HasPrefix(a, "-T"):
			body = true // -d'{...}', --data=...
		case a == "-H" || a == "--header":
			header = next()
		case strings.HasPrefix(a, "-H"):
			header = a[2:]
		case a == "-X" || a == "-o" || a == "-w" || a == "-u" || a == "--cacert" || a == "--cert" || a == "--key" || a == "-m":
			next()
		case !strings.HasPrefix(a, "-") && url == "":
			url = a
		}
		if k, v, ok := strings.Cut(header, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "Content-Type") && contentType == "" {
			contentType = strings.TrimSpace(v)
		}
	}
	return body, contentType, url
}

// problem says what is wrong with a curl example, or "" when nothing is:
// one that sends a body must say what the body is, and to lockd's API
// (but the restore, which takes the backup's bytes) that it is JSON, or
// lockd answers 400.
func problem(args []string) string {
	body, contentType, url := parseCurl(args)
	switch {
	case !body:
		return ""
	case contentType == "":
		return "sends a body without -H 'Content-Type: application/json'"
	case strings.Contains(url, "/api/v1/") && !strings.Contains(url, "/restore") && !strings.HasPrefix(contentType, "application/json"):
		return "sends lockd's API a body of type " + contentType + ", not application/json"
	}
	return ""
}

// TestCurlExamplesSayJSON: every curl example in the repository's
// Markdown that sends a body carries its Content-Type (lockd answers a
// body without application/json with 400).
func TestCurlExamplesSayJSON(t *testing.T) {
	root := filepath.Join("..", "..")
	withBody := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, c := range curlExamples(rel, string(b)) {
			if p := problem(c.args); p != "" {
				t.Errorf("%s: %s: %s", c.where, p, strings.Join(c.args, " "))
			}
			if body, _, _ := parseCurl(c.args); body {
				withBody++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// README's quick start, cluster and lock kinds examples at least.
	if withBody < 5 {
		t.Fatalf("found %d curl examples that send a body; the extraction missed some", withBody)
	}
	t.Logf("%d curl examples send a body, each with its Content-Type", withBody)
}

// TestCurlExampleChecker: the checker finds and refuses what README had.
func TestCurlExampleChecker(t *testing.T) {
	md := "text `curl -XPOST localhost:7070/api/v1/locks/config/acquire -d '{\"client_id\":\"r1\"}'` text\n" +
		"```sh\ncurl -s -XPOST localhost:7070/api/v1/locks/x/release \\\n     -H 'Content-Type: application/json' -d '{}'\n" +
		"curl -sL localhost:7070/api/v1/cluster | jq .   # no body\n" +
		"curl -X PUT -H \"Content-Type: text/plain\" --data-binary @v http://127.0.0.1:7090/v1/objects/k\n" +
		"curl -XPOST localhost:7070/api/v1/acquire -H 'Content-Type: text/plain' -d '{}'\n" +
		"x=$(curl -s -XPOST localhost:7070/api/v1/sessions --json '{\"client_id\":\"s\"}')\n```\n"
	cmds := curlExamples("t.md", md)
	if len(cmds) != 6 {
		t.Fatalf("found %d commands: %q", len(cmds), cmds)
	}
	want := []bool{true, false, false, false, true, false} // has a problem
	for i, c := range cmds {
		if got := problem(c.args) != ""; got != want[i] {
			t.Errorf("%s %q: problem %q", c.where, c.args, problem(c.args))
		}
	}
	if cmds[1].where != "t.md:3" {
		t.Errorf("a continued command is reported at %s, want its first line t.md:3", cmds[1].where)
	}
}

// TestDocsPointToNoMissingSpec: the Markdown a user reads (all but the test
// suites' notes under test/) never sends a reader to "the SPEC", a document
// the repository does not hold; it says what lockd does instead.
func TestDocsPointToNoMissingSpec(t *testing.T) {
	root := filepath.Join("..", "..")
	spec := regexp.MustCompile(`\bSPEC\b`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || rel == "test") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, l := range strings.Split(string(b), "\n") {
			if spec.MatchString(l) {
				t.Errorf("%s:%d names the SPEC, which is not in the repository: %s", rel, i+1, strings.TrimSpace(l))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
