// callbacks.go - the Go functions C calls back (exported through cgo). A file with //export
// may only declare in its preamble, so the trampolines that call these live in shim.c.
// user_data is a cgo.Handle to the Go state; a panic in user code is recovered here, stops the
// C call (the callback returns false), and is re-raised once the C call has returned, because
// unwinding through the library's C/C++ frames would skip its cleanup.
package gptoss

/*
#include "shim.h"
*/
import "C"

import "runtime/cgo"

type progressState struct {
	fn    func(fraction float32) bool
	panic interface{}
}

type eventState struct {
	fn    func(Event) bool
	panic interface{}
}

//export goProgress
func goProgress(handle C.uintptr_t, fraction C.float) (goOn C.bool) {
	st := cgo.Handle(handle).Value().(*progressState)
	if st.panic != nil {
		return false
	}
	defer func() {
		if p := recover(); p != nil {
			st.panic = p
			goOn = false
		}
	}()
	return C.bool(st.fn(float32(fraction)))
}

//export goEvent
func goEvent(handle C.uintptr_t, ev *C.gptoss_event) (goOn C.bool) {
	st := cgo.Handle(handle).Value().(*eventState)
	if st.panic != nil || ev == nil {
		return false
	}
	defer func() {
		if p := recover(); p != nil {
			st.panic = p
			goOn = false
		}
	}()
	event := Event{Token: int32(ev.token), Channel: Channel(ev.channel)}
	if ev.text_len > 0 {
		event.Text = C.GoStringN(ev.text, C.int(ev.text_len))
	}
	if ev.recipient != nil {
		event.Recipient = C.GoString(ev.recipient)
	}
	return C.bool(st.fn(event))
}
