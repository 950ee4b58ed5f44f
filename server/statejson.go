package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/hastate/hastate/api"
)

// The /v1/state body of a big fleet is the largest answer a replica gives
// (10,000 rows are about 6 MB), and the agent shares the replica's CPU
// with whoever asks for it. writeStateView writes exactly what writeJSON
// would (encoding/json, indented by two spaces: TestStateViewJSONIsWriteJSONs
// compares them byte for byte), but its rows through api.AppendRowJSON, which
// knows api.ServerState's fields: no reflection and no second pass to
// indent, about a sixth of encoding/json's CPU (BenchmarkStateViewJSON), and it
// yields to the agent now and then (yield.go). `hastate status -o json`
// writes its rows with the same function.

// writeStateView writes v as the body of a 200 answer.
func writeStateView(w http.ResponseWriter, v api.StateView) {
	rows := v.Servers
	if len(rows) == 0 {
		writeJSON(w, http.StatusOK, v)
		return
	}
	v.Servers = []api.ServerState{}
	var head bytes.Buffer
	enc := json.NewEncoder(&head)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	// "servers" is the third field, after a string and a bool: its
	// empty list is the first line of this form.
	const list = "\n  \"servers\": ["
	at := bytes.Index(head.Bytes(), []byte(list+"]"))
	if at < 0 {
		v.Servers = rows
		writeJSON(w, http.StatusOK, v) // not that form: encoding/json alone
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	_, _ = bw.Write(head.Bytes()[:at+len(list)])
	buf := make([]byte, 0, 2048)
	var yield yielder
	for i := range rows {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, "\n    "...)
		buf = api.AppendRowJSON(buf, &rows[i], 2)
		_, _ = bw.Write(buf)
		yield.step()
	}
	_, _ = bw.WriteString("\n  ]")
	_, _ = bw.Write(head.Bytes()[at+len(list)+1:])
	_ = bw.Flush()
}
