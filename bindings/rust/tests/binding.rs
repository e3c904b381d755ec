// binding.rs - the Rust binding's promises, checked against the C library on the tiny synthetic
// checkpoint (CPU backend). Oracles: seeded tokens and error texts from generate-ref (a C
// program calling gptoss.h directly), token texts from gptoss_detokenize.
mod common;

use common::{generate_ref, model, N_TOKENS, PROMPT, SEED};
use gptoss::{
    Channel, ChatRequest, Device, Message, Model, ReasoningEffort, Sampling, SessionParams, Status, StopReason, Tool,
};

const WEATHER_PARAMS: &str = r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;

/// The library lands piece by piece: while gptoss_chat still answers UNSUPPORTED "not implemented
/// yet", the chat tests print SKIPPED and return instead of failing.
fn chat_implemented(model: &Model) -> bool {
    let mut session = model.session(SessionParams::default()).unwrap();
    match session.chat(&ChatRequest::new(vec![Message::user("x")]), &Sampling::new().max_tokens(1)) {
        Err(e) if e.status == Status::Unsupported && e.message.contains("not implemented") => {
            eprintln!("SKIPPED: {}", e.message);
            false
        }
        _ => true,
    }
}

fn weather_request() -> ChatRequest {
    ChatRequest::new(vec![Message::user("What is the weather in Paris?")])
        .tool(Tool::new("get_weather", "Gets the current weather in a city", Some(WEATHER_PARAMS)))
        .reasoning_effort(ReasoningEffort::Low)
}

#[test]
fn loaded_library_is_the_version_mirrored() {
    let (major, minor, _) = gptoss::library_version();
    assert_eq!((major, minor), (gptoss::sys::GPTOSS_VERSION_MAJOR, gptoss::sys::GPTOSS_VERSION_MINOR));
    assert_eq!(gptoss::check_version(), Ok(()));
}

#[test]
fn n_cpu_moe_is_checked_against_the_model_and_reported() {
    let dir = common::env("GPTOSS_TINY_MODEL");
    let options = gptoss::LoadOptions { device: Device::Cpu, n_cpu_moe: gptoss::CpuMoe::Layers(99), ..Default::default() };
    let err = match Model::load_with_options(&dir, &options) {
        Err(e) => e,
        Ok(_) => panic!("n_cpu_moe 99 on a 4-layer model loaded"),
    };
    assert!(err.message.contains("params.n_cpu_moe: 99"), "{}", err.message);
    let options = gptoss::LoadOptions { device: Device::Cpu, n_cpu_moe: gptoss::CpuMoe::Auto, ..Default::default() };
    let info = Model::load_with_options(&dir, &options).unwrap().info().unwrap();
    assert_eq!((info.n_cpu_moe, info.host_weight_bytes), (0, 0)); // the CPU backend: all in host memory
}

#[test]
fn bad_model_directory_is_an_error_carrying_the_c_message() {
    let bad = std::env::temp_dir().join("gptoss-no-such-model");
    let err = match Model::load(&bad, Device::Cpu) {
        Err(e) => e,
        Ok(_) => panic!("loading {} succeeded", bad.display()),
    };
    let (code, _, stderr) = generate_ref(&[bad.to_str().unwrap(), "0", "1", "x"]);
    assert_eq!(code, 1);
    // generate-ref prints "generate-ref: gptoss_load: <status string>: <gptoss_last_error()>"
    let c_message = stderr.trim_end().splitn(4, ": ").nth(3).unwrap();
    assert_eq!(err.message, c_message);
    assert!(err.message.contains(bad.to_str().unwrap()), "{}", err.message);
    assert!(err.to_string().contains(&err.message));
    assert!(!matches!(err.status, Status::Other(_)));
}

#[test]
fn progress_reports_fractions_and_false_cancels_the_load() {
    let path = common::env("GPTOSS_TINY_MODEL");
    let mut fractions = Vec::new();
    drop(
        Model::load_with_progress(&path, Device::Cpu, |f| {
            fractions.push(f);
            true
        })
        .unwrap(),
    );
    assert!(!fractions.is_empty() && fractions.iter().all(|f| (0.0..=1.0).contains(f)), "{fractions:?}");
    let err = Model::load_with_progress(&path, Device::Cpu, |_| false).err().expect("cancelled load succeeded");
    assert_eq!(err.status, Status::Cancelled);
}

