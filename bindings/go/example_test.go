// example_test.go - the README example, compiled by `go test` (it has no Output comment, so it
// is not run: it needs a real checkpoint).
package gptoss_test

import (
	"fmt"
	"log"

	"gptoss"
)

func Example() {
	model, err := gptoss.Load("/models/gpt-oss-20b", gptoss.WithDevice(gptoss.DeviceAuto))
	if err != nil {
		log.Fatal(err) // *gptoss.Error{Status, Message}: the C status and gptoss_last_error()
	}
	defer model.Close()
	session, _ := model.NewSession(gptoss.SessionParams{})
	defer session.Close()
	req := &gptoss.ChatRequest{Messages: []gptoss.Message{gptoss.UserMessage("What is the weather in Paris?")},
		Tools: []gptoss.Tool{{Name: "get_weather", Description: "Current weather", Parameters: `{"type":"object"}`}}}
	s := gptoss.DefaultSampling()
	s.MaxTokens = 256
	reply, err := session.Chat(req, s, func(e gptoss.Event) bool { fmt.Print(e.Text); return true }) // false stops
	fmt.Println(reply.StopReason, reply.ToolCalls, err)
}
