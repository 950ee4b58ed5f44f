package server

import (
	"io"
	"strconv"
)

// The status page's table is most of its bytes (1,000 rows by default,
// up to api.MaxLimit) and was most of its CPU when html/template, whose
// field look-ups are reflection, rendered it. writeRows writes it by hand,
// escaping every value as html/template escapes it in element text and in
// quoted attributes (htmlEscape); TestPageRowsAreTheTemplates compares it
// byte for byte with the template it replaced (testdata/page-rows.tmpl),
// on random rows. Change the markup in both.

// writeRows writes the backends' table bodies to w, a row at a time
// through one buffer, yielding (yield.go).
func writeRows(w io.Writer, backends []pageBackend) {
	b := make([]byte, 0, 4096)
	var yield yielder
	for i := range backends {
		be := &backends[i]
		b = appendBackendHead(b, be)
		for j := range be.Rows {
			b = appendPageRow(b, &be.Rows[j])
			_, _ = w.Write(b)
			b = b[:0]
			yield.step()
		}
		b = append(b, "</tbody>\n"...)
	}
	_, _ = w.Write(b)
}

// appendBackendHead appends the start of one backend's <tbody>: its
// summary line.
func appendBackendHead(b []byte, be *pageBackend) []byte {
	b = append(b, `<tbody class="backend `...)
	b = htmlEscape(b, be.Class)
	b = append(b, `" data-backend="`...)
	b = htmlEscape(b, be.Name)
	b = append(b, "\">\n<tr class=\"group\"><th colspan=\"9\"><span class=\"bname\">"...)
	b = htmlEscape(b, be.Name)
	b = append(b, `</span>`...)
	for _, c := range be.Summary {
		b = append(b, `<span class="cnt `...)
		b = htmlEscape(b, c.Class)
		b = append(b, `">`...)
		b = htmlEscape(b, c.Text)
		b = append(b, `</span>`...)
	}
	return append(b, "</th></tr>\n"...)
}

