package server

// This file holds POST /v1/consul/adopt: the operator's "this Consul was
// restored (or rebuilt); mirror it from now on" (hastate adopt-consul).

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/hastate/hastate/api"
)

// Adopter records the Consul cluster the raft leader reads as the mirror's
// source in place of the recorded one. confirm is the cluster ID (or, for
// a Consul that says none, its servers) the operator saw and confirms.
// The wiring implements it; errors are *api.AdoptError.
type Adopter interface {
	AdoptConsul(ctx context.Context, confirm string) (api.AdoptResult, error)
}

// adoptTimeout bounds an adoption: reading the leader's Consul identity
// and committing one raft entry.
const adoptTimeout = 10 * time.Second

func adoptHandler(a Adopter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.AdoptRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil || req.Cluster == "" {
			writeJSON(w, http.StatusBadRequest, api.AdoptError{Code: http.StatusBadRequest,
				Message: `send {"cluster":"<cluster ID>"}: the ID of the Consul cluster to adopt, as /v1/cluster consul.cluster_id shows it (or its servers, for a Consul without Connect)`})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), adoptTimeout)
		defer cancel()
		res, err := a.AdoptConsul(ctx, req.Cluster)
		var ae *api.AdoptError
		switch {
		case errors.As(err, &ae):
			writeJSON(w, ae.Code, ae)
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, api.AdoptError{Code: http.StatusInternalServerError, Message: err.Error()})
		default:
			writeJSON(w, http.StatusOK, res)
		}
	}
}
