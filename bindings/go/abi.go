// abi.go - the layout of every gptoss.h struct as cgo compiled it, for the ABI test
// (cgo is not allowed in _test.go files). cgo takes its layouts from the C compiler's debug
// information, and the test compares them with bindings/abi/abi-dump.c's output, so a stale
// cgo cache or a mismatched header (other flags, another gptoss.h on the include path) fails.
// The Go enum constants are checked against the C ones here too.
package gptoss

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

func structLayouts() map[string]uintptr {
	m := map[string]uintptr{}
	add := func(name string, size, align uintptr, fields map[string]uintptr) {
		m[name+" size"] = size
		m[name+" align"] = align
		for f, off := range fields {
			m[name+"."+f] = off
		}
	}
	var mp C.gptoss_model_params
	add("gptoss_model_params", unsafe.Sizeof(mp), unsafe.Alignof(mp), map[string]uintptr{
		"struct_size": unsafe.Offsetof(mp.struct_size), "device": unsafe.Offsetof(mp.device),
		"progress": unsafe.Offsetof(mp.progress), "progress_user_data": unsafe.Offsetof(mp.progress_user_data),
		"max_decode_batch": unsafe.Offsetof(mp.max_decode_batch),
		"devices": unsafe.Offsetof(mp.devices), "n_devices": unsafe.Offsetof(mp.n_devices),
		"n_cpu_moe": unsafe.Offsetof(mp.n_cpu_moe), "gpu_memory_budget": unsafe.Offsetof(mp.gpu_memory_budget),
		"fit_context": unsafe.Offsetof(mp.fit_context), "batch_invariant": unsafe.Offsetof(mp.batch_invariant)})
	var mi C.gptoss_model_info
	add("gptoss_model_info", unsafe.Sizeof(mi), unsafe.Alignof(mi), map[string]uintptr{
		"struct_size": unsafe.Offsetof(mi.struct_size), "name": unsafe.Offsetof(mi.name),
		"n_layers": unsafe.Offsetof(mi.n_layers), "n_experts": unsafe.Offsetof(mi.n_experts),
		"n_experts_per_token": unsafe.Offsetof(mi.n_experts_per_token), "n_vocab": unsafe.Offsetof(mi.n_vocab),
		"max_context": unsafe.Offsetof(mi.max_context), "weight_bytes": unsafe.Offsetof(mi.weight_bytes),
		"device": unsafe.Offsetof(mi.device), "n_cpu_moe": unsafe.Offsetof(mi.n_cpu_moe),
		"host_weight_bytes": unsafe.Offsetof(mi.host_weight_bytes)})
	var sp C.gptoss_session_params
	add("gptoss_session_params", unsafe.Sizeof(sp), unsafe.Alignof(sp), map[string]uintptr{
		"struct_size": unsafe.Offsetof(sp.struct_size), "max_context": unsafe.Offsetof(sp.max_context),
		"max_batch": unsafe.Offsetof(sp.max_batch)})
	var sa C.gptoss_sampling_params
	add("gptoss_sampling_params", unsafe.Sizeof(sa), unsafe.Alignof(sa), map[string]uintptr{
		"struct_size": unsafe.Offsetof(sa.struct_size), "temperature": unsafe.Offsetof(sa.temperature),
		"top_p": unsafe.Offsetof(sa.top_p), "top_k": unsafe.Offsetof(sa.top_k), "seed": unsafe.Offsetof(sa.seed),
		"max_tokens": unsafe.Offsetof(sa.max_tokens), "stop_tokens": unsafe.Offsetof(sa.stop_tokens),
		"n_stop_tokens": unsafe.Offsetof(sa.n_stop_tokens), "stop_strings": unsafe.Offsetof(sa.stop_strings),
		"n_stop_strings": unsafe.Offsetof(sa.n_stop_strings), "json_schema": unsafe.Offsetof(sa.json_schema)})
	var ev C.gptoss_event
	add("gptoss_event", unsafe.Sizeof(ev), unsafe.Alignof(ev), map[string]uintptr{
		"struct_size": unsafe.Offsetof(ev.struct_size), "token": unsafe.Offsetof(ev.token),
		"text": unsafe.Offsetof(ev.text), "text_len": unsafe.Offsetof(ev.text_len),
		"channel": unsafe.Offsetof(ev.channel), "recipient": unsafe.Offsetof(ev.recipient)})
	var gr C.gptoss_generate_result
	add("gptoss_generate_result", unsafe.Sizeof(gr), unsafe.Alignof(gr), map[string]uintptr{
		"struct_size": unsafe.Offsetof(gr.struct_size), "tokens": unsafe.Offsetof(gr.tokens),
		"n_tokens": unsafe.Offsetof(gr.n_tokens), "text": unsafe.Offsetof(gr.text),
		"text_len": unsafe.Offsetof(gr.text_len), "stop_reason": unsafe.Offsetof(gr.stop_reason),
		"n_prompt_tokens": unsafe.Offsetof(gr.n_prompt_tokens), "n_cached_tokens": unsafe.Offsetof(gr.n_cached_tokens),
		"prefill_ms": unsafe.Offsetof(gr.prefill_ms), "decode_ms": unsafe.Offsetof(gr.decode_ms)})
	var ms C.gptoss_message
	add("gptoss_message", unsafe.Sizeof(ms), unsafe.Alignof(ms), map[string]uintptr{
		"role": unsafe.Offsetof(ms.role), "channel": unsafe.Offsetof(ms.channel), "content": unsafe.Offsetof(ms.content),
		"author": unsafe.Offsetof(ms.author), "recipient": unsafe.Offsetof(ms.recipient),
		"content_type": unsafe.Offsetof(ms.content_type)})
	var tl C.gptoss_tool
	add("gptoss_tool", unsafe.Sizeof(tl), unsafe.Alignof(tl), map[string]uintptr{
		"name": unsafe.Offsetof(tl.name), "description": unsafe.Offsetof(tl.description),
		"parameters": unsafe.Offsetof(tl.parameters)})
	var rq C.gptoss_chat_request
	add("gptoss_chat_request", unsafe.Sizeof(rq), unsafe.Alignof(rq), map[string]uintptr{
		"struct_size": unsafe.Offsetof(rq.struct_size), "messages": unsafe.Offsetof(rq.messages),
		"n_messages": unsafe.Offsetof(rq.n_messages), "instructions": unsafe.Offsetof(rq.instructions),
		"tools": unsafe.Offsetof(rq.tools), "n_tools": unsafe.Offsetof(rq.n_tools),
		"reasoning_effort": unsafe.Offsetof(rq.reasoning_effort), "current_date": unsafe.Offsetof(rq.current_date),
		"keep_analysis": unsafe.Offsetof(rq.keep_analysis), "tool_choice": unsafe.Offsetof(rq.tool_choice),
		"tool_choice_name":            unsafe.Offsetof(rq.tool_choice_name),
		"constrain_tool_arguments":    unsafe.Offsetof(rq.constrain_tool_arguments),
		"response_format":             unsafe.Offsetof(rq.response_format),
		"response_format_name":        unsafe.Offsetof(rq.response_format_name),
		"response_format_description": unsafe.Offsetof(rq.response_format_description),
		"response_format_schema":      unsafe.Offsetof(rq.response_format_schema),
		"max_reasoning_tokens":        unsafe.Offsetof(rq.max_reasoning_tokens)})
	var tc C.gptoss_tool_call
	add("gptoss_tool_call", unsafe.Sizeof(tc), unsafe.Alignof(tc), map[string]uintptr{
		"name": unsafe.Offsetof(tc.name), "recipient": unsafe.Offsetof(tc.recipient),
		"arguments": unsafe.Offsetof(tc.arguments), "content_type": unsafe.Offsetof(tc.content_type)})
	var cr C.gptoss_chat_result
	add("gptoss_chat_result", unsafe.Sizeof(cr), unsafe.Alignof(cr), map[string]uintptr{
		"struct_size": unsafe.Offsetof(cr.struct_size), "final": unsafe.Offsetof(cr.final),
		"analysis": unsafe.Offsetof(cr.analysis), "tool_calls": unsafe.Offsetof(cr.tool_calls),
		"n_tool_calls": unsafe.Offsetof(cr.n_tool_calls), "messages": unsafe.Offsetof(cr.messages),
		"n_messages": unsafe.Offsetof(cr.n_messages), "stop_reason": unsafe.Offsetof(cr.stop_reason),
		"raw": unsafe.Offsetof(cr.raw), "n_prompt_tokens": unsafe.Offsetof(cr.n_prompt_tokens),
		"n_cached_tokens":     unsafe.Offsetof(cr.n_cached_tokens),
		"n_completion_tokens": unsafe.Offsetof(cr.n_completion_tokens),
		"prefill_ms":          unsafe.Offsetof(cr.prefill_ms), "decode_ms": unsafe.Offsetof(cr.decode_ms)})
	return m
}

