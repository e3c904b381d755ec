// abi.rs - every #[repr(C)] struct in gptoss::sys has the C compiler's size, alignment and
// field offsets, as printed by bindings/abi/abi-dump.c (GPTOSS_ABI_DUMP, `--text` format).
mod common;

use gptoss::sys;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};

macro_rules! layout {
    ($map:ident, $t:ident { $($f:ident $(as $c:literal)?),* $(,)? }) => {{
        let name = stringify!($t);
        $map.insert(format!("{name} size"), size_of::<sys::$t>());
        $map.insert(format!("{name} align"), align_of::<sys::$t>());
        $(
            #[allow(unused_mut, unused_assignments)]
            let mut field = stringify!($f);
            $( field = $c; )?
            $map.insert(format!("{name}.{field}"), offset_of!(sys::$t, $f));
        )*
    }};
}

#[test]
fn every_struct_mirror_matches_the_c_layout() {
    let dump = std::process::Command::new(common::env("GPTOSS_ABI_DUMP")).arg("--text").output().unwrap();
    assert!(dump.status.success());
    let c: BTreeMap<String, usize> = String::from_utf8(dump.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();

    let mut rust = BTreeMap::new();
    layout!(
        rust,
        gptoss_model_params {
            struct_size,
            device,
            progress,
            progress_user_data,
            max_decode_batch,
            devices,
            n_devices,
            n_cpu_moe,
            gpu_memory_budget,
            fit_context,
            batch_invariant
        }
    );
    layout!(
        rust,
        gptoss_model_info {
            struct_size,
            name,
            n_layers,
            n_experts,
            n_experts_per_token,
            n_vocab,
            max_context,
            weight_bytes,
            device,
            n_cpu_moe,
            host_weight_bytes
        }
    );
    layout!(rust, gptoss_session_params { struct_size, max_context, max_batch });
    layout!(
        rust,
        gptoss_sampling_params {
            struct_size,
            temperature,
            top_p,
            top_k,
            seed,
            max_tokens,
            stop_tokens,
            n_stop_tokens,
            stop_strings,
            n_stop_strings,
            json_schema
        }
    );
    layout!(rust, gptoss_event { struct_size, token, text, text_len, channel, recipient });
    layout!(
        rust,
        gptoss_generate_result {
            struct_size,
            tokens,
            n_tokens,
            text,
            text_len,
            stop_reason,
            n_prompt_tokens,
            n_cached_tokens,
            prefill_ms,
            decode_ms
        }
    );
    layout!(rust, gptoss_message { role, channel, content, author, recipient, content_type });
    layout!(rust, gptoss_tool { name, description, parameters });
    layout!(
        rust,
        gptoss_chat_request {
            struct_size,
            messages,
            n_messages,
            instructions,
            tools,
            n_tools,
            reasoning_effort,
            current_date,
            keep_analysis,
            tool_choice,
            tool_choice_name,
            constrain_tool_arguments,
            response_format,
            response_format_name,
            response_format_description,
            response_format_schema,
            max_reasoning_tokens
        }
    );
    layout!(rust, gptoss_tool_call { name, recipient, arguments, content_type });
    layout!(rust, gptoss_chat_result {
        struct_size, final_ as "final", analysis, tool_calls, n_tool_calls, messages, n_messages, stop_reason, raw,
        n_prompt_tokens, n_cached_tokens, n_completion_tokens, prefill_ms, decode_ms
    });
    // Same keys (every C struct and field mirrored, nothing extra) and the same numbers.
    assert_eq!(rust, c);
}