#[test]
fn info_describes_the_checkpoint() {
    let info = model().info().unwrap();
    assert_eq!(info.device, Device::Cpu);
    assert!(info.n_layers > 0 && info.n_vocab > 200_000, "{info:?}");
}

#[test]
fn tokenize_round_trip() {
    let model = model();
    let text = "Hello, wörld! 你好 🦊 <|start|>";
    let tokens = model.tokenize(text, false).unwrap();
    assert!(tokens.len() > 5);
    assert_eq!(model.detokenize(&tokens).unwrap(), text);
    assert_eq!(model.tokenize("", false).unwrap(), Vec::<i32>::new());
    assert_eq!(model.tokenize("<|start|>", true).unwrap().len(), 1);
}

#[test]
fn detokenize_of_an_out_of_range_id_is_invalid_argument() {
    let err = model().detokenize(&[1, 1 << 30]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(!err.message.is_empty());
}

#[test]
fn generate_with_a_seed_gives_the_c_api_tokens() {
    let (code, lines, stderr) =
        generate_ref(&[&common::env("GPTOSS_TINY_MODEL"), &SEED.to_string(), &N_TOKENS.to_string(), PROMPT]);
    assert_eq!(code, 0, "{stderr}");
    let model = model();
    let prompt = model.tokenize(PROMPT, false).unwrap();
    assert_eq!(prompt.iter().map(|&t| t as i64).collect::<Vec<_>>(), lines["prompt"]);
    let mut session = model.session(SessionParams::default()).unwrap();
    let out = session.generate(&prompt, &Sampling::new().seed(SEED).max_tokens(N_TOKENS)).unwrap();
    assert_eq!(out.tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(), lines["tokens"]);
    assert_eq!(out.stop_reason.raw() as i64, lines["stop_reason"][0]);
    assert_eq!(out.text, model.detokenize_bytes(&out.tokens).unwrap());
}

#[test]
fn streamed_events_are_the_generated_tokens() {
    let model = model();
    let prompt = model.tokenize(PROMPT, false).unwrap();
    let mut session = model.session(SessionParams::default()).unwrap();
    let mut seen = Vec::new();
    let mut text = String::new();
    let out = session
        .generate_streaming(&prompt, &Sampling::new().seed(SEED).max_tokens(N_TOKENS), |e| {
            seen.push(e.token);
            text.push_str(e.text);
            true
        })
        .unwrap();
    assert_eq!(seen, out.tokens);
    assert!(String::from_utf8_lossy(&out.text).starts_with(&text));
}

#[test]
fn returning_false_from_the_closure_cancels() {
    let model = model();
    let prompt = model.tokenize(PROMPT, false).unwrap();
    let mut session = model.session(SessionParams::default()).unwrap();
    let mut n = 0;
    let out = session
        .generate_streaming(&prompt, &Sampling::new().seed(SEED).max_tokens(N_TOKENS), |_| {
            n += 1;
            n < 3
        })
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.tokens.len(), 3);
}

#[test]
fn a_canceller_stops_generation_from_the_callback() {
    let model = model();
    let prompt = model.tokenize(PROMPT, false).unwrap();
    let mut session = model.session(SessionParams::default()).unwrap();
    let canceller = session.canceller();
    let mut n = 0;
    let out = session
        .generate_streaming(&prompt, &Sampling::new().seed(SEED).max_tokens(N_TOKENS), |_| {
            n += 1;
            if n == 2 {
                canceller.cancel();
            }
            true
        })
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.tokens.len(), 2);
}

#[test]
fn a_panic_in_the_closure_stops_generation_and_resumes() {
    let model = model();
    let prompt = model.tokenize(PROMPT, false).unwrap();
    let mut session = model.session(SessionParams::default()).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = session.generate_streaming(&prompt, &Sampling::new().max_tokens(N_TOKENS), |_| panic!("from closure"));
    }));
    assert_eq!(*caught.unwrap_err().downcast::<&str>().unwrap(), "from closure");
    // The session still works afterwards.
    assert_eq!(session.generate(&prompt, &Sampling::new().max_tokens(2)).unwrap().tokens.len(), 2);
}

