package csimock

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"sigs.k8s.io/yaml"
)

// maxBodyBytes bounds a POST /faults body; rule lists are small.
const maxBodyBytes = 1 << 20

// HTTPHandler serves the driver's observability and control endpoints:
//
//	GET    /calls[?method=M][&endpoint=N]  call log (JSON list); endpoint: the calls node N's endpoint got
//	GET    /stats             counters
//	GET    /state             volumes and publications
//	GET    /faults            fault rules with counters
//	POST   /faults            add rules (one rule, a list, or {"rules": [...]}; JSON or YAML)
//	DELETE /faults            remove every rule
//	DELETE /faults/{id}       remove one rule
//	GET    /backend           the backend model's counters (404 when none is set)
//	PUT    /backend           set the backend model ({"profile": NAME} or every field; JSON or YAML)
//	DELETE /backend           remove the backend model (calls answer at once)
//	POST   /ready?ready=B     override Probe readiness
//	POST   /crash?keepState=B crash the gRPC server (see Crash)
//	POST   /restart           serve again after a crash
//
// It has no authentication: bind it to loopback only.
func (d *Driver) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, r *http.Request) {
		calls := d.Calls()
		if m := r.URL.Query().Get("method"); m != "" {
			calls = d.CallsTo(m)
		}
		if n := r.URL.Query().Get("endpoint"); n != "" {
			var mine []Call
			for _, c := range calls {
				if c.Endpoint == n {
					mine = append(mine, c)
				}
			}
			calls = mine
		}
		writeJSON(w, http.StatusOK, nonNil(calls))
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.Stats())
	})
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.State())
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.Faults())
	})
	mux.HandleFunc("POST /faults", d.handleAddFaults)
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) {
		d.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /faults/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !d.RemoveFault(r.PathValue("id")) {
			writeError(w, http.StatusNotFound, fmt.Errorf("no fault rule %q", r.PathValue("id")))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /backend", func(w http.ResponseWriter, r *http.Request) {
		b, ok := d.BackendStats()
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Errorf("no backend model is set"))
			return
		}
		writeJSON(w, http.StatusOK, b)
	})
	mux.HandleFunc("PUT /backend", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		b, err := ParseBackend(body)
		if err == nil {
			err = d.SetBackend(&b)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /backend", func(w http.ResponseWriter, r *http.Request) {
		_ = d.SetBackend(nil)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /ready", withBoolParam("ready", true, func(w http.ResponseWriter, ready bool) {
		d.SetReady(ready)
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /crash", withBoolParam("keepState", true, func(w http.ResponseWriter, keep bool) {
		writeDone(w, http.StatusConflict, d.Crash(keep))
	}))
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		writeDone(w, http.StatusConflict, d.Restart())
	})
	return mux
}

func (d *Driver) handleAddFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	rules, err := parseRulesBody(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	ids := make([]string, 0, len(rules))
	for _, rule := range rules {
		id, err := d.AddFault(rule)
		if err != nil {
			// Earlier rules of this request stay installed; report which.
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": err.Error(), "ids": ids})
			return
		}
		ids = append(ids, id)
	}
	writeJSON(w, http.StatusCreated, map[string]any{"ids": ids})
}

// parseRulesBody accepts what a fault file holds, or a single rule.
func parseRulesBody(body []byte) ([]Rule, error) {
	var probe map[string]json.RawMessage
	js, err := yaml.YAMLToJSON(body)
	if err != nil {
		return nil, fmt.Errorf("parse fault rules: %w", err)
	}
	if json.Unmarshal(js, &probe) == nil {
		if _, isFile := probe["rules"]; !isFile {
			var r Rule
			if err := json.Unmarshal(js, &r); err != nil {
				return nil, fmt.Errorf("parse fault rule: %w", err)
			}
			if err := r.validate(); err != nil {
				return nil, err
			}
			return []Rule{r}, nil
		}
	}
	return ParseRules(body)
}

// withBoolParam is a handler that hands the boolean query parameter name
// (def when absent) to fn; a value that is no boolean is 400 Bad Request.
func withBoolParam(name string, def bool, fn func(w http.ResponseWriter, v bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := boolParam(r, name, def)
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		fn(w, v)
	}
}

// writeDone answers 204 No Content, or err with the status code.
func writeDone(w http.ResponseWriter, code int, err error) {
	if err != nil {
		writeError(w, code, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func boolParam(r *http.Request, name string, def bool) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query parameter %s: %w", name, err)
	}
	return b, nil
}

func nonNil(c []Call) []Call {
	if c == nil {
		return []Call{}
	}
	return c
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing useful to do
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