// appendPageRow appends one server's <tr>.
func appendPageRow(b []byte, r *pageRow) []byte {
	b = append(b, `<tr class="row `...)
	b = htmlEscape(b, r.Class)
	b = append(b, `" data-server="`...)
	b = htmlEscape(b, r.Backend)
	b = append(b, '/')
	b = htmlEscape(b, r.Server)
	b = append(b, `" data-text="`...)
	b = htmlEscape(b, r.Text)
	b = append(b, '"')
	if r.Problem {
		b = append(b, ` data-problem`...)
	}
	b = append(b, ">\n<td><span class=\"srv\">"...)
	if r.Wildcard {
		b = htmlEscape(b, r.Backend)
		b = append(b, `/*<span class="wild">backend-wide key: servers without their own</span>`...)
	} else {
		b = htmlEscape(b, r.Server)
	}
	b = append(b, "</span></td>\n<td data-label=\"state\"><span class=\"badge\">"...)
	b = htmlEscape(b, r.Label)
	b = append(b, `</span>`...)
	if r.Expired != "" {
		b = append(b, `<span class="tag" title="`...)
		b = htmlEscape(b, r.Expired)
		b = append(b, ` expired: treated as absent; hastate clear --expired removes it">expired</span>`...)
	}
	if !r.Valid {
		b = append(b, `<span class="tag">invalid</span>`...)
	}
	b = append(b, "\n<div class=\"sub\">"...)
	if r.Withheld {
		b = append(b, `answers nothing`...)
	} else {
		b = htmlEscape(b, r.Answer)
	}
	b = append(b, "</div></td>\n<td data-label=\"weight / ramp\" class=\"t"...)
	if !r.HasWeight {
		b = append(b, ` empty`...)
	}
	b = append(b, `">`...)
	if r.HasWeight {
		b = append(b, `<span class="bar`...)
		if r.Over {
			b = append(b, ` over`...)
		}
		b = append(b, `" title="weight `...)
		b = strconv.AppendInt(b, int64(r.Weight), 10)
		b = append(b, `%"><span style="width:`...)
		b = strconv.AppendInt(b, int64(r.BarPct), 10)
		b = append(b, `%"></span></span>`...)
		b = strconv.AppendInt(b, int64(r.Weight), 10)
		b = append(b, '%')
	}
	b = append(b, '\n')
	if p := r.Ramping; p != nil {
		b = append(b, `<div><span class="bar ramp" title="ramp `...)
		b = strconv.AppendInt(b, int64(r.RampPct), 10)
		b = append(b, `% done: `...)
		b = htmlEscape(b, p.Duration)
		b = append(b, ` in steps of `...)
		b = htmlEscape(b, p.Interval)
		b = append(b, `, started `...)
		b = p.Started.UTC().AppendFormat(b, "15:04:05")
		b = append(b, ` UTC"><span style="width:`...)
		b = strconv.AppendInt(b, int64(r.RampPct), 10)
		b = append(b, `%"></span></span><span class="sub" title="ETA `...)
		b = htmlEscape(b, r.RampETAAt)
		b = append(b, `">→ 100% `...)
		b = htmlEscape(b, r.RampETA)
		b = append(b, `</span></div>`...)
	}
	b = append(b, "</td>\n<td data-label=\"since\" class=\"t"...)
	if r.Since == "" {
		b = append(b, ` empty">`+`<span class="sub">-</span>`...)
	} else {
		b = append(b, `"><span title="`...)
		b = htmlEscape(b, r.SinceAt)
		b = append(b, `">`...)
		b = htmlEscape(b, r.Since)
		b = append(b, `</span>`...)
	}
	b = append(b, "</td>\n<td data-label=\"expires\" class=\"t"...)
	if r.Until == "" && r.Expired == "" {
		b = append(b, ` empty`...)
	}
	b = append(b, `">`...)
	switch {
	case r.Expired != "":
		b = append(b, `<span class="past" title="`...)
		b = htmlEscape(b, r.Expired)
		b = append(b, ` expired: treated as absent until it changes; hastate clear --expired removes it">expired</span>`...)
	case r.Until != "":
		b = append(b, `<span title="`...)
		b = htmlEscape(b, r.UntilAt)
		b = append(b, '"')
		if r.UntilPast {
			b = append(b, ` class="past">expired `...)
		} else {
			b = append(b, '>')
		}
		b = htmlEscape(b, r.Until)
		b = append(b, `</span>`...)
	}
	b = append(b, "</td>\n<td data-label=\"reason\" class=\"reason wide"...)
	if r.Reason == "" && r.Error == "" && r.Note == "" {
		b = append(b, ` empty`...)
	}
	b = append(b, `">`...)
	b = htmlEscape(b, r.Reason)
	if r.Error != "" {
		b = append(b, `<div class="err">`...)
		b = htmlEscape(b, r.Error)
		b = append(b, `</div>`...)
	}
	if r.Note != "" {
		b = append(b, `<div class="sub">`...)
		b = htmlEscape(b, r.Note)
		b = append(b, `</div>`...)
	}
	b = append(b, "</td>\n<td data-label=\"by\" class=\"by"...)
	if r.By == "" {
		b = append(b, ` empty`...)
	}
	b = append(b, `">`...)
	b = htmlEscape(b, r.By)
	b = append(b, "</td>\n<td data-label=\"HAProxy\" class=\"t\"><span class=\"told "...)
	b = htmlEscape(b, r.ToldClass)
	b = append(b, `" title="`...)
	b = htmlEscape(b, r.ToldTitle)
	b = append(b, `">`...)
	b = htmlEscape(b, r.Told)
	b = append(b, "</span></td>\n<td data-label=\"key\" class=\"key wide\""...)
	if r.Value != "" {
		b = append(b, ` title="`...)
		b = htmlEscape(b, r.Value)
		b = append(b, '"')
	}
	b = append(b, '>')
	if r.Key != "" {
		b = htmlEscape(b, r.Key)
		if r.ShortValue != "" {
			b = append(b, ` = `...)
			b = htmlEscape(b, r.ShortValue)
		}
	} else {
		b = htmlEscape(b, r.Source)
	}
	return append(b, "</td>\n</tr>\n"...)
}

// htmlEscape appends s escaped as html/template escapes a value in element
// text and in a quoted attribute (its htmlReplacementTable): NUL becomes
// U+FFFD and " & ' + < > character references; every other byte is
// copied (none of these is part of a multi-byte UTF-8 sequence).
func htmlEscape(b []byte, s string) []byte {
	done := 0
	for i := 0; i < len(s); i++ {
		var rep string
		switch s[i] {
		case 0:
			rep = "\uFFFD"
		case '"':
			rep = "&#34;"
		case '&':
			rep = "&amp;"
		case '\'':
			rep = "&#39;"
		case '+':
			rep = "&#43;"
		case '<':
			rep = "&lt;"
		case '>':
			rep = "&gt;"
		default:
			continue
		}
		b = append(b, s[done:i]...)
		b = append(b, rep...)
		done = i + 1
	}
	return append(b, s[done:]...)
}
