// stream.go - streaming through a channel, the alternative to Generate/Chat's callback.
// The call runs on its own goroutine; each event is sent on an unbuffered channel, so the
// model is never more than one token ahead of the reader. Cancelling the context stops
// generation at the next token (the result then has StopCancelled), which is also how a
// reader that stops early releases the goroutine.
package gptoss

import "context"

// Stream delivers the events of one call and then its result.
type Stream[R any] struct {
	Events <-chan Event // closed when the call returns
	done   chan struct{}
	result R
	err    error
}

// Wait blocks until the call has returned and gives its result. Cancel the context passed to
// GenerateStream/ChatStream first if the events are not read to the end.
func (s *Stream[R]) Wait() (R, error) {
	<-s.done
	return s.result, s.err
}

func startStream[R any](ctx context.Context, run func(func(Event) bool) (R, error)) *Stream[R] {
	events := make(chan Event)
	s := &Stream[R]{Events: events, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(events)
		s.result, s.err = run(func(e Event) bool {
			select {
			case events <- e:
				return true
			case <-ctx.Done():
				return false
			}
		})
	}()
	return s
}

// GenerateStream is Generate with the events delivered on a channel.
func (s *Session) GenerateStream(ctx context.Context, prompt []int32, sampling Sampling) *Stream[*GenerateResult] {
	return startStream(ctx, func(on func(Event) bool) (*GenerateResult, error) {
		return s.Generate(prompt, sampling, on)
	})
}

// ChatStream is Chat with the events delivered on a channel.
func (s *Session) ChatStream(ctx context.Context, req *ChatRequest, sampling Sampling) *Stream[*ChatResult] {
	return startStream(ctx, func(on func(Event) bool) (*ChatResult, error) {
		return s.Chat(req, sampling, on)
	})
}
