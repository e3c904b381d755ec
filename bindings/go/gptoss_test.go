// gptoss_test.go - the Go binding's promises, checked against the C library on the tiny
// synthetic checkpoint (CPU backend). Run by ctest as `go test` with GPTOSS_TINY_MODEL,
// GPTOSS_ABI_DUMP and GPTOSS_GENERATE_REF set and CGO_LDFLAGS pointing at libgptoss.so.
// Oracles: struct layouts from the C compiler (abi-dump), seeded tokens and error texts from a
// C program calling gptoss.h directly (generate-ref), token texts from gptoss_detokenize.
package gptoss

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

const (
	prompt  = "The quick brown fox"
	seed    = 1234
	nTokens = 12
)

const weatherParams = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("%s is not set: run through ctest", name)
	}
	return v
}

func loadTiny(t *testing.T) *Model {
	m, err := Load(env(t, "GPTOSS_TINY_MODEL"), WithDevice(DeviceCPU))
	if err != nil {
		t.Fatalf("load the tiny model: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func newSession(t *testing.T, m *Model, p SessionParams) *Session {
	s, err := m.NewSession(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func sampling(maxTokens uint32) Sampling {
	s := DefaultSampling()
	s.Seed = seed
	s.MaxTokens = maxTokens
	return s
}

// generateRef runs bindings/abi/generate-ref: exit code, stdout lines by first word, stderr.
func generateRef(t *testing.T, args ...string) (int, map[string][]int64, string) {
	cmd := exec.Command(env(t, "GPTOSS_GENERATE_REF"), args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	lines := map[string][]int64{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		var values []int64
		for _, w := range words[1:] {
			v, err := strconv.ParseInt(w, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			values = append(values, v)
		}
		lines[words[0]] = values
	}
	return code, lines, stderr.String()
}

func ints(tokens []int32) []int64 {
	out := make([]int64, len(tokens))
	for i, t := range tokens {
		out[i] = int64(t)
	}
	return out
}

func TestStructLayoutsMatchC(t *testing.T) {
	out, err := exec.Command(env(t, "GPTOSS_ABI_DUMP"), "--text").Output()
	if err != nil {
		t.Fatal(err)
	}
	c := map[string]uintptr{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseUint(line[i+1:], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		c[line[:i]] = uintptr(v)
	}
	if got := structLayouts(); !reflect.DeepEqual(got, c) {
		for k, v := range c {
			if got[k] != v {
				t.Errorf("%s: C %d, cgo %d", k, v, got[k])
			}
		}
		for k := range got {
			if _, ok := c[k]; !ok {
				t.Errorf("%s: not in C", k)
			}
		}
	}
}

func TestEnumConstantsMatchC(t *testing.T) {
	if bad := enumMismatches(); len(bad) > 0 {
		t.Fatal(bad)
	}
}

func TestLoadedLibraryIsTheVersionMirrored(t *testing.T) {
	major, minor, _ := LibraryVersion()
	if major != VersionMajor || minor != VersionMinor {
		t.Fatalf("library %d.%d, binding %d.%d", major, minor, VersionMajor, VersionMinor)
	}
	if err := CheckVersion(); err != nil {
		t.Fatal(err)
	}
}

func TestOnlyTheSameMajorAndMinorVersionIsAccepted(t *testing.T) {
	if versionCompatible(VersionMajor, VersionMinor, 0) != nil || versionCompatible(VersionMajor, VersionMinor, 9) != nil {
		t.Fatal("a patch release was refused")
	}
	err := versionCompatible(VersionMajor, VersionMinor+1, 0)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusUnsupported || !strings.Contains(e.Message, fmt.Sprintf("this binding needs %d.%d.x", VersionMajor, VersionMinor)) {
		t.Fatalf("got %v", err)
	}
	if versionCompatible(VersionMajor+1, VersionMinor, 0) == nil {
		t.Fatal("another major version was accepted")
	}
}

func TestCPUMoEIsCheckedAgainstTheModelAndReported(t *testing.T) {
	dir := env(t, "GPTOSS_TINY_MODEL")
	_, err := Load(dir, WithDevice(DeviceCPU), WithCPUMoE(99))
	if err == nil || !strings.Contains(err.Error(), "params.n_cpu_moe: 99") {
		t.Fatalf("n_cpu_moe 99 on a 4-layer model: %v", err)
	}
	m, err := Load(dir, WithDevice(DeviceCPU), WithCPUMoE(CPUMoEAuto), WithGPUMemoryBudget(1<<30, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.NCPUMoE != 0 || info.HostWeightBytes != 0 { // the CPU backend: all in host memory
		t.Fatalf("info %+v", info)
	}
}

func TestBadModelDirectoryReturnsTheCMessage(t *testing.T) {
	bad := filepath.Join(os.TempDir(), "gptoss-no-such-model")
	_, err := Load(bad, WithDevice(DeviceCPU))
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error, got %v", err)
	}
	code, _, stderr := generateRef(t, bad, "0", "1", "x")
	if code != 1 {
		t.Fatalf("generate-ref exit %d", code)
	}
	// generate-ref prints "generate-ref: gptoss_load: <status string>: <gptoss_last_error()>"
	parts := strings.SplitN(strings.TrimRight(stderr, "\n"), ": ", 4)
	if len(parts) != 4 || e.Message != parts[3] {
		t.Fatalf("Go message %q, C stderr %q", e.Message, stderr)
	}
	if !strings.Contains(e.Message, bad) || !strings.Contains(err.Error(), e.Message) {
		t.Fatalf("message %q does not name %s", e.Message, bad)
	}
	if !errors.Is(err, &Error{Status: e.Status}) || errors.Is(err, &Error{Status: StatusInternal}) {
		t.Fatal("errors.Is does not match on the status")
	}
}

// The message must be the one of this call even when goroutines hop OS threads between cgo
// calls: many goroutines fail different calls at once and each checks its own text.
func TestErrorTextBelongsToTheFailingCallUnderConcurrency(t *testing.T) {
	m := loadTiny(t)
	var wg sync.WaitGroup
	errs := make(chan string, 8*20*2)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				dir := filepath.Join(os.TempDir(), "gptoss-missing-"+strconv.Itoa(g))
				if _, err := Load(dir, WithDevice(DeviceCPU)); err == nil || !strings.Contains(err.Error(), dir) {
					errs <- fmt.Sprint("load: ", err)
				}
				runtime.Gosched()
				if _, err := m.Detokenize([]int32{1 << 30}); err == nil || strings.Contains(err.Error(), "gptoss-missing") {
					errs <- fmt.Sprint("detokenize: ", err)
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestProgressReportsFractionsAndFalseCancelsTheLoad(t *testing.T) {
	dir := env(t, "GPTOSS_TINY_MODEL")
	var fractions []float32
	m, err := Load(dir, WithDevice(DeviceCPU), WithProgress(func(f float32) bool {
		fractions = append(fractions, f)
		return true
	}))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if len(fractions) == 0 {
		t.Fatal("progress never called")
	}
	for _, f := range fractions {
		if f < 0 || f > 1 {
			t.Fatalf("fraction %v", f)
		}
	}
	_, err = Load(dir, WithDevice(DeviceCPU), WithProgress(func(float32) bool { return false }))
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusCancelled {
		t.Fatalf("want Cancelled, got %v", err)
	}
}

func TestInfoDescribesTheCheckpoint(t *testing.T) {
	info, err := loadTiny(t).Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Device != DeviceCPU || info.NLayers == 0 || info.NVocab < 200000 {
		t.Fatalf("%+v", info)
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	m := loadTiny(t)
	text := "Hello, wörld! 你好 🦊 <|start|>"
	tokens, err := m.Tokenize(text, false)
	if err != nil || len(tokens) < 5 {
		t.Fatal(tokens, err)
	}
	back, err := m.Detokenize(tokens)
	if err != nil || back != text {
		t.Fatalf("%q, %v", back, err)
	}
	special, err := m.Tokenize("<|start|>", true)
	if err != nil || len(special) != 1 {
		t.Fatal(special, err)
	}
	empty, err := m.Tokenize("", false)
	if err != nil || len(empty) != 0 {
		t.Fatal(empty, err)
	}
}

func TestGenerateWithASeedGivesTheCAPITokens(t *testing.T) {
	code, ref, stderr := generateRef(t, env(t, "GPTOSS_TINY_MODEL"), strconv.Itoa(seed), strconv.Itoa(nTokens), prompt)
	if code != 0 {
		t.Fatal(stderr)
	}
	m := loadTiny(t)
	p, err := m.Tokenize(prompt, false)
	if err != nil || !reflect.DeepEqual(ints(p), ref["prompt"]) {
		t.Fatalf("prompt %v vs C %v (%v)", p, ref["prompt"], err)
	}
	r, err := newSession(t, m, SessionParams{}).Generate(p, sampling(nTokens), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ints(r.Tokens), ref["tokens"]) || int64(r.StopReason) != ref["stop_reason"][0] {
		t.Fatalf("Go %v %d, C %v %v", r.Tokens, r.StopReason, ref["tokens"], ref["stop_reason"])
	}
	if text, _ := m.Detokenize(r.Tokens); text != r.Text {
		t.Fatalf("text %q vs detokenized %q", r.Text, text)
	}
}

func TestStreamedEventsAreTheGeneratedTokens(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	var seen []int32
	r, err := newSession(t, m, SessionParams{}).Generate(p, sampling(nTokens), func(e Event) bool {
		seen = append(seen, e.Token)
		return true
	})
	if err != nil || !reflect.DeepEqual(seen, r.Tokens) {
		t.Fatalf("events %v, result %v, %v", seen, r, err)
	}
}

func TestAChannelStreamDeliversTheTokensAndCancelsWithTheContext(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	s := newSession(t, m, SessionParams{})
	stream := s.GenerateStream(context.Background(), p, sampling(nTokens))
	var seen []int32
	for e := range stream.Events {
		seen = append(seen, e.Token)
	}
	r, err := stream.Wait()
	if err != nil || !reflect.DeepEqual(seen, r.Tokens) || len(seen) != nTokens {
		t.Fatalf("events %v, result %+v, %v", seen, r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream = s.GenerateStream(ctx, p, sampling(nTokens))
	<-stream.Events
	<-stream.Events
	cancel()
	r, err = stream.Wait()
	if err != nil || r.StopReason != StopCancelled || len(r.Tokens) != 3 {
		t.Fatalf("after cancel: %+v, %v", r, err)
	}
}

func TestReturningFalseFromTheCallbackCancels(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	n := 0
	r, err := newSession(t, m, SessionParams{}).Generate(p, sampling(nTokens), func(Event) bool {
		n++
		return n < 3
	})
	if err != nil || r.StopReason != StopCancelled || len(r.Tokens) != 3 {
		t.Fatalf("%+v, %v", r, err)
	}
}

func TestCancelFromTheCallbackStopsGeneration(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	s := newSession(t, m, SessionParams{})
	n := 0
	r, err := s.Generate(p, sampling(nTokens), func(Event) bool {
		n++
		if n == 2 {
			s.Cancel()
		}
		return true
	})
	if err != nil || r.StopReason != StopCancelled || len(r.Tokens) != 2 {
		t.Fatalf("%+v, %v", r, err)
	}
}

func TestAPanicInTheCallbackStopsGenerationAndResumes(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	s := newSession(t, m, SessionParams{})
	func() {
		defer func() {
			if r := recover(); r != "from callback" {
				t.Fatalf("recovered %v", r)
			}
		}()
		s.Generate(p, sampling(nTokens), func(Event) bool { panic("from callback") })
	}()
	if r, err := s.Generate(p, sampling(2), nil); err != nil || len(r.Tokens) != 2 {
		t.Fatalf("session unusable after a panic: %+v %v", r, err)
	}
}

func TestAPromptLongerThanTheContextIsContextFull(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(strings.Repeat(prompt, 8), false)
	_, err := newSession(t, m, SessionParams{MaxContext: 16}).Generate(p, sampling(1), nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusContextFull {
		t.Fatalf("want ContextFull, got %v", err)
	}
}

func TestASessionOutlivesItsClosedModel(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	s := newSession(t, m, SessionParams{})
	m.Close()
	runtime.GC()
	if r, err := s.Generate(p, sampling(2), nil); err != nil || len(r.Tokens) != 2 {
		t.Fatalf("%+v, %v", r, err)
	}
}

func TestUseAfterCloseIsAnError(t *testing.T) {
	m := loadTiny(t)
	s := newSession(t, m, SessionParams{})
	s.Close()
	s.Close()
	if _, err := s.Generate([]int32{1}, sampling(1), nil); err == nil {
		t.Fatal("Generate after Close succeeded")
	}
	m.Close()
	if _, err := m.Tokenize("x", false); err == nil {
		t.Fatal("Tokenize after Close succeeded")
	}
}

func TestANulInAMessageIsInvalidArgumentNamingIt(t *testing.T) {
	m := loadTiny(t)
	req := &ChatRequest{Messages: []Message{UserMessage("ok"), UserMessage("bad\x00")}}
	_, err := newSession(t, m, SessionParams{}).Chat(req, sampling(1), nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.HasPrefix(e.Message, "messages[1].content") {
		t.Fatalf("got %v", err)
	}
}

// skipIfChatMissing: the library lands piece by piece; while gptoss_chat still answers
// UNSUPPORTED "not implemented yet", the chat tests report SKIP instead of failing.
func skipIfChatMissing(t *testing.T, m *Model) {
	s := newSession(t, m, SessionParams{})
	_, err := s.Chat(&ChatRequest{Messages: []Message{UserMessage("x")}}, sampling(1), nil)
	var e *Error
	if errors.As(err, &e) && e.Status == StatusUnsupported && strings.Contains(e.Message, "not implemented") {
		t.Skip(e.Message)
	}
}

func weatherRequest() *ChatRequest {
	return &ChatRequest{
		Messages:        []Message{UserMessage("What is the weather in Paris?")},
		Tools:           []Tool{{Name: "get_weather", Description: "Gets the current weather in a city", Parameters: weatherParams}},
		ReasoningEffort: ReasoningLow,
	}
}

func TestChatWithAToolStreamsTheTurnItReturns(t *testing.T) {
	m := loadTiny(t)
	skipIfChatMissing(t, m)
	s := newSession(t, m, SessionParams{})
	req := weatherRequest()
	var tokens []int32
	r, err := s.Chat(req, sampling(24), func(e Event) bool {
		tokens = append(tokens, e.Token)
		if e.Channel < ChannelNone || e.Channel > ChannelFinal {
			t.Errorf("event channel %d", e.Channel)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if uint32(len(tokens)) != r.NCompletionTokens {
		t.Fatalf("%d events, %d completion tokens", len(tokens), r.NCompletionTokens)
	}
	// The same prompt, seed and stop tokens through gptoss_generate give the same tokens.
	prompt, err := m.Render(req)
	if err != nil {
		t.Fatal(err)
	}
	plain := sampling(24)
	plain.StopTokens = []int32{200002, 200012, 199999} // <|return|>, <|call|>, <|endoftext|>
	generated, err := newSession(t, m, SessionParams{}).Generate(prompt, plain, nil)
	if err != nil || !reflect.DeepEqual(generated.Tokens, tokens) {
		t.Fatalf("chat tokens %v, generate tokens %v (%v)", tokens, generated, err)
	}
	// Raw is the tokens as text; compared exactly when the bytes are valid UTF-8.
	if raw, _ := m.Detokenize(tokens); utf8.ValidString(raw) && raw != r.Raw {
		t.Fatalf("raw %q, events %q", r.Raw, raw)
	}
	rendered, err := m.Render(req)
	if err != nil || uint32(len(rendered)) != r.NPromptTokens {
		t.Fatalf("render %d tokens (%v), prompt %d", len(rendered), err, r.NPromptTokens)
	}
	again, err := s.Chat(req, sampling(24), nil)
	if err != nil || again.Raw != r.Raw || again.NCachedTokens == 0 {
		t.Fatalf("second call %+v, %v", again, err)
	}
}

func TestOpenAIJSONAndTheMessageHelpersRenderTheSameConversation(t *testing.T) {
	m := loadTiny(t)
	body := `{"messages": [
		{"role": "system", "content": "Answer briefly."},
		{"role": "user", "content": "What is the weather in Paris?"},
		{"role": "assistant", "reasoning_content": "Need the tool.",
		 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
		{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
		{"role": "user", "content": "Thanks"}],
	  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Gets the current weather in a city",
	             "parameters": ` + weatherParams + `}}],
	  "reasoning_effort": "high"}`
	parsed, err := ChatRequestFromJSON([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	built := &ChatRequest{
		Messages: []Message{
			UserMessage("What is the weather in Paris?"),
			{Role: RoleAssistant, Channel: ChannelAnalysis, Content: "Need the tool."},
			{Role: RoleAssistant, Channel: ChannelCommentary, Content: `{"city":"Paris"}`, Recipient: "functions.get_weather", ContentType: "json"},
			ToolResultMessage("get_weather", "sunny"),
			UserMessage("Thanks"),
		},
		Instructions:    "Answer briefly.",
		Tools:           []Tool{{Name: "get_weather", Description: "Gets the current weather in a city", Parameters: weatherParams}},
		ReasoningEffort: ReasoningHigh,
	}
	if parsed.ReasoningEffort != ReasoningHigh || len(parsed.Messages) != 5 {
		t.Fatalf("parsed %+v", parsed)
	}
	a, errA := m.Render(parsed)
	b, errB := m.Render(built)
	if errA != nil || errB != nil || !reflect.DeepEqual(a, b) {
		ta, _ := m.Detokenize(a)
		tb, _ := m.Detokenize(b)
		t.Fatalf("JSON renders %q (%v), helpers render %q (%v)", ta, errA, tb, errB)
	}
}

func TestMalformedOpenAIJSONIsInvalidArgumentNamingTheField(t *testing.T) {
	_, err := ChatRequestFromJSON([]byte(`{"messages": [{"role": "robot", "content": "x"}]}`))
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "messages[0]") {
		t.Fatalf("got %v", err)
	}
}

func TestChatResultMessagesCanBeAppendedToTheHistory(t *testing.T) {
	m := loadTiny(t)
	skipIfChatMissing(t, m)
	s := newSession(t, m, SessionParams{})
	req := &ChatRequest{Messages: []Message{UserMessage("Hi")}}
	first, err := s.Chat(req, sampling(24), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Messages = append(append(req.Messages, first.Messages...), UserMessage("Again"))
	second, err := s.Chat(req, sampling(4), nil)
	if err != nil {
		t.Fatalf("gptoss.h: a result's messages can be appended to the history as they are, but the library rejected %+v: %v", first.Messages, err)
	}
	if second.NPromptTokens <= first.NPromptTokens {
		t.Fatalf("second prompt %d tokens, first %d", second.NPromptTokens, first.NPromptTokens)
	}
}

func TestSessionsOnSeveralGoroutinesMatchOne(t *testing.T) {
	m := loadTiny(t)
	p, _ := m.Tokenize(prompt, false)
	want, err := newSession(t, m, SessionParams{}).Generate(p, sampling(4), nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([][]int32, 2)
	for i := range results {
		s := newSession(t, m, SessionParams{})
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if r, err := s.Generate(p, sampling(4), nil); err == nil {
				results[i] = r.Tokens
			}
		}(i)
	}
	wg.Wait()
	for _, r := range results {
		if !reflect.DeepEqual(r, want.Tokens) {
			t.Fatalf("%v vs %v", r, want.Tokens)
		}
	}
}

// The README's example is Example() in example_test.go, which `go test` compiles; this keeps
// the two texts identical so the README cannot rot.
func TestReadmeExampleIsTheCompiledExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	source, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	block := strings.SplitN(strings.SplitN(string(readme), "```go\n", 2)[1], "```", 2)[0]
	body := strings.SplitN(strings.SplitN(string(source), "func Example() {\n", 2)[1], "\n}\n", 2)[0]
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	if want := strings.Join(lines, "\n") + "\n"; block != want {
		t.Fatalf("README example:\n%s\nexample_test.go:\n%s", block, want)
	}
}

func TestResponseFormatAnswersWithAReasoningBudget(t *testing.T) {
	m := loadTiny(t)
	skipIfChatMissing(t, m)
	s := newSession(t, m, SessionParams{})
	for _, budget := range []uint32{0, 3} {
		b := budget
		req := &ChatRequest{Messages: []Message{UserMessage("Ok?")}, MaxReasoningTokens: &b,
			ResponseFormat: &ResponseFormat{Type: "json_schema", Name: "answer",
				Schema: `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`}}
		sp := sampling(200)
		r, err := s.Chat(req, sp, nil)
		if err != nil {
			t.Fatal(err)
		}
		doc := strings.Join(strings.Fields(r.Final), "")
		if r.StopReason != StopReturn || (doc != `{"ok":true}` && doc != `{"ok":false}`) {
			t.Fatalf("budget %d: stop %v, final %q (raw %q)", budget, r.StopReason, r.Final, r.Raw)
		}
	}
	parsed, err := ChatRequestFromJSON([]byte(`{"messages":[{"role":"user","content":"x"}],"thinking_token_budget":7}`))
	if err != nil {
		t.Fatal(err)
	}
	if parsed.MaxReasoningTokens == nil || *parsed.MaxReasoningTokens != 7 {
		t.Fatalf("MaxReasoningTokens %v", parsed.MaxReasoningTokens)
	}
}

func TestConstrainedDecodingJSONSchemaAndNamedToolCall(t *testing.T) {
	m := loadTiny(t)
	skipIfChatMissing(t, m)
	s := newSession(t, m, SessionParams{})
	prompt, err := m.Tokenize("<|start|>user<|message|>x<|end|><|start|>assistant", true)
	if err != nil {
		t.Fatal(err)
	}
	sp := sampling(300)
	sp.JSONSchema = `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`
	g, err := s.Generate(prompt, sp, nil)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(g.Text[:strings.LastIndex(g.Text, "<|")]), "")
	if doc != `{"ok":true}` && doc != `{"ok":false}` {
		t.Fatalf("document %q", doc)
	}
	req := weatherRequest()
	req.ToolChoice = "get_weather"
	r, err := s.Chat(req, sampling(400), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.ToolCalls) != 1 || r.ToolCalls[0].Name != "get_weather" || !strings.Contains(r.ToolCalls[0].Arguments, `"city"`) {
		t.Fatalf("tool calls %+v", r.ToolCalls)
	}
	sp.JSONSchema = `{"type":"string","pattern":"x"}`
	_, err = s.Generate(prompt, sp, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "/pattern") {
		t.Fatalf("error %v", err)
	}
}
