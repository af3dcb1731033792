package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/version"
)

// maxBody bounds request bodies; a GC list of 10,000 pods fits easily.
const maxBody = 8 << 20

// Handler serves the local API.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.PathEndpoints, handle(a.Add))
	mux.HandleFunc("DELETE "+api.PathEndpoints, handle(func(r api.DelRequest) (any, error) { return struct{}{}, a.Del(r) }))
	mux.HandleFunc("PUT "+api.PathEndpoints+"/check", handle(func(r api.CheckRequest) (any, error) { return struct{}{}, a.Check(r) }))
	mux.HandleFunc("POST "+api.PathGC, handle(a.GC))
	mux.HandleFunc("PUT "+api.PathPeers, handle(func(r api.PeersRequest) (any, error) { return struct{}{}, a.SetPeers(r.Peers) }))
	mux.HandleFunc("GET "+api.PathFlows, a.serveFlows)
	mux.HandleFunc("GET "+api.PathTrace, a.serveTrace)
	mux.HandleFunc("GET "+api.PathHealth, serveHealth)
	mux.Handle("GET "+PathMetrics, a.metrics.handler())
	mux.HandleFunc("GET "+api.PathServices, func(w http.ResponseWriter, _ *http.Request) {
		l, err := a.ServiceList()
		if err != nil {
			writeError(w, api.Errorf(api.CodeDatapath, "read service maps", err))
			return
		}
		writeJSON(w, http.StatusOK, l)
	})
	mux.HandleFunc("GET "+api.PathVersion, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, version.Get())
	})
	mux.HandleFunc("GET "+api.PathStatus, func(w http.ResponseWriter, _ *http.Request) {
		s, err := a.Status()
		if err != nil {
			writeError(w, api.Errorf(api.CodeDatapath, "read status", err))
			return
		}
		writeJSON(w, http.StatusOK, s)
	})
	// Profiles, as Cilium's agent offers them: the socket is root's
	// alone, and a slow policy change is best explained by one.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// HealthHandler answers the health check alone: what the agent serves
// on cfg.HealthAddr, where anyone on the node can connect.
func (a *Agent) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.PathHealth, serveHealth)
	return mux
}

// serveHealth answers once the agent serves: it listens only after its
// datapath is set up and, with Kubernetes, after it learned its node.
func serveHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"ready": true})
}

// handle decodes a JSON request of type Req, calls f and encodes its answer.
func handle[Req, Resp any](f func(Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, api.Errorf(api.CodeDecodeFailure, "decode request", err))
			return
		}
		resp, err := f(req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

func writeError(w http.ResponseWriter, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		e = api.Errorf(api.CodeIOFailure, "internal error", err)
	}
	status := http.StatusInternalServerError
	switch e.Code {
	case api.CodeInvalidEnv, api.CodeDecodeFailure, api.CodeInvalidConfig:
		status = http.StatusBadRequest
	case api.CodeUnknownContainer:
		status = http.StatusNotFound
	case api.CodeAttachmentInUse, api.CodeInterfaceExists:
		status = http.StatusConflict
	case api.CodePoolExhausted:
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		fmt.Println("weir-agent: write response:", err)
	}
}

// lineEncoder writes JSON values one per line, flushing on request so a
// followed stream is seen as it happens.
type lineEncoder struct {
	w   http.ResponseWriter
	enc *json.Encoder
}

func newLineEncoder(w http.ResponseWriter) lineEncoder {
	return lineEncoder{w: w, enc: json.NewEncoder(w)}
}

func (e lineEncoder) encode(v any) error { return e.enc.Encode(v) }

func (e lineEncoder) flush() {
	if f, ok := e.w.(http.Flusher); ok {
		f.Flush()
	}
}
