// common/mod.rs - helpers shared by the Rust binding's tests: the environment ctest sets
// (GPTOSS_TINY_MODEL, GPTOSS_ABI_DUMP, GPTOSS_GENERATE_REF) and the C oracle programs.
#![allow(dead_code)]

use std::collections::HashMap;
use std::process::Command;

pub const PROMPT: &str = "The quick brown fox";
pub const SEED: u64 = 1234;
pub const N_TOKENS: u32 = 12;

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run these tests through ctest"))
}

pub fn model() -> gptoss::Model {
    gptoss::Model::load(env("GPTOSS_TINY_MODEL"), gptoss::Device::Cpu).expect("load the tiny model")
}

/// Runs bindings/abi/generate-ref; returns (exit code, stdout lines keyed by first word, stderr).
pub fn generate_ref(args: &[&str]) -> (i32, HashMap<String, Vec<i64>>, String) {
    let out = Command::new(env("GPTOSS_GENERATE_REF")).args(args).output().expect("run generate-ref");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines = stdout
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            let key = words.next().unwrap().to_string();
            (key, words.map(|w| w.parse().unwrap()).collect())
        })
        .collect();
    (out.status.code().unwrap_or(-1), lines, String::from_utf8(out.stderr).unwrap())
}