#[test]
fn a_session_outlives_its_dropped_model() {
    let (mut session, prompt) = {
        let model = model();
        (model.session(SessionParams::default()).unwrap(), model.tokenize(PROMPT, false).unwrap())
    };
    assert_eq!(session.generate(&prompt, &Sampling::new().seed(SEED).max_tokens(2)).unwrap().tokens.len(), 2);
}

#[test]
fn a_prompt_longer_than_the_context_is_context_full() {
    let model = model();
    let prompt = model.tokenize(&PROMPT.repeat(8), false).unwrap();
    let mut session = model.session(SessionParams { max_context: Some(16), max_batch: None }).unwrap();
    let err = session.generate(&prompt, &Sampling::new().max_tokens(1)).unwrap_err();
    assert_eq!(err.status, Status::ContextFull);
}

#[test]
fn a_nul_in_a_message_is_invalid_argument_naming_it() {
    let model = model();
    let mut session = model.session(SessionParams::default()).unwrap();
    let request = ChatRequest::new(vec![Message::user("ok"), Message::user("bad\0")]);
    let err = session.chat(&request, &Sampling::new().max_tokens(1)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.starts_with("messages[1].content"), "{}", err.message);
}

#[test]
fn model_and_sessions_work_across_threads() {
    let model = std::sync::Arc::new(model());
    let prompt = model.tokenize(PROMPT, false).unwrap();
    let sampling = Sampling::new().seed(SEED).max_tokens(4);
    let expected = model.session(SessionParams::default()).unwrap().generate(&prompt, &sampling).unwrap().tokens;
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (model, prompt, sampling) = (model.clone(), prompt.clone(), sampling.clone());
            // A session is created here and moved into the thread (Session: Send).
            let mut session = model.session(SessionParams::default()).unwrap();
            std::thread::spawn(move || {
                let _ = &model;
                session.generate(&prompt, &sampling).unwrap().tokens
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), expected);
    }
}

#[test]
fn chat_with_a_tool_streams_the_turn_it_returns() {
    let model = model();
    if !chat_implemented(&model) {
        return;
    }
    let request = weather_request();
    let sampling = Sampling::new().seed(SEED).max_tokens(24);
    let mut session = model.session(SessionParams::default()).unwrap();
    let mut events = Vec::new();
    let out = session
        .chat_streaming(&request, &sampling, |e| {
            events.push((e.token, e.channel));
            true
        })
        .unwrap();
    assert_eq!(events.len() as u32, out.n_completion_tokens);
    let tokens: Vec<i32> = events.iter().map(|e| e.0).collect();
    // The same prompt, seed and stop tokens through gptoss_generate give the same tokens.
    let prompt = model.render(&request).unwrap();
    let mut plain = model.session(SessionParams::default()).unwrap();
    let generated = plain.generate(&prompt, &sampling.clone().stop_tokens(vec![200002, 200012, 199999])).unwrap();
    assert_eq!(tokens, generated.tokens);
    // raw is the tokens as text; compared exactly when the bytes are valid UTF-8.
    if let Ok(text) = String::from_utf8(model.detokenize_bytes(&tokens).unwrap()) {
        assert_eq!(out.raw, text);
    }
    assert!(events.iter().all(|e| !matches!(e.1, Channel::Other(_))));
    assert_eq!(out.n_prompt_tokens as usize, model.render(&request).unwrap().len());
    let again = session.chat(&request, &sampling).unwrap();
    assert_eq!(again.raw, out.raw, "streaming does not change the output");
    assert!(again.n_cached_tokens > 0, "the second call reused the first's prompt");
}

