//! The README's "Run your own workflows", as written: its code blocks are the example crate's
//! files (`examples/my-workflows`), which the test command builds, runs under `cargo lambda
//! watch` (tests/cargo_lambda.rs) and builds with `sam build` by running the section's shell
//! block in the example's directory (scripts/test).

use std::path::Path;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The fenced code blocks of the README section `heading`: (info string, content).
fn blocks(heading: &str) -> Vec<(String, String)> {
    let readme = read("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("the README has a section {heading:?}"));
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            out.push((info.to_string(), body.join("\n") + "\n"));
        }
    }
    out
}

#[test]
fn the_own_workflows_section_shows_the_example_crate_as_it_is() {
    let blocks = blocks("Run your own workflows");
    let of = |info: &str| -> Vec<&String> {
        blocks
            .iter()
            .filter(|(i, _)| i == info)
            .map(|(_, b)| b)
            .collect()
    };
    let rust = of("rust");
    assert_eq!(rust.len(), 2, "an agent step's excerpt and main.rs");
    assert_eq!(
        rust[1],
        &read("examples/my-workflows/src/main.rs"),
        "the README's main.rs is the example's"
    );
    // The agent step's excerpt is the example's code, line for line (indentation aside).
    let trimmed =
        |text: &str| -> Vec<String> { text.lines().map(|l| l.trim().to_string()).collect() };
    let excerpt = trimmed(rust[0]);
    let chaining = trimmed(&read("examples/my-workflows/src/patterns/chaining.rs"));
    assert!(
        chaining
            .windows(excerpt.len())
            .any(|w| w == excerpt.as_slice()),
        "the README's agent step is not in examples/my-workflows/src/patterns/chaining.rs:\n{}",
        rust[0]
    );
    let manifest = read("examples/my-workflows/Cargo.toml");
    let dependencies = &manifest[manifest.find("[dependencies]").expect("[dependencies]")..];
    assert_eq!(
        of("toml"),
        [&dependencies.to_string()],
        "the README's dependencies are the example's"
    );
    let shell = of("sh");
    assert_eq!(shell.len(), 1, "one shell block, which scripts/test runs");
    assert!(
        read("scripts/test").contains("runs the next block in examples/my-workflows"),
        "scripts/test runs the README's block"
    );
    assert!(shell[0].contains("Binary: my-workflows"), "{}", shell[0]);
    // The profile the README points to keeps panics unwinding (a panicking step is recorded
    // and retried, not an aborted process).
    let root = read("Cargo.toml");
    let profile = &root[root.find("[profile.release]").expect("[profile.release]")..];
    assert!(profile.contains("panic = \"unwind\""), "{profile}");
    // The main.rs is the "about 15 lines" the entry point promises.
    let main = read("examples/my-workflows/src/main.rs");
    assert!(main.lines().count() <= 20, "{main}");
}

#[test]
fn the_readme_stays_under_15_kb() {
    let size = read("README.md").len();
    assert!(
        size <= 15 * 1024,
        "README.md is {size} bytes: move detail to docs/"
    );
}
