//! Finding the code of a README: shared by the build script, which makes
//! the programs of it, and the tests, which compare READMEs.

/// The first Rust code block (a fence opening with ```` ```rust ````) under
/// the heading line `heading`, before the next heading of the same level,
/// without its fences.
pub(crate) fn code_under(markdown: &str, heading: &str) -> Option<String> {
    let level = heading.split(' ').next().unwrap_or(heading);
    let mut lines = markdown
        .lines()
        .skip_while(|line| line.trim_end() != heading)
        .skip(1);
    while let Some(line) = lines.next() {
        if line.strip_prefix(level).is_some_and(|r| r.starts_with(' ')) {
            return None;
        }
        if line.starts_with("```rust") {
            let mut code = String::new();
            for line in lines.by_ref() {
                if line.starts_with("```") {
                    return Some(code);
                }
                code.push_str(line);
                code.push('\n');
            }
            return None;
        }
    }
    None
}