// enumMismatches lists the Go constants whose value differs from the C enum's.
func enumMismatches() []string {
	var bad []string
	check := func(name string, goValue, cValue int) {
		if goValue != cValue {
			bad = append(bad, fmt.Sprintf("%s: Go %d, C %d", name, goValue, cValue))
		}
	}
	check("StatusInvalidArgument", int(StatusInvalidArgument), int(C.GPTOSS_ERR_INVALID_ARGUMENT))
	check("StatusIO", int(StatusIO), int(C.GPTOSS_ERR_IO))
	check("StatusFormat", int(StatusFormat), int(C.GPTOSS_ERR_FORMAT))
	check("StatusUnsupported", int(StatusUnsupported), int(C.GPTOSS_ERR_UNSUPPORTED))
	check("StatusOutOfMemory", int(StatusOutOfMemory), int(C.GPTOSS_ERR_OUT_OF_MEMORY))
	check("StatusDevice", int(StatusDevice), int(C.GPTOSS_ERR_DEVICE))
	check("StatusContextFull", int(StatusContextFull), int(C.GPTOSS_ERR_CONTEXT_FULL))
	check("StatusBufferTooSmall", int(StatusBufferTooSmall), int(C.GPTOSS_ERR_BUFFER_TOO_SMALL))
	check("StatusCancelled", int(StatusCancelled), int(C.GPTOSS_ERR_CANCELLED))
	check("StatusInternal", int(StatusInternal), int(C.GPTOSS_ERR_INTERNAL))
	check("ChannelAnalysis", int(ChannelAnalysis), int(C.GPTOSS_CHANNEL_ANALYSIS))
	check("ChannelCommentary", int(ChannelCommentary), int(C.GPTOSS_CHANNEL_COMMENTARY))
	check("ChannelFinal", int(ChannelFinal), int(C.GPTOSS_CHANNEL_FINAL))
	check("StopReturn", int(StopReturn), int(C.GPTOSS_STOP_RETURN))
	check("StopCall", int(StopCall), int(C.GPTOSS_STOP_CALL))
	check("StopToken", int(StopToken), int(C.GPTOSS_STOP_TOKEN))
	check("StopString", int(StopString), int(C.GPTOSS_STOP_STRING))
	check("StopMaxTokens", int(StopMaxTokens), int(C.GPTOSS_STOP_MAX_TOKENS))
	check("StopContextFull", int(StopContextFull), int(C.GPTOSS_STOP_CONTEXT_FULL))
	check("StopCancelled", int(StopCancelled), int(C.GPTOSS_STOP_CANCELLED))
	check("RoleUser", int(RoleUser), int(C.GPTOSS_ROLE_USER))
	check("RoleAssistant", int(RoleAssistant), int(C.GPTOSS_ROLE_ASSISTANT))
	check("RoleTool", int(RoleTool), int(C.GPTOSS_ROLE_TOOL))
	check("ReasoningLow", int(ReasoningLow)-1, int(C.GPTOSS_REASONING_LOW))
	check("ReasoningMedium", int(ReasoningMedium)-1, int(C.GPTOSS_REASONING_MEDIUM))
	check("ReasoningHigh", int(ReasoningHigh)-1, int(C.GPTOSS_REASONING_HIGH))
	check("DeviceCPU", int(DeviceCPU), int(C.GPTOSS_DEVICE_CPU))
	check("DeviceAuto", int(DeviceAuto), int(C.GPTOSS_DEVICE_AUTO))
	check("VersionMajor", VersionMajor, int(C.GPTOSS_VERSION_MAJOR))
	check("VersionMinor", VersionMinor, int(C.GPTOSS_VERSION_MINOR))
	if SeedRandom != uint64(C.GPTOSS_SEED_RANDOM) {
		bad = append(bad, "SeedRandom")
	}
	return bad
}
