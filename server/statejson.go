package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"time"

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
	rows, empty := v.Servers, v
	empty.Servers = []api.ServerState{}
	writeIndentedList(w, func() any { return v }, empty, stateList, len(rows), func(b []byte, i int) []byte {
		return api.AppendRowJSON(b, &rows[i], 2)
	})
}

// stateList is where a view's rows go: "servers" is the third field,
// after a string and a bool, and its empty list is the first line of
// this form.
const stateList = "\n  \"servers\": ["

// writeStateRows writes v with the rows that rows makes (v's own, empty,
// are not written) as writeStateView writes v with them: each row is
// made, written and dropped before the next is made, so that a view of
// 10,000 servers is not first 4 MB of rows.
func writeStateRows(w http.ResponseWriter, v api.StateView, rows *viewRows) {
	var since [1]time.Time // the row's since (rowIn), for the row only
	writeIndentedList(w, func() any { return rows.all(v) }, v, stateList, rows.len(), func(b []byte, _ int) []byte {
		sinces := since[:0]
		row := rows.next(&sinces)
		return api.AppendRowJSON(b, &row, 2)
	})
}

// writeIndentedList writes full() as the body of a 200 answer, as
// writeJSON writes it: empty (full() with its list of n rows empty) as
// writeJSON writes it, with the rows spliced in where the first "list]"
// stands (list: the list's field, `\n  "name": [`), each appended by row
// at depth 2, in their order (i from 0 to n-1). A view without rows, or
// whose empty form holds no such line, is written by writeJSON alone,
// and full is called only then.
func writeIndentedList(w http.ResponseWriter, full func() any, empty any, list string, n int, row func(b []byte, i int) []byte) {
	var head bytes.Buffer
	at := -1
	if n > 0 {
		enc := json.NewEncoder(&head)
		enc.SetIndent("", "  ")
		_ = enc.Encode(empty)
		at = bytes.Index(head.Bytes(), []byte(list+"]"))
	}
	if at < 0 {
		writeJSON(w, http.StatusOK, full())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	_, _ = bw.Write(head.Bytes()[:at+len(list)])
	buf := make([]byte, 0, 2048)
	var yield yielder
	for i := range n {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, "\n    "...)
		buf = row(buf, i)
		_, _ = bw.Write(buf)
		yield.step()
	}
	_, _ = bw.WriteString("\n  ]")
	_, _ = bw.Write(head.Bytes()[at+len(list)+1:])
	_ = bw.Flush()
}