#[test]
fn openai_json_and_the_message_helpers_render_the_same_conversation() {
    let model = model();
    let json = r#"{"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Thanks"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Gets the current weather in a city",
                 "parameters": {"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
      "reasoning_effort": "high"}"#;
    let parsed = ChatRequest::from_openai_json(json).unwrap();
    let built = ChatRequest::new(vec![
        Message::user("What is the weather in Paris?"),
        Message::assistant(Channel::Analysis, "Need the tool."),
        Message::tool_call("get_weather", r#"{"city":"Paris"}"#),
        Message::tool_result("get_weather", "sunny"),
        Message::user("Thanks"),
    ])
    .instructions("Answer briefly.")
    .tool(Tool::new("get_weather", "Gets the current weather in a city", Some(WEATHER_PARAMS)))
    .reasoning_effort(ReasoningEffort::High);
    assert_eq!(parsed.reasoning_effort, ReasoningEffort::High);
    assert_eq!(parsed.messages.len(), 5, "{:?}", parsed.messages);
    let rendered = model.render(&built).unwrap();
    let from_json = model.render(&parsed).unwrap();
    assert_eq!(
        from_json,
        rendered,
        "JSON renders {:?}, helpers render {:?}",
        model.detokenize(&from_json).unwrap(),
        model.detokenize(&rendered).unwrap()
    );
}

#[test]
fn malformed_openai_json_is_invalid_argument_naming_the_field() {
    let err = ChatRequest::from_openai_json(r#"{"messages": [{"role": "robot", "content": "x"}]}"#).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("messages[0]"), "{}", err.message);
}

#[test]
fn chat_result_messages_can_be_appended_to_the_history() {
    let model = model();
    if !chat_implemented(&model) {
        return;
    }
    let mut session = model.session(SessionParams::default()).unwrap();
    let mut request = ChatRequest::new(vec![Message::user("Hi")]);
    let first = session.chat(&request, &Sampling::new().seed(SEED).max_tokens(24)).unwrap();
    request.messages.extend(first.messages.iter().cloned());
    request.messages.push(Message::user("Again"));
    let second = session.chat(&request, &Sampling::new().seed(SEED).max_tokens(4)).unwrap_or_else(|e| {
        panic!(
            "gptoss.h: a result's messages can be appended to the history as they are, but the library rejected {:?}: {e}",
            first.messages
        )
    });
    assert!(second.n_prompt_tokens > first.n_prompt_tokens);
}

#[test]
fn response_format_answers_with_a_reasoning_budget() {
    let model = model();
    let mut session = model.session(SessionParams::default()).unwrap();
    let schema =
        r#"{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}"#;
    for budget in [0u32, 3] {
        let request = ChatRequest::new(vec![Message::user("Ok?")])
            .response_format(gptoss::ResponseFormat::JsonSchema {
                name: "answer".into(),
                description: None,
                schema: schema.into(),
            })
            .max_reasoning_tokens(budget);
        let reply = session.chat(&request, &Sampling::new().seed(2).max_tokens(200)).unwrap();
        assert!(matches!(reply.stop_reason, StopReason::Return), "{}", reply.raw);
        let doc: String = reply.final_answer.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(doc == r#"{"ok":true}"# || doc == r#"{"ok":false}"#, "{doc}");
        assert!(reply.messages.len() <= if budget == 0 { 1 } else { 2 });
    }
    let parsed = ChatRequest::from_openai_json(
        r#"{"messages":[{"role":"user","content":"x"}],"thinking_token_budget":7}"#,
    )
    .unwrap();
    assert_eq!(parsed.max_reasoning_tokens, Some(7));
    let bad = ChatRequest::new(vec![Message::user("x")]).max_reasoning_tokens(u32::MAX);
    assert_eq!(session.chat(&bad, &Sampling::new()).unwrap_err().status, Status::InvalidArgument);
}

#[test]
fn constrained_decoding_json_schema_and_named_tool_call() {
    let model = model();
    let prompt = model.tokenize("<|start|>user<|message|>x<|end|><|start|>assistant", true).unwrap();
    let mut session = model.session(SessionParams::default()).unwrap();
    let schema =
        r#"{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}"#;
    let out = session.generate(&prompt, &Sampling::new().seed(3).max_tokens(300).json_schema(schema)).unwrap();
    assert!(matches!(out.stop_reason, StopReason::Return | StopReason::Call));
    let text = String::from_utf8_lossy(&out.text).to_string();
    let doc: String = text[..text.rfind("<|").unwrap()].chars().filter(|c| !c.is_whitespace()).collect();
    assert!(doc == r#"{"ok":true}"# || doc == r#"{"ok":false}"#, "{doc}");
    let request = weather_request().tool_choice(gptoss::ToolChoice::Named("get_weather".into()));
    let reply = session.chat(&request, &Sampling::new().seed(1).max_tokens(400)).unwrap();
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].name, "get_weather");
    assert!(reply.tool_calls[0].arguments.contains("\"city\""));
    let bad = session.generate(&prompt, &Sampling::new().json_schema(r#"{"type":"string","pattern":"x"}"#));
    let err = bad.unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("/pattern"), "{}", err.message);
}
