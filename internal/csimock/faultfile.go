package csimock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"sigs.k8s.io/yaml"
)

// ruleWire is the file and HTTP form of a Rule: latency as a Go duration
// string ("250ms") and the code by name ("DeadlineExceeded" or
// "DEADLINE_EXCEEDED") or number.
type ruleWire struct {
	ruleAlias
	Latency string          `json:"latency,omitempty"`
	Code    json.RawMessage `json:"code,omitempty"`
}

// ruleAlias drops Rule's methods so ruleWire does not recurse.
type ruleAlias Rule

func (r Rule) wire() ruleWire {
	w := ruleWire{ruleAlias: ruleAlias(r)}
	if r.Latency > 0 {
		w.Latency = r.Latency.String()
	}
	if r.Code != codes.OK {
		w.Code, _ = json.Marshal(r.Code.String())
	}
	return w
}

// MarshalJSON writes the wire form.
func (r Rule) MarshalJSON() ([]byte, error) {
	return json.Marshal(r.wire())
}

// MarshalJSON writes the rule's wire form plus its counters (without it the
// embedded Rule's MarshalJSON would hide them).
func (s RuleStatus) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ruleWire
		Matched int64 `json:"matched"`
		Fired   int64 `json:"fired"`
	}{s.Rule.wire(), s.Matched, s.Fired})
}

// UnmarshalJSON reads the wire form. Unknown fields are rejected by the
// decoders in this package (see ParseRules), so typos fail loudly.
func (r *Rule) UnmarshalJSON(b []byte) error {
	var w ruleWire
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return err
	}
	*r = Rule(w.ruleAlias)
	if w.Latency != "" {
		d, err := time.ParseDuration(w.Latency)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		r.Latency = d
	}
	if len(w.Code) > 0 {
		c, err := parseCode(w.Code)
		if err != nil {
			return err
		}
		r.Code = c
	}
	return nil
}

// parseCode accepts 4, "4", "DeadlineExceeded" and "DEADLINE_EXCEEDED".
func parseCode(raw json.RawMessage) (codes.Code, error) {
	var n uint32
	if err := json.Unmarshal(raw, &n); err == nil {
		return codes.Code(n), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, fmt.Errorf("code must be a string or number: %w", err)
	}
	return ParseCode(s)
}

// ParseCode parses a gRPC code name in either spelling, or its number.
func ParseCode(s string) (codes.Code, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return codes.Code(n), nil
	}
	want := strings.ReplaceAll(strings.ToLower(s), "_", "")
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if strings.ToLower(c.String()) == want {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown gRPC code %q", s)
}

// faultFile is the top-level form of a fault config file.
type faultFile struct {
	Rules []Rule `json:"rules"`
}

// ParseRules reads fault rules from JSON or YAML: either an object with a
// "rules" list or a bare list. The rules are validated.
func ParseRules(data []byte) ([]Rule, error) {
	js, err := yaml.YAMLToJSON(data) // JSON is YAML, so this covers both.
	if err != nil {
		return nil, fmt.Errorf("parse fault rules: %w", err)
	}
	js = bytes.TrimSpace(js)
	var rules []Rule
	if len(js) > 0 && js[0] == '[' {
		err = strictUnmarshal(js, &rules)
	} else {
		var f faultFile
		err = strictUnmarshal(js, &f)
		rules = f.Rules
	}
	if err != nil {
		return nil, fmt.Errorf("parse fault rules: %w", err)
	}
	for i := range rules {
		if err := rules[i].validate(); err != nil {
			return nil, fmt.Errorf("fault rule %d: %w", i, err)
		}
	}
	return rules, nil
}

// LoadRules reads a fault config file (see ParseRules).
func LoadRules(path string) ([]Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fault rules: %w", err)
	}
	rules, err := ParseRules(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rules, nil
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
