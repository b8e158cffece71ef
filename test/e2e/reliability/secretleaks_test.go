package reliability_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// secretRun is how many bytes in a row of a secret value count as a leak:
// a log that shows 8 bytes of a password has given most of it away.
const secretRun = 8

// hexDumpLine matches one line of encoding/hex.Dump output (client-go's
// format for a binary body at -v=8 and above): an offset, then up to 16
// bytes as hex pairs with one extra space after the eighth. Not anchored,
// so a dump inside a JSON string ("...\n00000010  ...") matches too.
var hexDumpLine = regexp.MustCompile(`[0-9a-fA-F]{8}  ((?:[0-9a-fA-F]{2}  ?){1,16})`)

// hexDumped returns the bytes of every hex dump in out, concatenated, so a
// run that a dump breaks across two lines is found whole.
func hexDumped(out string) []byte {
	var all []byte
	for _, m := range hexDumpLine.FindAllStringSubmatch(out, -1) {
		b, err := hex.DecodeString(strings.Join(strings.Fields(m[1]), ""))
		if err == nil {
			all = append(all, b...)
		}
	}
	return all
}

// secretLeaks returns one line per way that any secretRun bytes in a row
// of a secret value appear in out: as they are, quoted (Go or JSON), as
// decimal bytes, as hex (either case, with or without spaces, or inside a
// hex dump) and in base64 (standard or URL alphabet, at any alignment).
func secretLeaks(out string, secret map[string][]byte) []string {
	lower := strings.ToLower(out)
	dumped := hexDumped(out)
	var leaks []string
	report := func(key, form, needle string, in string) {
		if i := strings.Index(in, needle); i >= 0 {
			leaks = append(leaks, fmt.Sprintf("%s of key %q as %s at byte %d: ...%s...", needle, key, form, i, out[max(0, i-120):min(len(out), i+len(needle)+40)]))
		}
	}
	keys := make([]string, 0, len(secret))
	for k := range secret {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		v := secret[key]
		if len(v) < secretRun+2 {
			panic(fmt.Sprintf("secret value of %q is too short to test for leaks of %d bytes at every base64 alignment", key, secretRun))
		}
		for i := 0; i+secretRun <= len(v); i++ {
			run := v[i : i+secretRun]
			js, _ := json.Marshal(string(run))
			h := hex.EncodeToString(run)
			spaced := strings.TrimSpace(fmt.Sprintf("% x", run))
			report(key, "plain text", string(run), out)
			report(key, "a Go-quoted string", strings.Trim(strconv.Quote(string(run)), `"`), out)
			report(key, "a JSON string", strings.Trim(string(js), `"`), out)
			report(key, "decimal bytes", strings.Trim(fmt.Sprint(run), "[]"), out)
			report(key, "hex", h, lower)
			report(key, "spaced hex", spaced, lower)
			if bytes.Contains(dumped, run) {
				leaks = append(leaks, fmt.Sprintf("%q of key %q inside a hex dump (%s)", run, key, spaced))
			}
		}
		// base64 turns 3 bytes into 4 characters: whatever the value's
		// offset in the encoded data, every 9 bytes starting on a group
		// boundary show up as the same 12 characters.
		for shift := range 3 {
			for j := shift; j+9 <= len(v); j += 3 {
				for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
					report(key, "base64", enc.EncodeToString(v[j:j+9]), out)
				}
			}
		}
	}
	return leaks
}

// The finder must find what client-go and the log formats would print, or
// the secrets tests prove nothing.
func TestSecretLeakFinderFindsEightBytesInEveryEncoding(t *testing.T) {
	secret := map[string][]byte{"password": []byte("pw-Qx7!vT93-kL0z")}
	body := append([]byte("k8s\x00\x0a\x0csome protobuf header bytes"), []byte("xxxpw-Qx7!vT93-kL0zyyy")...)
	dump := hex.Dump(body)
	jsonDump, _ := json.Marshal(map[string]string{"msg": "Response Body", "body": dump})
	for name, out := range map[string]string{
		"plain":              "password: Qx7!vT93-k",
		"hex dump":           dump,
		"hex dump in JSON":   string(jsonDump),
		"upper hex":          strings.ToUpper(hex.EncodeToString([]byte("7!vT93-kL0"))),
		"spaced hex":         fmt.Sprintf("% x", []byte("x7!vT93-k")),
		"base64 of value":    base64.StdEncoding.EncodeToString([]byte("pw-Qx7!vT93-kL0z")),
		"base64 at offset 1": base64.StdEncoding.EncodeToString([]byte("{pw-Qx7!vT93-kL0z}")),
		"base64 at offset 2": base64.URLEncoding.EncodeToString([]byte("ab" + "pw-Qx7!vT93-kL0z")),
		"decimal bytes":      fmt.Sprint([]byte("Qx7!vT93-kL0z")),
	} {
		if len(secretLeaks(out, secret)) == 0 {
			t.Errorf("%s: no leak found in %q", name, out)
		}
	}
	for _, out := range []string{"pw-Qx7! vT93-kL", "password redacted", hex.Dump([]byte("pw-Qx7!"))} {
		if leaks := secretLeaks(out, secret); len(leaks) != 0 {
			t.Errorf("leak reported in %q, which holds fewer than %d bytes of the secret: %v", out, secretRun, leaks)
		}
	}
}
