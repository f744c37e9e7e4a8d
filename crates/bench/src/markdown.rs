//! What every section of `BENCHMARKS.md` writes with: the "met" cell ([`yes`]) and the
//! replacement of one section of the file, the rest kept as it is ([`splice`], [`extract`]).

/// The "met" cell of a target row.
pub fn yes(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

/// `old` with its section under `heading` (a `## ` line: from it to the next `## ` heading or
/// the end) replaced by `section`, or `section` appended when `old` has none.
pub fn splice(old: &str, heading: &str, section: &str) -> String {
    let section = section.trim_matches('\n');
    let Some(start) = old.find(&format!("\n{heading}\n")) else {
        return format!("{}\n\n{section}\n", old.trim_end_matches('\n'));
    };
    let rest = &old[start + 1..];
    let end = rest[heading.len()..]
        .find("\n## ")
        .map_or(old.len(), |e| start + 1 + heading.len() + e + 1);
    format!(
        "{}\n\n{section}\n\n{}",
        old[..start].trim_end_matches('\n'),
        &old[end..]
    )
    .trim_end_matches('\n')
    .to_string()
        + "\n"
}

/// The section of `report` under `heading`, if it has one (from the heading to the next `## `
/// heading or the end).
pub fn extract<'a>(report: &'a str, heading: &str) -> Option<&'a str> {
    let start = report.find(&format!("\n{heading}\n"))? + 1;
    let rest = &report[start..];
    let end = rest[heading.len()..]
        .find("\n## ")
        .map_or(rest.len(), |e| heading.len() + e + 1);
    Some(rest[..end].trim_end_matches('\n'))
}

/// `new` (a report that does not measure the section under `heading`) with that section of
/// `old` (the file it replaces) kept at its end, so that it is not lost when the rest of the
/// file is measured again.
pub fn keep_section(old: &str, new: String, heading: &str) -> String {
    match extract(old, heading) {
        Some(section) if extract(&new, heading).is_none() => splice(&new, heading, section),
        _ => new,
    }
}

/// Replace the section under `heading` in the report at `path` ([`splice`]); the rest of the
/// file is kept as it is (a missing file: the section alone).
pub fn replace_section(
    path: &std::path::Path,
    heading: &str,
    section: &str,
) -> std::io::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    std::fs::write(path, splice(&old, heading, section))
}

/// `old` with each line that starts as one of `rows` does (up to its first ` | `: a table
/// row's first cell) replaced by that row. Errors name the first row `old` does not have.
pub fn replace_rows(old: &str, rows: &[String]) -> Result<String, String> {
    let key = |line: &str| line.split_once(" | ").map(|(first, _)| first.to_string());
    let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
    for row in rows {
        let want = key(row).ok_or_else(|| format!("not a table row: {row:?}"))?;
        let line = lines
            .iter_mut()
            .find(|line| key(line).as_deref() == Some(want.as_str()))
            .ok_or_else(|| format!("no row {want:?} to replace"))?;
        line.clone_from(row);
    }
    Ok(lines.join("\n") + if old.ends_with('\n') { "\n" } else { "" })
}

/// The command that measured a section on its own, as `cargo run` takes it: the bench's
/// arguments `args`, a PostgreSQL server's URL left out (it may hold a password).
pub fn command(args: &[String]) -> String {
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("postgres://"))
        .collect();
    format!(
        "cargo run --release -p ironflow-lambda-bench -- {}",
        args.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_and_rows_are_replaced_and_nothing_else() {
        let old = "# B\n\n## A\n\n| a | 1 | yes |\n| b | 2 | yes |\n\n## C\n\nold\n\n### c\n\n## D\n\nd\n";
        assert_eq!(
            splice(old, "## C", "## C\n\nnew\n"),
            "# B\n\n## A\n\n| a | 1 | yes |\n| b | 2 | yes |\n\n## C\n\nnew\n\n## D\n\nd\n"
        );
        assert_eq!(extract(old, "## C"), Some("## C\n\nold\n\n### c"));
        assert_eq!(extract(old, "## E"), None);
        assert_eq!(
            replace_rows(old, &["| b | 3 | **no** |".to_string()]).as_deref(),
            Ok(
                "# B\n\n## A\n\n| a | 1 | yes |\n| b | 3 | **no** |\n\n## C\n\nold\n\n### c\n\n## D\n\nd\n"
            )
        );
        assert!(replace_rows(old, &["| x | 3 | yes |".to_string()]).is_err());
    }
}
