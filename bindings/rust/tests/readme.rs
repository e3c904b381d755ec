// readme.rs - the README's example is the crate's doc example (src/lib.rs), which `cargo test`
// compiles; this keeps the two texts identical so the README cannot rot.
#[test]
fn readme_example_is_the_compiled_doc_example() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    let example = readme.split("```rust\n").nth(1).unwrap().split("```").next().unwrap();
    let lib = std::fs::read_to_string(format!("{dir}/src/lib.rs")).unwrap();
    let doc: String = lib
        .lines()
        .skip_while(|l| *l != "//! ```no_run")
        .skip(1)
        .take_while(|l| *l != "//! ```")
        .map(|l| l.strip_prefix("//! ").unwrap_or(l.trim_start_matches("//!")))
        .filter(|l| !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(example, doc);
}
